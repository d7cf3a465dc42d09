"""Deciding interrupts: approve (resume), reject, N-of-M approvals, and cancelling a run.

A decision is exactly once: the conditional UPDATE of a pending interrupt (store.decide) has one
winner, and whoever loses is told who won. The run is locked first, then the interrupt, in
every change (the lock order), so two decisions of one run see each other.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from django.utils import timezone
from pydantic import ValidationError

from actions import tracing
from actions.core import ApprovalPolicy, field_errors, registry
from actions.engine import audit, grants, rules, store
from actions.engine.driving import arguments_hash, driver_for
from actions.engine.errors import (
    AlreadyDecided,
    InvalidAnswer,
    InvalidInput,
    NotAllowed,
    NotCancellable,
    check_size,
    retry_on_conflict,
)
from actions.engine.journal import atomic, inbox_changed, log, log_end, push_run_status
from actions.engine.policies import DEADLINE_POLICY, may_decide, separation_of_duties, why_not, why_not_cancel
from actions.engine.queue import answers_of, hand_over, inline, lease_from
from actions.engine.schemas import schema_errors
from actions.models import Actor, ApiToken, Approval, Grant, Interrupt, Run, RunEvent, actor_name, actor_user

Status = Run.Status

Then = Callable[[Run, Interrupt], None]


@dataclass(frozen=True)
class Decided:
    """What one decision made of an interrupt, for whoever asked for it to say: the interrupt as
    it is now (still pending when more approvals are required), how many approvals count
    towards its answer so far (N-of-M; 0 when one decision settled it), whose approvals of
    another answer this one set aside (the count started again from it), and the standing grant
    it gave."""

    interrupt: Interrupt
    approvals: int = 0
    restarted: tuple[str, ...] = ()
    grant: Grant | None = None


@dataclass(frozen=True)
class GrantAsked:
    """A standing grant asked for with an approval (grants.give_grant): for how long (an hour,
    the run, until revoked) and where its condition holds ("": the same arguments only)."""

    lasting: str
    condition: str = ""


def validate_answer(interrupt: Interrupt, data: Any) -> Any:
    """The answer as it will be stored, or InvalidAnswer with field errors."""
    check_size("the answer", data)
    if interrupt.answer_schema is not None:
        if errors := schema_errors(interrupt.answer_schema, data):
            raise InvalidAnswer("the answer does not fit the approval's answer schema", errors)
        return data
    act = registry.find(interrupt.action)
    if act is None:
        return data
    try:
        return act.validate_answer(data)
    except ValidationError as exc:
        raise InvalidAnswer("the answer does not fit the action's answer schema", field_errors(exc)) from None


def decide(
    interrupt: Interrupt,
    status: str,
    by: Actor,
    *,
    answer: Any = None,
    reason: str = "",
    then: Then,
    policy: str = "",
    via: str = "",
    also: Callable[[], None] | None = None,
    edit: tuple[Any, Any] | None = None,
) -> Decided:
    """Decide a pending interrupt, then ``then(run, interrupt)`` in the same transaction; what
    it made of it (``Decided``). ``edit`` is (proposed, edited) when a reviewer approves a tool
    call with edited arguments. ``policy`` names the policy deciding it, when no one does;
    ``via`` where a person decided from, when not the dashboard or the API (email, slack), kept
    in the event log. ``also`` runs in the same transaction once the decision is allowed: what
    it raises undoes the decision (a mail's link is used up with it, or not at all)."""
    # One span however many times a conflict makes it try again; a refusal is not an error.
    with tracing.span(
        "grundlag.decision",
        lambda: {"grundlag.interrupt.id": interrupt.pk, "grundlag.run.id": interrupt.run_id},
        parent=_traceparent(interrupt),
        expected=(AlreadyDecided, NotAllowed, InvalidAnswer),
    ) as span:
        decided = _decide(
            interrupt,
            status,
            by,
            answer=answer,
            reason=reason,
            then=then,
            policy=policy,
            via=via,
            also=also,
            edit=edit,
        )
        if span.is_recording():
            span.set_attributes(_decision_attributes(decided))
        return decided


def _traceparent(interrupt: Interrupt) -> str:
    """Where the interrupt's pause is in a trace, with traces on (read when not loaded)."""
    if not tracing.enabled():
        return ""
    if "traceparent" in interrupt.__dict__:
        return interrupt.traceparent or ""
    return Interrupt.objects.filter(pk=interrupt.pk).values_list("traceparent", flat=True).first() or ""


def _decision_attributes(decided: Decided) -> dict[str, Any]:
    it = decided.interrupt
    attributes: dict[str, Any] = {
        "grundlag.interrupt.id": it.pk,
        "grundlag.run.id": it.run_id,
        "grundlag.action": it.action,
        "grundlag.team.id": it.team_id,
        "grundlag.interrupt.status": it.status,
        "grundlag.decided_by": it.decided_by_name,
        "grundlag.decided_via": it.decided_via,
        "gen_ai.tool.name": it.action if it.tool_call_id else None,
        "gen_ai.tool.call.id": it.tool_call_id or None,
    }
    created_at, decided_at = it.__dict__.get("created_at"), it.__dict__.get("decided_at")
    if created_at is not None and decided_at is not None:
        # How long it waited for a person (or a deadline, a rule, a grant).
        attributes["grundlag.waited_seconds"] = (decided_at - created_at).total_seconds()
    if decided.approvals:
        attributes["grundlag.approvals.counted"] = decided.approvals
    return {key: value for key, value in attributes.items() if value is not None}


@retry_on_conflict
def _decide(
    interrupt: Interrupt,
    status: str,
    by: Actor,
    *,
    answer: Any,
    reason: str,
    then: Then,
    policy: str,
    via: str,
    also: Callable[[], None] | None,
    edit: tuple[Any, Any] | None,
) -> Decided:
    now = timezone.now()
    restarted: tuple[str, ...]
    with atomic():
        # Lock the run first: two reviewers deciding two interrupts of one agent turn (or two
        # of N required approvers) must see each other's decision, or neither would resume the
        # run (PostgreSQL; SQLite's IMMEDIATE transactions already serialise writers).
        run = store.lock_run(interrupt.run_id)
        current = store.interrupt(interrupt.pk)
        if current.status != Interrupt.Status.PENDING:
            raise AlreadyDecided(current)
        if not policy and not may_decide(by, current):
            raise NotAllowed(why_not(by, current))
        if not policy and status == Interrupt.Status.APPROVED and (rule := separation_of_duties(by, current)):
            raise NotAllowed(rule)
        if also is not None:
            also()
        counted_detail: dict[str, Any] = {}
        counted, restarted = 0, ()
        if status == Interrupt.Status.APPROVED and current.approvals_required > 1 and not policy:
            complete, counted, restarted = _count_approval(run, current, by, answer)
            if not complete:
                return Decided(current, counted, restarted)
            counted_detail = {"approvals": current.approvals_required, "of": current.approvals_required}
            if restarted:
                counted_detail.update(restarted=True, superseded=list(restarted))
        user = actor_user(by)
        decision = {
            "status": status,
            "answer": answer,
            "reason": reason,
            "decided_by": user,
            "decided_by_name": policy or actor_name(by),
            "decided_via": decided_via(by, policy=policy, via=via),
            "decided_at": now,
        }
        won = store.decide(
            current.pk,
            now,
            status=status,
            answer=answer,
            reason=reason,
            decided_by_id=user.pk if user is not None else None,
            decided_by_name=decision["decided_by_name"],
            decided_via=decision["decided_via"],
            edited_arguments=edit[1] if edit is not None else None,
        )
        if not won:
            raise AlreadyDecided(Interrupt.objects.get(pk=current.pk))
        for name, value in decision.items():
            setattr(current, name, value)
        kinds: dict[str, str] = {
            Interrupt.Status.APPROVED: RunEvent.Kind.APPROVED,
            Interrupt.Status.EXPIRED: RunEvent.Kind.EXPIRED,
        }
        detail: dict[str, Any] = {"seq": current.seq, **counted_detail}
        if reason:
            detail["reason"] = reason
        if policy:
            detail["policy"] = policy
        if via:
            detail["via"] = via
        if edit is not None:
            current.edited_arguments = edit[1]
            detail["edited"] = {"from": edit[0], "to": edit[1]}
        detail["record"] = audit.decision_record(
            status,
            answer,
            reason,
            decision["decided_by_name"],
            decision["decided_via"],
            edit[1] if edit is not None else None,
        )
        log(run, kinds.get(status, RunEvent.Kind.REJECTED), by, current, **detail)
        inbox_changed(
            "decided", current, before=current.team_ids, after=(), decided_by=current.decided_by_name
        )
        then(run, current)
    return Decided(current, counted, restarted)


def decided_via(by: Actor, *, policy: str = "", via: str = "") -> str:
    """How a decision was made, as the audit lists it: dashboard, api, email, slack, bulk, or
    deadline (the interrupt's policy decided it when its deadline passed)."""
    if policy:
        if policy == DEADLINE_POLICY:
            return "deadline"
        return (
            "rule" if policy.startswith("rule: ") else "grant" if policy.startswith("grant #") else "policy"
        )
    if via:
        return via
    return "api" if isinstance(by, ApiToken) else "dashboard"


def agreement_key(action_name: str, answer: Any) -> str:
    """What two approvals must share to count towards the same answer. With the plain
    approve form, each person's comment is their own: only the decision counts. A typed answer
    counts whole: approving "notify the customer" is not approving "do not"."""
    act = registry.find(action_name)
    if (act is None or act.answer_model is None) and isinstance(answer, dict) and "approved" in answer:
        answer = {key: value for key, value in answer.items() if key != "comment"}
    return arguments_hash(answer)


def _count_approval(
    run: Run, interrupt: Interrupt, by: Actor, answer: Any
) -> tuple[bool, int, tuple[str, ...]]:
    """Record one of N required approvals. Returns whether this one completes N approvals of
    the same answer (its own: the run resumes with it; a null answer counts like any other), how
    many count now, and whose approvals of another answer it set aside.

    N approvals count towards one answer: an approval whose answer differs from the ones
    counted so far supersedes them (they stay, for the transcript) and the count starts again
    from it, so the run never receives an answer that fewer than N people approved."""
    user = actor_user(by)
    if user is None:
        raise NotAllowed(why_not(by, interrupt))
    counted = store.counted_approvals(interrupt)
    if any(approval.user_id == user.pk for approval in counted):
        raise NotAllowed(
            f"You already approved this; it needs {interrupt.approvals_required} different people."
        )
    superseded: list[str] = []
    if counted and agreement_key(interrupt.action, counted[0].answer) != agreement_key(
        interrupt.action, answer
    ):
        superseded = [approval.user.get_username() for approval in counted]
        Approval.objects.filter(pk__in=[approval.pk for approval in counted]).update(
            superseded_at=timezone.now()
        )
        counted = []
    Approval.objects.create(interrupt=interrupt, user=user, answer=answer)
    count = len(counted) + 1
    if count >= interrupt.approvals_required:
        return True, count, tuple(superseded)
    detail: dict[str, Any] = {
        "seq": interrupt.seq,
        "approvals": count,
        "of": interrupt.approvals_required,
        "answer": answer,  # each approver's own, for the transcript: the run gets the agreed one
    }
    if superseded:
        # Said in the log as on the page: the earlier approvals were for another answer.
        detail["restarted"] = True
        detail["superseded"] = superseded
    log(run, RunEvent.Kind.APPROVED, by, interrupt, **detail)
    inbox_changed("approval", interrupt, before=interrupt.team_ids, after=interrupt.team_ids)
    return False, count, tuple(superseded)


def resume_if_nothing_pending(run: Run, interrupt: Interrupt) -> None:
    """The run goes on once this was its last pending interrupt (an agent turn may pause on
    several tool calls, each decided apart)."""
    now = timezone.now()
    resumed = store.resume_if_nothing_pending(run.pk, now, lease_from(now) if inline() else None)
    if resumed is not None:
        log(run, RunEvent.Kind.RESUMED, None, interrupt, seq=interrupt.seq)
        # The interrupt decided last is the latest for its call: the step needs to read only
        # the other decisions (an agent turn's other calls), and only if it asks for them.
        hand_over(resumed, answers_of(run.pk, latest=interrupt))


def resume(
    interrupt: Interrupt,
    data: Any,
    by: Actor,
    *,
    via: str = "",
    also: Callable[[], None] | None = None,
    arguments: Any = None,
) -> Interrupt:
    """Approve ``interrupt`` with ``data`` as the answer and queue the run to go on. With
    ``arguments``, an agent's tool call is approved as the reviewer edited it: it runs with them.

    Raises InvalidAnswer or InvalidInput (nothing changed) or AlreadyDecided (someone else was
    first).
    """
    return approve(interrupt, data, by, via=via, also=also, arguments=arguments).interrupt


def approve(
    interrupt: Interrupt,
    data: Any,
    by: Actor,
    *,
    via: str = "",
    also: Callable[[], None] | None = None,
    arguments: Any = None,
    grant: GrantAsked | None = None,
) -> Decided:
    """Approve ``interrupt`` as a person does, from any page or channel: ``resume``, with what
    it made of the interrupt (the count of an N-of-M, a count started again), and with
    ``grant`` a standing grant given in the same transaction (both or neither).

    ``also`` runs in the decision's transaction once it is allowed, as for ``decide``. Raises
    InvalidAnswer or InvalidInput, NotAllowed or AlreadyDecided, and GrantRefused for a grant
    that cannot be given (with edited arguments: a grant approves calls as they are proposed;
    or one grants.give_grant refuses); nothing is changed then."""
    answer = validate_answer(interrupt, data)
    edit = validate_edit(interrupt, arguments) if arguments is not None else None
    given: list[Grant] = []

    def allowed() -> None:
        """Once the decision is allowed, in its transaction: the caller's ``also``, the grant."""
        if also is not None:
            also()
        if grant is not None:
            # Replaced, not added to, should a conflict make the transaction run again.
            lasting, condition = grant.lasting, grant.condition
            given[:] = [grants.give_grant(interrupt, by, lasting=lasting, condition=condition, answer=answer)]

    if grant is not None and arguments is not None:
        raise grants.GrantRefused("A grant approves calls as they are proposed: it cannot carry an edit.")
    decided = decide(
        interrupt,
        Interrupt.Status.APPROVED,
        by,
        answer=answer,
        then=resume_if_nothing_pending,
        via=via,
        also=allowed if also is not None or grant is not None else None,
        edit=edit,
    )
    return replace(decided, grant=given[0] if given else None)


def proposed_arguments(interrupt: Interrupt, run: Run | None = None) -> Any:
    """The arguments of the call ``interrupt`` holds, when a reviewer may edit them before
    approving; else None. Only a pending tool call (an agent's, or one through the MCP gateway),
    at its first pause (a later one
    resumes a checkpoint made with the arguments it has: an edit then would resume it with
    others), and decided by one person (several approve the same arguments or none)."""
    binding = interrupt.binding or {}
    if not interrupt.is_pending or "turn" not in binding or interrupt.approvals_required > 1:
        return None
    earlier = Interrupt.objects.filter(run_id=interrupt.run_id, seq__lt=interrupt.seq)
    if earlier.filter(binding__turn=binding["turn"], binding__position=binding.get("position")).exists():
        return None
    if run is None:
        run = Run.objects.only("consumer", "driver_state").get(pk=interrupt.run_id)
    return driver_for(run.consumer).proposed_arguments(run, binding)


def arguments_schema(run: Run) -> dict[str, Any] | None:
    """The JSON Schema an edit of a call of ``run`` fits, where its driver's calls are not
    registered actions (the gateway's tools); None otherwise."""
    return driver_for(run.consumer).arguments_schema(run)


def validate_edit(interrupt: Interrupt, arguments: Any) -> tuple[Any, Any] | None:
    """(proposed, edited) arguments, both as the tool's input model reads them (an upstream MCP
    server's tool: as given, checked against its input schema); None when the edit changes
    nothing. InvalidInput when the call cannot be edited or the edit does not fit
    the tool's input schema."""
    check_size("the arguments", arguments)
    run = Run.objects.only("consumer", "driver_state", "action").get(pk=interrupt.run_id)
    proposed = proposed_arguments(interrupt, run)
    act = registry.find(interrupt.action)
    schema = arguments_schema(run) if act is None else None
    if proposed is None or (act is None and schema is None):
        raise InvalidInput(
            "only a pending tool call (an agent's, or one through the MCP gateway), at its first"
            " pause and decided by one person, can be approved with edited arguments",
            [],
        )
    if act is None:
        # A tool of an upstream MCP server's: its own input schema says what fits.
        if errors := schema_errors(schema or {}, arguments):
            raise InvalidInput("the arguments do not fit the tool's input schema", errors)
        return None if arguments == proposed else (proposed, arguments)
    try:
        edited = act.input_model.model_validate(arguments).model_dump(mode="json")
    except ValidationError as exc:
        raise InvalidInput("the arguments do not fit the tool's input schema", field_errors(exc)) from None
    try:
        as_proposed = act.input_model.model_validate(proposed).model_dump(mode="json")
    except ValidationError:
        as_proposed = proposed
    return None if edited == as_proposed else (proposed, edited)


def reject(
    interrupt: Interrupt, reason: str, by: Actor, *, via: str = "", also: Callable[[], None] | None = None
) -> Interrupt:
    """Reject ``interrupt``. An action's run ends ``rejected``; an agent sees the reason as the
    tool's result and goes on."""
    reason = (reason or "").strip()
    if not reason:
        raise InvalidInput("a reason is required to reject", [{"loc": ["error"], "msg": "required"}])
    check_size("the reason", reason)
    return decide(
        interrupt, Interrupt.Status.REJECTED, by, reason=reason, then=end_or_go_on, via=via, also=also
    ).interrupt


def end_or_go_on(run: Run, decided: Interrupt) -> None:
    """After a rejection: an agent (or a script) goes on, told why; an action's run ends
    rejected with the reason."""
    if driver_for(run.consumer).rejection_continues:
        resume_if_nothing_pending(run, decided)
        return
    finish_with_pending_cancelled(run, Status.REJECTED, error=decided.reason)


def finish_with_pending_cancelled(run: Run, status: str, *, error: str = "", by: Actor = None) -> None:
    """End the run; its interrupts still pending are cancelled, and every inbox that shows one
    (its team's, and a team's it escalated to) is told, as are the pages and the requests
    waiting on the run. Each interrupt cancelled, and the run's end, are logged: subscribers
    hear interrupt.decided for each and run.finished for the run (a service waiting on its
    approval's webhook heard nothing of a rejection)."""
    now = timezone.now()
    pending = list(Interrupt.objects.filter(run_id=run.pk, status=Interrupt.Status.PENDING))
    Interrupt.objects.filter(pk__in=[it.pk for it in pending], status=Interrupt.Status.PENDING).update(
        status=Interrupt.Status.CANCELLED,
        decided_at=now,
        decided_by=actor_user(by),
        decided_by_name=actor_name(by),
    )
    for it in pending:
        it.status = Interrupt.Status.CANCELLED
        inbox_changed("decided", it, before=it.team_ids, after=(), decided_by=actor_name(by))
        record = audit.decision_record(it.status, None, "", actor_name(by), "", None)
        log(run, RunEvent.Kind.CANCELLED, by, interrupt=it, record=record)
    # The output stays as it was: none, as no step completed.
    Run.objects.filter(pk=run.pk).update(
        status=status, error=error, finished_at=now, updated_at=now, lease_expires_at=None
    )
    log_end(run, status, by, error=error)
    push_run_status(run, status)


# A running step cannot be stopped from here: cancelling it would record "cancelled" while its
# action goes on and its result is dropped. It is cancelled once it pauses (or ends).
CANCELLABLE = (Status.QUEUED, Status.INTERRUPTED)


@retry_on_conflict
def cancel(run: Run, by: Actor) -> None:
    """Cancel a queued or interrupted run and its pending interrupts. Raises NotCancellable
    (finished, or a step is running) or NotAllowed (policies.why_not_cancel)."""
    with atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        if locked.is_finished:
            raise NotCancellable(f"run {run.pk} is already {locked.status}")
        if locked.status not in CANCELLABLE:
            raise NotCancellable(f"run {run.pk} is running a step; cancel it once it pauses")
        if reason := why_not_cancel(by, locked):
            raise NotAllowed(reason)
        finish_with_pending_cancelled(locked, Status.CANCELLED, by=by)


def settle(run: Run, interrupt: Interrupt, routed: rules.Routed, policy: ApprovalPolicy) -> None:
    """Make the decision a rule or a grant took for ``interrupt``, in the transaction that
    created it, once every pause of its step is inserted."""
    decision, by = routed.decision, routed.decided_by
    if decision is None:
        if "rule_failed" in routed.note:
            return  # left to people: a grant does not stand in for a rule that failed
        grant = grants.grant_for(run, interrupt, routed, policy)
        if grant is None:
            return
        decision, by = ("approve", grant.answer), f"grant #{grant.pk} ({grant.granted_by_name})"
    by = by[: Interrupt._meta.get_field("decided_by_name").max_length]
    kind, value = decision
    approving = kind == "approve"
    # Already decided: another pause of the step ended the run (a rejection). Nothing to do.
    with contextlib.suppress(AlreadyDecided):
        decide(
            interrupt,
            Interrupt.Status.APPROVED if approving else Interrupt.Status.REJECTED,
            None,
            then=resume_if_nothing_pending if approving else end_or_go_on,
            policy=by,
            **({"answer": value} if approving else {"reason": value}),
        )
