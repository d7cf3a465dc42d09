"""Approvals: a service outside asks the team (actions.drivers.approval)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from django.http import HttpRequest, HttpResponse
from ninja import Router, Schema, Status
from pydantic import Field

from actions import engine
from actions.api.base import Error, In, needs, token_of
from actions.api.responses import get_run, settled_response, started
from actions.drivers.approval import (
    APPROVAL_ACTION,
    MAX_APPROVALS,
    MAX_DEADLINE,
    MAX_MESSAGE_CHARS,
    policy_of,
    request_approval,
)
from actions.models import Interrupt, Run, Scope

router = Router()


# Approvals: a service outside asks the team (actions.drivers.approval).

ApprovalStatus = Literal["pending", "approved", "rejected", "expired", "cancelled", "failed"]


class ApprovalIn(In):
    message: str = Field(
        min_length=1, max_length=MAX_MESSAGE_CHARS, description="The question, as the reviewers see it"
    )
    data: Any = Field(None, description="What the reviewers see and decide on (any JSON)")
    answer_schema: dict[str, Any] | None = Field(
        None,
        description='A JSON Schema of "type": "object" the answer must fit; the dashboard renders '
        "it as a form. Without one, the answer is {approved, comment}",
    )
    deadline_seconds: int | None = Field(
        None,
        ge=1,
        le=int(MAX_DEADLINE.total_seconds()),
        description="Undecided this long: approved with default_answer, or else expired",
    )
    default_answer: Any = Field(None, description="Needs deadline_seconds; must fit answer_schema")
    approvals_required: int | None = Field(
        None,
        ge=1,
        le=MAX_APPROVALS,
        description="Distinct people who must approve; never fewer than the team's policy says",
    )
    assignees: list[Annotated[str, Field(min_length=1, max_length=150)]] = Field(
        default_factory=list, max_length=20, description="Usernames in the team: only they may decide"
    )


class ApprovalRequestOut(Schema):
    id: int = Field(description="The approval's id (its run's)")
    interrupt_id: int | None = Field(
        description="The interrupt people decide (as `GET /api/interrupts` lists it); recorded in "
        "the request that asks, so null only for an approval the server could not record at once"
    )
    status: ApprovalStatus
    message: str
    data: Any
    answer: Any = Field(description="The approved answer; null until then")
    reason: str = Field(description="Why it was rejected, expired, cancelled or failed")
    decided_by: str | None
    decided_via: str = Field(
        description="dashboard, api, email, slack, bulk, deadline, rule or grant; empty while pending"
    )
    decided_at: datetime | None
    created_at: datetime
    expires_at: datetime | None
    approvals_required: int
    assignees: list[str]
    answer_schema: dict[str, Any] | None
    url: str = Field(description="The approval on the dashboard")
    receipt: str | None = Field(
        default=None,
        description="Once approved: the decision as a signed receipt (a compact JWS, EdDSA over Ed25519), "
        "checked against /.well-known/jwks.json; its arguments are the question "
        "(message, data, answer_schema)",
    )


def approval_status(run: Run, it: Interrupt | None) -> str:
    if run.status == Run.Status.COMPLETED:
        return "approved"
    if run.status in (Run.Status.REJECTED, Run.Status.CANCELLED):
        return str(run.status)
    if run.status == Run.Status.FAILED:
        return "expired" if it is not None and it.status == Interrupt.Status.EXPIRED else "failed"
    return "pending"


def approval_out(request: HttpRequest, run: Run) -> dict[str, Any]:
    it = run.interrupts.defer("state").order_by("seq").first()
    asked = run.driver_state
    if it is None:  # its pause not recorded yet (a worker's step): its policy, as it will be
        policy = engine.as_requested(engine.effective_policy(run.team_id, APPROVAL_ACTION), policy_of(asked))
        approvals_required, assignees = policy.approvals, list(policy.assignees)
    else:
        approvals_required, assignees = it.approvals_required, it.assignees
    return {
        "id": run.pk,
        "interrupt_id": it.pk if it is not None else None,
        "status": approval_status(run, it),
        "message": asked.get("message", ""),
        "data": asked.get("data"),
        "answer": run.output if run.status == Run.Status.COMPLETED else None,
        # A reviewer's reason to reject; otherwise what ended the run (a deadline, a cancel).
        "reason": it.reason if it is not None and run.status == Run.Status.REJECTED else run.error,
        "decided_by": (it.decided_by_name or None) if it is not None else None,
        "decided_via": it.decided_via if it is not None else "",
        "decided_at": it.decided_at if it is not None else None,
        "created_at": run.created_at,
        "expires_at": it.expires_at if it is not None else None,
        "approvals_required": approvals_required,
        "assignees": assignees,
        "answer_schema": asked.get("answer_schema"),
        "url": request.build_absolute_uri(run.get_absolute_url()),
        "receipt": engine.receipts.receipt_for(it, run)
        if it is not None and run.status == Run.Status.COMPLETED
        else None,
    }


# An approval is settled once decided (its run finished), not while it waits for the decision.
APPROVAL_DECIDED = Run.FINISHED


@router.post(
    "/approvals",
    response={200: ApprovalRequestOut, 202: ApprovalRequestOut, 413: Error, 422: Error},
    tags=["approvals"],
    auth=needs(Scope.APPROVALS_WRITE),
)
async def create_approval(
    request: HttpRequest, response: HttpResponse, payload: ApprovalIn
) -> Status[dict[str, Any]]:
    """Ask the token's team a question: it waits in the team's inbox like any approval (the
    team's rules, notifications, deadlines and audit apply) until a person (or a rule) decides.
    The token that asks may not approve it. `Prefer: wait=N` waits up to N seconds (at most
    30) for the decision: 200 once decided, 202 while pending; then poll
    `GET /api/approvals/{id}` (with `Prefer: wait` too), or hear of it by the `run.finished`
    webhook."""
    asked = payload.model_dump()
    return await started(
        request,
        response,
        lambda token: request_approval(token.team, token, **asked),
        done=APPROVAL_DECIDED,
        describe=approval_out,
    )


@router.get(
    "/approvals/{approval_id}",
    response={200: ApprovalRequestOut, 404: Error},
    tags=["approvals"],
    auth=needs(Scope.APPROVALS_WRITE),
)
async def read_approval(
    request: HttpRequest, response: HttpResponse, approval_id: int
) -> Status[dict[str, Any]]:
    """The approval and its decision. `Prefer: wait=N` holds the answer up to N seconds (at
    most 30) while it is pending: a long poll."""
    token = token_of(request)
    settled = await settled_response(
        request,
        lambda: get_run(token, approval_id, Run.Consumer.APPROVAL).pk,
        done=APPROVAL_DECIDED,
        describe=approval_out,
        response=response,
    )
    return Status(200, settled.value)


@router.post(
    "/approvals/{approval_id}/cancel",
    response={200: ApprovalRequestOut, 403: Error, 404: Error, 409: Error},
    tags=["approvals"],
    auth=needs(Scope.APPROVALS_WRITE),
)
def cancel_approval(request: HttpRequest, approval_id: int) -> dict[str, Any]:
    """Withdraw a pending approval: it leaves the inbox and ends `cancelled`. 409 once decided."""
    token = token_of(request)
    run = get_run(token, approval_id, Run.Consumer.APPROVAL)
    engine.cancel(run, token)
    run.refresh_from_db()
    return approval_out(request, run)
