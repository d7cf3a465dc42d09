"""Bulk decisions: approve or reject several interrupts at once, after a preview.

The preview names exactly the interrupts that will be decided (a filter is resolved to ids
there, so what is decided is what the reviewer saw, not what matches the filter a moment
later) and says for each what will happen. Confirming decides each one apart through the
engine, with every rule a single decision has (team, assignment, N-of-M, separation of
duties, exactly once); the result says for each what did happen."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django import forms
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import render
from django.utils.text import capfirst

from actions import engine
from actions.core import registry
from actions.models import Interrupt, Role, Team
from actions.web.views import INBOX_LIMIT, AuthenticatedRequest, pending_in_inbox

# At most this many in one bulk decision: the inbox's page. More are decided in a second round.
BULK_LIMIT = INBOX_LIMIT

VERBS = {"approve": "Approve", "reject": "Reject"}

NEEDS_ANSWER = "Left out: it needs a typed answer; open it to approve."


class BulkForm(forms.Form):
    verb = forms.ChoiceField(choices=list(VERBS.items()))
    comment = forms.CharField(required=False, max_length=2000, widget=forms.Textarea(attrs={"rows": 2}))
    reason = forms.CharField(required=False, max_length=2000, widget=forms.Textarea(attrs={"rows": 2}))

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if cleaned.get("verb") == "reject" and not (cleaned.get("reason") or "").strip():
            self.add_error("reason", "Say why: each run ends rejected with this reason.")
        return cleaned


@dataclass
class Line:
    """One interrupt of a bulk decision: what will happen (preview) or what did (result)."""

    interrupt: Interrupt
    outcome: str  # "approve", "reject" (will be / was), "skipped", "already", "refused", "error"
    text: str = ""

    @property
    def included(self) -> bool:
        return self.outcome in VERBS


def _chosen(request: AuthenticatedRequest, data: Any, *, by_filter: bool) -> tuple[list[Interrupt], int]:
    """The interrupts a request names: its ids, or (``by_filter``, the preview only) with all=1
    every pending one in the inbox as filtered (filter_team, filter_action), newest first.
    Returns them (at most BULK_LIMIT) and how many matched."""
    if by_filter and data.get("all"):
        matching = pending_in_inbox(request.user, data.get("filter_team", ""), data.get("filter_action", ""))
    else:
        teams = Team.where(request.user, Role.WORK)
        # Ids as a database has them: ASCII digits, within a 64-bit integer.
        ids = [int(i) for i in data.getlist("ids") if i.isascii() and i.isdigit() and len(i) < 19]
        matching = Interrupt.objects.filter(Interrupt.visible_to(teams), pk__in=ids)
    matching = matching.select_related("run", "team", "escalate_to")
    total = matching.count()
    return list(matching.order_by("-created_at", "-id")[:BULK_LIMIT]), total


def _needs_answer(interrupt: Interrupt) -> bool:
    """Whether the bulk answer ({approved, comment}) is not one it takes: its action types its
    answer, or its own answer schema (an approval asked through the API) wants another."""
    if interrupt.answer_schema is not None:
        try:
            engine.validate_answer(interrupt, {"approved": True, "comment": ""})
        except engine.InvalidAnswer:
            return True
        return False
    act = registry.find(interrupt.action)
    return act is not None and act.answer_model is not None


def _preview(request: AuthenticatedRequest, interrupt: Interrupt, verb: str) -> Line:
    user = request.user
    if not interrupt.is_pending:
        return Line(interrupt, "already", f"{capfirst(str(engine.AlreadyDecided(interrupt)))}.")
    if not engine.may_decide(user, interrupt):
        return Line(interrupt, "refused", f"Not allowed: {engine.why_not(user, interrupt)}")
    if interrupt.approvals.filter(user=user, superseded_at=None).exists():
        return Line(interrupt, "refused", "You approved it already; it needs someone else too.")
    if verb == "approve":
        if rule := engine.separation_of_duties(user, interrupt):
            return Line(interrupt, "refused", f"Not allowed: {rule}")
        if _needs_answer(interrupt):
            return Line(interrupt, "skipped", NEEDS_ANSWER)
        if interrupt.approvals_required > 1:
            return Line(
                interrupt, verb, f"Counts as 1 of the {interrupt.approvals_required} approvals it needs."
            )
    return Line(interrupt, verb)


def _decide_one(request: AuthenticatedRequest, interrupt: Interrupt, verb: str, form: BulkForm) -> Line:
    """Decide one interrupt through the engine, as a single decision would, and say how it went."""
    if verb == "approve" and _needs_answer(interrupt):
        return Line(interrupt, "skipped", NEEDS_ANSWER)
    try:
        if verb == "approve":
            answer = {"approved": True, "comment": form.cleaned_data["comment"]}
            made = engine.approve(interrupt, answer, request.user, via="bulk")
            decided = made.interrupt
            if decided.is_pending:
                counted = f"{made.approvals} of {decided.approvals_required} approvals"
                if made.restarted:
                    again = ", ".join(made.restarted)
                    return Line(decided, "approve", f"Approved: another answer than {again}'s, so {counted}.")
                return Line(decided, "approve", f"Approved: {counted}.")
            return Line(decided, "approve", "Approved.")
        decided = engine.reject(interrupt, form.cleaned_data["reason"], request.user, via="bulk")
        return Line(decided, "reject", "Rejected.")
    except engine.AlreadyDecided as exc:
        return Line(exc.interrupt, "already", f"Not {verb}d: {exc}.")
    except engine.NotAllowed as exc:
        return Line(interrupt, "refused", f"Not allowed: {exc}")
    except (engine.InvalidInput, engine.PayloadTooLarge) as exc:
        return Line(interrupt, "refused", f"Not {verb}d: {exc}")
    except engine.Busy as exc:
        return Line(interrupt, "error", f"Not {verb}d: {exc} Nothing was changed; try it again.")


@login_required
def bulk(request: AuthenticatedRequest) -> HttpResponse:
    """GET: the preview of deciding the chosen interrupts. POST: decide them, one by one."""
    data = request.POST if request.method == "POST" else request.GET
    form = BulkForm(data)
    confirmed = form.is_valid() and request.method == "POST"
    if request.method == "GET":
        form.errors.pop("reason", None)  # the preview needs only the verb; the reason comes next
    verb = form.cleaned_data.get("verb")
    if verb is None:
        return render(
            request,
            "actions/bulk.html",
            {"error": "Choose Approve or Reject for the selected rows."},
            status=400,
        )
    # Confirming decides the ids the preview listed, never "whatever matches the filter now".
    interrupts, total = _chosen(request, data, by_filter=request.method == "GET")
    if not interrupts:
        return render(
            request,
            "actions/bulk.html",
            {
                "verb": verb,
                "error": "Nothing selected: tick the rows to decide in the inbox, then try again.",
            },
            status=400,
        )
    context: dict[str, Any] = {"verb": verb, "verb_label": VERBS[verb], "form": form, "total": total}
    if confirmed:
        lines = [_decide_one(request, interrupt, verb, form) for interrupt in interrupts]
        context.update(lines=lines, done=True, decided=sum(line.included for line in lines))
        return render(request, "actions/bulk.html", context)
    lines = [_preview(request, interrupt, verb) for interrupt in interrupts]
    context.update(lines=lines, included=[line for line in lines if line.included])
    return render(request, "actions/bulk.html", context, status=422 if request.method == "POST" else 200)
