"""The reviewers' dashboard. Every page works without JavaScript; with htmx, the parts that
change are re-fetched as fragments when the websocket says something changed."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.db.models import Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import urlencode
from django.utils.text import capfirst
from django.views.decorators.http import require_POST
from django_htmx.http import HttpResponseClientRedirect
from django_htmx.middleware import HtmxDetails

from actions import engine
from actions.core import registry
from actions.models import InboxStream, Interrupt, Role, Run, RunEvent, Team, Webhook
from actions.web.forms import ApprovalForm, GrantForm, RejectForm, SchemaForm, answer_form, form_for_schema

logger = logging.getLogger(__name__)


class AuthenticatedRequest(HttpRequest):
    """What a @login_required view receives, with django-htmx's details."""

    htmx: HtmxDetails
    user: User


def site_context(request: HttpRequest) -> dict[str, Any]:
    return {
        "site_name": settings.SITE_NAME,
        # What the sign-in page offers (actions.web.sso): the provider's button, passwords, both.
        "sso_name": settings.GRUNDLAG_OIDC_NAME if settings.GRUNDLAG_OIDC_ISSUER else "",
        "password_login": settings.GRUNDLAG_PASSWORD_LOGIN,
    }


def is_htmx(request: AuthenticatedRequest) -> bool:
    return bool(request.htmx)


# Permission-scoped lookups: another team's objects are 404, never 403, so ids leak nothing.


def get_interrupt_for_user(user: User, pk: int) -> Interrupt:
    interrupts = Interrupt.objects.select_related("run", "team", "escalate_to")
    if not user.is_staff:
        # In any role: an auditor opens what the history lists.
        interrupts = interrupts.filter(Interrupt.visible_to(Team.where(user, Role.READ)))
    interrupt = interrupts.filter(pk=pk).first()
    if interrupt is None:
        raise Http404("No such interrupt")
    return interrupt


def get_run_for_user(user: User, pk: int) -> Run:
    run = Run.visible_to(user).select_related("team").filter(pk=pk).first()
    if run is None:
        raise Http404("No such run")
    return run


def _can_decide(user: User, interrupt: Interrupt) -> bool:
    counted = interrupt.approvals.filter(user=user, superseded_at=None)
    return engine.may_decide(user, interrupt) and not counted.exists()


# Inbox


# The inbox lists at most this many rows; its count is of all of them.
INBOX_LIMIT = 200


def pending_in_inbox(user: User, team_slug: str = "", action_name: str = "") -> QuerySet[Interrupt]:
    """What the user's inbox shows, as filtered: the pending interrupts of their teams (or of the
    one named), their own and those escalated to them, of any action (or the one named). The
    inbox lists them, "& next" walks them, a bulk decision's "select all" takes them. (Not an
    auditor's: they read the history.)"""
    teams = Team.where(user, Role.WORK)
    if team_slug:
        teams = teams.filter(slug=team_slug)
    pending = Interrupt.objects.filter(Interrupt.visible_to(teams), status=Interrupt.Status.PENDING)
    return pending.filter(action=action_name) if action_name else pending


@login_required
def inbox(request: AuthenticatedRequest) -> HttpResponse:
    teams = list(Team.where(request.user, Role.WORK))
    team_slug = request.GET.get("team", "")
    action_name = request.GET.get("action", "")
    # A team's inbox holds its own pending interrupts and those escalated to it: what the page
    # shows for a team filter, and what live.js decides with from a frame's teams.
    shown = [t for t in teams if t.slug == team_slug] if team_slug else teams
    pending = pending_in_inbox(request.user, team_slug, action_name)
    with engine.snapshot():
        # One moment: the rows, the count and the stream numbers they are as of, so the frames
        # after them apply exactly once.
        seq = dict(InboxStream.objects.filter(team__in=teams).values_list("team_id", "seq"))
        count = pending.count() if shown else 0
        interrupts = (
            list(
                pending.select_related("run", "team", "escalate_to")
                .annotate(approval_count=Interrupt.approvals_counted())
                .order_by("-created_at", "-id")[:INBOX_LIMIT]
            )
            if shown
            else []
        )
    wanted = {"team": team_slug, "action": action_name}
    if request.session.get(INBOX_FILTER, {"team": "", "action": ""}) != wanted:
        request.session[INBOX_FILTER] = wanted  # what "Approve & next" goes through
    context = {
        "teams": teams,
        "interrupts": interrupts,
        "count": count,
        "limit": INBOX_LIMIT,
        "stream_seq": json.dumps({str(t.pk): seq.get(t.pk, 0) for t in teams}),
        "team_ids": ",".join(str(t.pk) for t in teams),
        # A team the user is not in shows nothing, and live.js adds nothing to it: "none" is
        # no team's id.
        "filter_team_id": (shown[0].pk if shown else "none") if team_slug else "",
        "team_slug": team_slug,
        "action_name": action_name,
        "action_names": sorted({a.name for a in registry.all()}),
        # An endpoint of the team's that stopped being told: the team should know.
        "disabled_webhooks": list(
            Webhook.objects.filter(team__in=teams, disabled_at__isnull=False).select_related("team")
        ),
    }
    if is_htmx(request):
        return render(request, "actions/partials/inbox_list.html", context)
    return render(request, "actions/inbox.html", context)


# One interrupt and its decision


def decision_context(request: AuthenticatedRequest, interrupt: Interrupt, **extra: Any) -> dict[str, Any]:
    can_decide = _can_decide(request.user, interrupt)
    approvals = engine.counted_approvals(interrupt) if interrupt.is_pending else []
    # Under separation of duties the requester may still reject (withdraw), not approve.
    may_not_approve = engine.separation_of_duties(request.user, interrupt) if can_decide else ""
    context = {
        "interrupt": interrupt,
        "can_decide": can_decide,
        "can_approve": can_decide and not may_not_approve,
        "may_not_approve": may_not_approve,
        "approvals": approvals,
        # What the approvals so far agreed on: a later approver sees it, and confirms it or
        # starts the count again with another answer.
        "agreed_answer": approvals[0].answer if approvals else None,
        "you_approved": any(a.user_id == request.user.pk for a in approvals),
        "why_not": engine.why_not(request.user, interrupt),
        "answer_form": (form := answer_form(interrupt) if can_decide else None),
        # A typed answer (the action's answer model) is entered, not approved with one key.
        "answer_typed": form is not None and not isinstance(form, ApprovalForm),
        "reject_form": RejectForm(prefix="reject") if can_decide else None,
    }
    if "edit_form" not in extra:
        # An agent's tool call may be approved with its arguments edited.
        context["edit_form"] = edit_form(interrupt) if can_decide and not may_not_approve else None
    if context["can_approve"] and not engine.why_no_grant(interrupt):
        # "Approve, and allow the same for an hour / this run / until revoked."
        context["grant_form"] = GrantForm(prefix="grant")
        context["grant_requester"] = interrupt.run.started_by_name
    context.update(extra)
    return context


def edit_form(interrupt: Interrupt, data: Any = None) -> SchemaForm | None:
    """The form that edits the arguments of the tool call ``interrupt`` holds, prefilled with
    what the model proposed: None when its call cannot be edited (engine.proposed_arguments)."""
    proposed = engine.proposed_arguments(interrupt, interrupt.run)
    if not isinstance(proposed, dict):
        return None
    act = registry.find(interrupt.action)
    # A tool of an upstream MCP server (the gateway's): its own input schema.
    schema = act.input_schema() if act is not None else engine.arguments_schema(interrupt.run)
    if schema is None:
        return None
    try:
        return form_for_schema(schema)(data, initial=proposed, prefix="edit")
    except (TypeError, ValueError, KeyError, AttributeError):
        # An outside schema (an upstream MCP server's tool's) that no form can be made of:
        # approve or reject it as proposed.
        logger.warning("interrupt %s: no edit form for its call's schema", interrupt.pk, exc_info=True)
        return None


@login_required
def interrupt_detail(request: AuthenticatedRequest, pk: int) -> HttpResponse:
    interrupt = get_interrupt_for_user(request.user, pk)
    if is_htmx(request) and request.GET.get("panel"):
        # Re-fetched after a push. While it is still pending, keep what the reviewer typed.
        if interrupt.is_pending and request.GET.get("known") == "pending":
            return HttpResponse(status=204)
        return render(request, "actions/partials/decision.html", decision_context(request, interrupt))
    return _page(request, interrupt)


def _render_decision(
    request: AuthenticatedRequest, interrupt: Interrupt, status: int = 200, **extra: Any
) -> HttpResponse:
    if is_htmx(request):
        # htmx swaps only 2xx responses: errors are shown in the fragment, with a 200.
        context = decision_context(request, interrupt, **extra)
        return render(request, "actions/partials/decision.html", context)
    return _page(request, interrupt, status, **extra)


def _page(
    request: AuthenticatedRequest, interrupt: Interrupt, status: int = 200, **extra: Any
) -> HttpResponse:
    """The interrupt's whole page: what is asked, the decision, what deciding it requires and
    how that was settled, the discussion, and the run's earlier pauses."""
    earlier = interrupt.run.interrupts.filter(seq__lt=interrupt.seq).order_by("seq")
    layers = contract_layers(interrupt)
    context = decision_context(
        request, interrupt, earlier=earlier, run=interrupt.run, contract_layers=layers, **extra
    )
    return render(
        request, "actions/interrupt.html", {**_comments_context(request, interrupt), **context}, status=status
    )


def contract_layers(interrupt: Interrupt) -> list[tuple[str, str]]:
    """What each layer (the action, the team's policy, the request, a rule, delegation, the
    contract's last word) changed of what deciding ``interrupt`` requires, as its
    `interrupted` event logged it: (layer, "what: value, ...")."""
    logged = RunEvent.objects.filter(interrupt=interrupt, kind=RunEvent.Kind.INTERRUPTED)
    detail = logged.values_list("detail", flat=True).first() or {}
    shown = []
    for layer in detail.get("contract", []):
        changes = []
        for name, value in layer.get("changed", {}).items():
            if isinstance(value, list):
                value = ", ".join(map(str, value)) or "none"
            elif value is None:
                value = "none"
            elif isinstance(value, bool):
                value = "yes" if value else "no"
            elif not isinstance(value, (int, str)):
                value = json.dumps(value)
            changes.append(f"{name.replace('_', ' ')}: {value}")
        shown.append((str(layer.get("layer", "")), "; ".join(changes)))
    return shown


def _decided(request: AuthenticatedRequest, interrupt: Interrupt, text: str) -> HttpResponse:
    if request.POST.get("then") == "next":
        # "Approve & next": on to the next one waiting in the inbox as last filtered.
        messages.success(request, text)
        following = next_pending(request, interrupt)
        if following is None:
            messages.info(request, "That was the last one: nothing else is waiting in this inbox.")
        wanted = {k: v for k, v in (request.session.get(INBOX_FILTER) or {}).items() if v}
        inbox_url = reverse("inbox") + (f"?{urlencode(wanted)}" if wanted else "")
        target = following.get_absolute_url() if following is not None else inbox_url
        return HttpResponseClientRedirect(target) if is_htmx(request) else redirect(target)
    if is_htmx(request):
        interrupt.refresh_from_db()
        return _render_decision(request, interrupt, notice=text)
    messages.success(request, text)
    return redirect("inbox")


INBOX_FILTER = "grundlag_inbox_filter"


def next_pending(request: AuthenticatedRequest, current: Interrupt) -> Interrupt | None:
    """The pending interrupt after ``current`` in the reviewer's inbox (newest first, as it was
    last filtered), else the first one: what "& next" opens."""
    wanted = request.session.get(INBOX_FILTER) or {}
    pending = pending_in_inbox(request.user, wanted.get("team", ""), wanted.get("action", ""))
    newest_first = pending.exclude(pk=current.pk).order_by("-created_at", "-id")
    older = newest_first.filter(
        Q(created_at__lt=current.created_at) | Q(created_at=current.created_at, id__lt=current.pk)
    )
    return older.first() or newest_first.first()


Made = TypeVar("Made")  # what deciding made: the interrupt, or the engine's Decided


def _decide(
    request: AuthenticatedRequest,
    interrupt: Interrupt,
    verb: str,
    form: SchemaForm | ApprovalForm | RejectForm,
    decide: Callable[[], Made],
    **form_context: Any,
) -> Made | HttpResponse:
    """Check that the reviewer may decide, validate the form and decide through the engine:
    the decided interrupt, or the page (or fragment) that says why it was not decided."""
    if not engine.may_decide(request.user, interrupt):
        return _render_decision(request, interrupt, status=403, error=engine.why_not(request.user, interrupt))
    if not form.is_valid():
        return _render_decision(request, interrupt, status=422, **form_context)
    try:
        return decide()
    except engine.InvalidInput as exc:
        # An answer's errors go on the answer's form; an edited tool call's, on the edit form.
        edited = form_context.get("edit_form")
        target = edited if edited is not None and not isinstance(exc, engine.InvalidAnswer) else form
        if isinstance(target, RejectForm):
            target.add_error("reason", str(exc))
        elif exc.errors:
            target.add_model_errors(exc.errors)
        else:
            target.add_error(None, f"{capfirst(str(exc))}.")
        return _render_decision(request, interrupt, status=422, **form_context)
    except engine.PayloadTooLarge as exc:
        # A reason too long is the reason field's error; an answer too large, the whole form's.
        rejecting = isinstance(form, RejectForm)
        form.add_error("reason" if rejecting else None, str(exc))
        return _render_decision(request, interrupt, status=422 if rejecting else 413, **form_context)
    except engine.AlreadyDecided as exc:
        return _render_decision(request, exc.interrupt, status=409, error=f"Not {verb}: {exc}.")
    except engine.NotAllowed as exc:
        return _render_decision(request, interrupt, status=403, error=str(exc))
    except engine.Busy as exc:
        return _render_decision(request, interrupt, status=503, error=str(exc))


@login_required
@require_POST
def approve(request: AuthenticatedRequest, pk: int) -> HttpResponse:
    interrupt = get_interrupt_for_user(request.user, pk)
    form = answer_form(interrupt, request.POST)
    # The tool call's arguments, as the reviewer edited them (when they ticked "run the call
    # with these arguments").
    wants_edit = request.POST.get("edit") == "1"
    edited = edit_form(interrupt, request.POST) if wants_edit else None
    if wants_edit and edited is None:
        return _render_decision(
            request, interrupt, status=422, error="Not approved: this call's arguments cannot be edited."
        )
    if edited is not None and not edited.is_valid():
        return _render_decision(
            request, interrupt, status=422, answer_form=form, edit_form=edited, open_edit=True
        )
    arguments = edited.edited_arguments() if edited is not None else None
    shown: dict[str, Any] = {"answer_form": form}
    if edited is not None:
        shown.update(edit_form=edited, open_edit=True)
    if not engine.may_decide(request.user, interrupt):
        # Before a grant's condition is even compiled: only someone who may decide gets there.
        return _render_decision(request, interrupt, status=403, error=engine.why_not(request.user, interrupt))
    granting = GrantForm(request.POST, prefix="grant")
    if not granting.is_valid() or (granting.cleaned_data["lasting"] and arguments is not None):
        if granting.is_valid():
            granting.add_error(
                "lasting", "A grant approves calls as they are proposed: it cannot carry an edit."
            )
        return _render_decision(request, interrupt, status=422, grant_form=granting, open_grant=True, **shown)
    lasting, condition = granting.cleaned_data["lasting"], granting.cleaned_data["condition"]
    if lasting:
        shown.update(grant_form=granting, open_grant=True)  # kept, should the approval be refused

    grant = engine.GrantAsked(lasting, condition) if lasting else None
    decided = _decide(
        request,
        interrupt,
        "approved",
        form,
        lambda: engine.approve(interrupt, form.payload(), request.user, arguments=arguments, grant=grant),
        **shown,
    )
    if isinstance(decided, HttpResponse):
        return decided
    return _decided(request, interrupt, approved_text(decided, lasting))


def approved_text(decided: engine.Decided, lasting: str = "") -> str:
    """What the reviewer is told of their approval: the count of an N-of-M (started again when
    their answer differs), the grant given with it, or the edit it carried."""
    it = decided.interrupt
    if it.is_pending and decided.restarted:
        return (
            f"Your answer differs from the one {', '.join(decided.restarted)} approved, so the count starts "
            f"again from yours: {decided.approvals} of {it.approvals_required} approvals."
        )
    if it.is_pending:
        return f"Approved: {decided.approvals} of {it.approvals_required} approvals."
    if lasting:
        said = dict(GrantForm.LASTING)[lasting].lower()
        return f"Approved “{it.message}”, and the same is allowed {said} (see Grants)."
    if it.edited_arguments is not None:
        return f"Approved “{it.message}” with the arguments as you edited them."
    return f"Approved “{it.message}”."


@login_required
@require_POST
def reject(request: AuthenticatedRequest, pk: int) -> HttpResponse:
    interrupt = get_interrupt_for_user(request.user, pk)
    form = RejectForm(request.POST, prefix="reject")
    decided = _decide(
        request,
        interrupt,
        "rejected",
        form,
        lambda: engine.reject(interrupt, form.cleaned_data["reason"], request.user),
        reject_form=form,
        open_reject=True,
    )
    if isinstance(decided, HttpResponse):
        return decided
    return _decided(request, interrupt, f"Rejected “{interrupt.message}”.")


# The discussion of an interrupt


def _comments_context(request: AuthenticatedRequest, interrupt: Interrupt, **extra: Any) -> dict[str, Any]:
    return {
        "interrupt": interrupt,
        "comments": list(interrupt.comments.all()),
        "may_comment": engine.may_comment(request.user, interrupt),
        **extra,
    }


@login_required
def comments(request: AuthenticatedRequest, pk: int) -> HttpResponse:
    """GET: the thread (what a push refetches). POST: add the reviewer's comment."""
    interrupt = get_interrupt_for_user(request.user, pk)
    if request.method != "POST":
        return render(request, "actions/partials/comment_list.html", _comments_context(request, interrupt))
    text = request.POST.get("body", "")
    try:
        engine.comment(interrupt, text, request.user)
    except (engine.InvalidInput, engine.NotAllowed) as exc:
        why = exc.errors[0]["msg"] if isinstance(exc, engine.InvalidInput) and exc.errors else str(exc)
        status = 403 if isinstance(exc, engine.NotAllowed) else 422
        context = _comments_context(request, interrupt, comment_error=why, comment_text=text)
        if is_htmx(request):
            return render(request, "actions/partials/comments.html", context)  # htmx swaps 2xx only
        return render(request, "actions/comment_refused.html", context, status=status)
    if is_htmx(request):
        return render(request, "actions/partials/comments.html", _comments_context(request, interrupt))
    return redirect(interrupt.get_absolute_url() + "#comments-" + str(interrupt.pk))
