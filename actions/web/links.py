"""The page a mail's decision link opens (actions.notify.links). GET and HEAD only show the
question and the form: mail scanners and link previewers follow links, and decide nothing. The
POST decides as the link's recipient, through the engine with every rule of the dashboard,
and uses the link up. A link that was changed, used, has expired or whose interrupt is already
decided gets a page that says so, and changes nothing."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods

from actions import engine
from actions.models import Membership, Notification, Role
from actions.notify import links
from actions.web.forms import ApprovalForm, RejectForm, SchemaForm, answer_form


def _page(request: HttpRequest, status: int, **context: Any) -> HttpResponse:
    response = render(request, "actions/link.html", context, status=status)
    # The token is in the address: keep it out of other sites' Referer headers (same-origin:
    # "no-referrer" would send its own form's POST with "Origin: null", which CSRF refuses).
    response["Referrer-Policy"] = "same-origin"
    return response


@never_cache
@require_http_methods(["GET", "HEAD", "POST"])
def decision_link(request: HttpRequest, token: str) -> HttpResponse:
    try:
        opened = links.open_link(token)
    except links.Invalid:
        return _page(request, 404, problem="invalid")
    notification, interrupt = opened.notification, opened.interrupt
    person = notification.recipient
    assert person is not None  # open_link finds mails only
    # Who first: someone no longer active or no longer in the interrupt's teams learns nothing
    # of it here (the dashboard would answer them 404).
    if not person.is_active:
        return _page(request, 403, problem="not_allowed", person=person, why="their account is disabled")
    if not Membership.has(person.pk, interrupt.team_ids, Role.READ):
        return _page(request, 403, problem="not_allowed", person=person, why="they are no longer in its team")
    context: dict[str, Any] = {"interrupt": interrupt, "person": person, "token": token}
    if not interrupt.is_pending:
        return _page(request, 410, problem="decided", **context)
    if notification.link_used_at is not None:
        return _page(request, 410, problem="used", used_at=notification.link_used_at, **context)
    expires = links.expires_at(notification, interrupt)
    if timezone.now() >= expires:
        return _page(request, 410, problem="expired", expired_at=expires, **context)
    if not engine.may_decide(person, interrupt):
        return _page(request, 403, problem="not_allowed", why=engine.why_not(person, interrupt), **context)
    approvals = engine.counted_approvals(interrupt)
    if any(a.user_id == person.pk for a in approvals):
        return _page(request, 410, problem="approved", approvals=approvals, **context)
    context.update(
        expires_at=expires,
        may_not_approve=engine.separation_of_duties(person, interrupt),
        approvals=approvals,
        # What the approvals so far agreed on (N-of-M): a different answer starts the count again.
        agreed_answer=approvals[0].answer if approvals else None,
    )
    if request.method != "POST":
        return _page(
            request,
            200,
            answer_form=answer_form(interrupt),
            reject_form=RejectForm(prefix="reject"),
            **context,
        )
    return _decide(request, notification, context)


def _decide(request: HttpRequest, notification: Notification, context: dict[str, Any]) -> HttpResponse:
    interrupt, person = context["interrupt"], context["person"]
    approving = request.POST.get("decision") == "approve"
    form: SchemaForm | ApprovalForm | RejectForm = (
        answer_form(interrupt, request.POST) if approving else RejectForm(request.POST, prefix="reject")
    )
    forms = {
        "answer_form": form if approving else answer_form(interrupt),
        "reject_form": form if not approving else RejectForm(prefix="reject"),
    }
    if approving and context["may_not_approve"]:
        return _page(request, 403, error=context["may_not_approve"], **forms, **context)
    if not form.is_valid():
        return _page(request, 422, open_reject=not approving, **forms, **context)

    # Single use: the link is used up in the decision's own transaction, or not at all.
    def use_link() -> None:
        if not Notification.objects.filter(pk=notification.pk, link_used_at=None).update(
            link_used_at=timezone.now()
        ):
            raise LinkUsed

    try:
        if approving:
            assert not isinstance(form, RejectForm)
            made = engine.approve(interrupt, form.payload(), person, via="email", also=use_link)
            decided, counted = made.interrupt, made.approvals
        else:
            decided = engine.reject(
                interrupt, form.cleaned_data["reason"], person, via="email", also=use_link
            )
            counted = 0
    except LinkUsed:
        notification.refresh_from_db(fields=["link_used_at"])
        return _page(request, 410, problem="used", used_at=notification.link_used_at, **context)
    except engine.InvalidInput as exc:
        if isinstance(form, RejectForm):
            form.add_error("reason", str(exc))
        else:
            form.add_model_errors(exc.errors)
        return _page(request, 422, open_reject=not approving, **forms, **context)
    except engine.AlreadyDecided as exc:
        return _page(request, 410, problem="decided", **{**context, "interrupt": exc.interrupt})
    except (engine.NotAllowed, engine.PayloadTooLarge, engine.Busy) as exc:
        status = (
            403
            if isinstance(exc, engine.NotAllowed)
            else 413
            if isinstance(exc, engine.PayloadTooLarge)
            else 503
        )
        return _page(request, status, error=str(exc), **forms, **context)
    return _page(request, 200, done=decided, counted=counted if decided.is_pending else 0, **context)


class LinkUsed(Exception):
    """Another request used the link first."""
