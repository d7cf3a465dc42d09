"""The team's actions, runs and interrupts: start, read, list, cancel, resume, reject; and the
audit history."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime
from typing import Annotated, Any

from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from ninja import Query, Router, Schema, Status
from ninja.errors import HttpError
from pydantic import Field, WithJsonSchema, field_validator

from actions import engine
from actions.api.base import (
    ActionOut,
    DecidedError,
    Error,
    InterruptListItem,
    RejectIn,
    ResumeIn,
    RunDetailOut,
    RunFields,
    RunIn,
    RunOut,
    needs,
    token_of,
)
from actions.api.responses import decided, get_interrupt, get_run, run_out, settled_response, started
from actions.core import registry
from actions.models import AuditExport, Interrupt, Run, Scope, actor_name
from actions.reads import history
from actions.reads.records import (
    REQUIRES_FIELDS,
    requires_out,
    run_fields,
)

router = Router()


# Endpoints


@router.get("/actions", response=list[ActionOut], tags=["actions"], auth=needs(Scope.RUNS_WRITE))
def list_actions(request: HttpRequest) -> list[dict[str, Any]]:
    return [
        {
            "name": act.name,
            "description": act.description,
            "input_schema": act.input_schema(),
            "answer_schema": act.answer_schema(),
        }
        for act in registry.all()
    ]


@router.post(
    "/runs",
    response={200: RunOut, 202: RunOut, 404: Error, 413: Error, 422: Error},
    tags=["runs"],
    auth=needs(Scope.RUNS_WRITE),
)
async def create_run(request: HttpRequest, response: HttpResponse, payload: RunIn) -> Status[dict[str, Any]]:
    """Start a run of an action in the token's team. `Prefer: wait=N` waits up to N seconds
    (at most 30) for it to settle: 200 when it has, 202 while it is still queued or running."""
    return await started(
        request,
        response,
        lambda token: engine.start_run(payload.action, payload.input, token.team, token, Run.Consumer.API),
    )


@router.get(
    "/runs/{run_id}",
    response={200: RunDetailOut, 404: Error},
    tags=["runs"],
    auth=needs(Scope.RUNS_WRITE, Scope.INTERRUPTS_READ),
)
async def read_run(request: HttpRequest, response: HttpResponse, run_id: int) -> Status[dict[str, Any]]:
    """The run with its transcript. `Prefer: wait=N` holds the answer up to N seconds (at most
    30) while it is queued or running: a long poll for it to pause or finish."""
    token = token_of(request)
    settled = await settled_response(
        request, lambda: get_run(token, run_id).pk, describe=with_transcript, response=response
    )
    return Status(200, settled.value)


def with_transcript(request: HttpRequest, run: Run) -> dict[str, Any]:
    return run_out(request, run, transcript=True)


@router.post(
    "/runs/{run_id}/cancel",
    response={200: RunOut, 403: Error, 404: Error, 409: Error},
    tags=["runs"],
    auth=needs(Scope.RUNS_WRITE),
)
def cancel_run(request: HttpRequest, run_id: int) -> dict[str, Any]:
    """Cancel a queued or interrupted run of the token's team: it ends `cancelled` and its
    pending interrupts leave the inbox. 409 when it has finished or is running a step (cancel
    it once it pauses); 403 when it waits on an approval this token may not decide (assigned to
    people, or needing several) and the token did not start it."""
    token = token_of(request)
    run = get_run(token, run_id)
    engine.cancel(run, token)
    run.refresh_from_db()
    return run_out(request, run)


# Lists: newest first, filtered, paged by a cursor (keyset: page 2,000 costs what page 1 does).

Limit = Annotated[int, Field(ge=1, le=500)]


class RunListItem(RunFields):
    started_by: str
    created_at: datetime
    finished_at: datetime | None


class RunPage(Schema):
    items: list[RunListItem]
    next: str = Field(description="Pass as `after` for the next page; empty on the last")


class InterruptPage(Schema):
    items: list[InterruptListItem]
    next: str = Field(description="Pass as `after` for the next page; empty on the last")


# Both enums are named Status: in the OpenAPI document they were one, the interrupts', so
# `GET /api/runs?status=` was documented with an interrupt's statuses.
RunStatus = Annotated[
    Run.Status, WithJsonSchema({"title": "RunStatus", "type": "string", "enum": list(Run.Status.values)})
]
InterruptStatus = Annotated[
    Interrupt.Status,
    WithJsonSchema({"title": "InterruptStatus", "type": "string", "enum": list(Interrupt.Status.values)}),
]

_ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


class ListQuery(Schema):
    action: str = ""
    consumer: Run.Consumer | None = None
    since: datetime | None = Field(None, description="Created at or after (ISO 8601)")
    until: datetime | None = Field(None, description="Created before (ISO 8601)")
    after: str = Field("", description="The `next` of the page before")
    limit: Limit = 100

    @field_validator("since", "until", mode="before")
    @classmethod
    def _iso_8601(cls, value: Any) -> Any:
        """A date-time as documented: pydantic would also read a number (`?since=0.5`) as
        seconds since 1970."""
        if value is None or isinstance(value, datetime):
            return value
        if not isinstance(value, str) or not _ISO_DATE.match(value):
            raise ValueError("a date-time in ISO 8601, such as 2026-12-06T10:00:00Z")
        return value

    @field_validator("since", "until")
    @classmethod
    def _in_utc_unless_said(cls, value: datetime | None) -> datetime | None:
        """A date or time without an offset is UTC's (as every time the API gives is)."""
        return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value


class HistoryQuery(Schema):
    q: str = Field("", description="Every word of it, in the message, data, answer, reason, comments, input")
    status: InterruptStatus | None = None
    action: str = ""
    decided_by: str = ""
    run: int | None = Field(None, ge=1, description="One run's decisions")
    since: date | None = Field(None, description="Created on or after this day (YYYY-MM-DD)")
    until: date | None = Field(None, description="Created on or before this day (YYYY-MM-DD)")
    team: str = ""
    after: str = Field("", description="The `next` of the page before")

    @field_validator("since", "until", mode="before")
    @classmethod
    def _a_day(cls, value: Any) -> Any:
        """A day as documented: pydantic would also read a number (`?until=0`) as 1970's."""
        if value is None or isinstance(value, date):
            return value
        if not isinstance(value, str) or not _ISO_DAY.fullmatch(value):
            raise ValueError("a day, such as 2026-12-06")
        return value


_ISO_DAY = re.compile(r"\d{4}-\d{2}-\d{2}")


def paged(rows: Any, query: ListQuery, consumer: str) -> dict[str, Any]:
    """One page of ``rows`` (newest first) as ``query`` filters it (``consumer``: the field that
    holds the run's consumer)."""
    if query.after and history.parse_cursor(query.after) is None:
        raise HttpError(422, "after: not a cursor this API gave (pass the `next` of the page before)")
    if query.action:
        rows = rows.filter(action=query.action)
    if query.consumer:
        rows = rows.filter(**{consumer: query.consumer})
    if query.since is not None:
        rows = rows.filter(created_at__gte=query.since)
    if query.until is not None:
        rows = rows.filter(created_at__lt=query.until)
    found, next_cursor = history.page(rows, query.after, query.limit)
    return {"items": found, "next": next_cursor}


@router.get(
    "/runs",
    response={200: RunPage, 422: Error},
    tags=["runs"],
    auth=needs(Scope.RUNS_WRITE, Scope.INTERRUPTS_READ),
)
def list_runs(
    request: HttpRequest, query: Query[ListQuery], status: RunStatus | None = None
) -> dict[str, Any]:
    """The team's runs, newest first, filtered by `status`, `action`, `consumer` and when they
    were created (`since` inclusive, `until` exclusive, ISO 8601); `limit` a page (100 by
    default, at most 500), the next after `after` (the page's `next`)."""
    runs = Run.objects.filter(team=token_of(request).team_id).defer("input", "driver_state")
    page = paged(runs.filter(status=status) if status else runs, query, "consumer")
    page["items"] = [
        {**run_fields(run), "started_by": run.started_by_name, "created_at": run.created_at,
         "finished_at": run.finished_at}
        for run in page["items"]
    ]  # fmt: skip
    return page


@router.get(
    "/interrupts",
    response={200: InterruptPage, 422: Error},
    tags=["interrupts"],
    auth=needs(Scope.INTERRUPTS_READ),
)
def list_interrupts(
    request: HttpRequest, query: Query[ListQuery], status: InterruptStatus | None = None
) -> dict[str, Any]:
    """The team's interrupts (and those escalated to it), newest first, filtered by `status`
    (`?status=pending`: the open questions), `action`, the run's `consumer` and when they were
    created (`since` inclusive, `until` exclusive); paged like `GET /api/runs`."""
    token = token_of(request)
    interrupts = (
        Interrupt.objects.filter(Interrupt.visible_to([token.team_id]))
        .select_related("team", "escalate_to")
        .only(*INTERRUPT_LIST_FIELDS, *REQUIRES_FIELDS, "decided_by_name")
        .order_by("-created_at", "-id")
    )
    page = paged(interrupts.filter(status=status) if status else interrupts, query, "run__consumer")
    page["items"] = [
        {name: getattr(it, name) for name in INTERRUPT_LIST_FIELDS}
        | {"requires": requires_out(it, token.team_id), "decided_by": it.decided_by_name or None}
        for it in page["items"]
    ]
    return page


class InterruptDetailOut(Schema):
    id: int
    run_id: int
    seq: int
    action: str
    message: str
    data: Any
    status: str
    answer: Any
    edited_arguments: Any
    reason: str
    decided_by: str | None
    decided_via: str
    decided_at: datetime | None
    created_at: datetime
    receipt: str | None = Field(
        description="Once approved: the decision as a signed receipt (a compact JWS, EdDSA over Ed25519), "
        "checked against /.well-known/jwks.json and the arguments the call runs with"
    )


@router.get(
    "/interrupts/{interrupt_id}",
    response={200: InterruptDetailOut, 404: Error},
    tags=["interrupts"],
    auth=needs(Scope.INTERRUPTS_READ, Scope.INTERRUPTS_DECIDE),
)
def read_interrupt(request: HttpRequest, interrupt_id: int) -> dict[str, Any]:
    """One of the team's interrupts and how it was decided; once approved, its `receipt`."""
    it = get_interrupt(token_of(request), interrupt_id)
    run = Run.objects.only("id", "input", "consumer", "team_id").get(pk=it.run_id)
    return {
        "id": it.pk,
        "run_id": it.run_id,
        "seq": it.seq,
        "action": it.action,
        "message": it.message,
        "data": it.data,
        "status": it.status,
        "answer": it.answer,
        "edited_arguments": it.edited_arguments,
        "reason": it.reason,
        "decided_by": it.decided_by_name or None,
        "decided_via": it.decided_via,
        "decided_at": it.decided_at,
        "created_at": it.created_at,
        "receipt": engine.receipts.receipt_for(it, run),
    }


# What a listed interrupt says (InterruptListItem): read alone, never its checkpoint.
INTERRUPT_LIST_FIELDS = (
    "id",
    "run_id",
    "seq",
    "action",
    "message",
    "data",
    "status",
    "created_at",
    "decided_at",
)


class HistoryItem(Schema):
    interrupt_id: int
    run_id: int
    seq: int
    team: str
    action: str
    consumer: str
    status: str
    message: str
    data: Any
    answer: Any
    reason: str
    requested_by: str
    decided_by: str
    decided_via: str = Field(
        description="dashboard, api, email, slack, bulk, deadline, policy, rule or grant"
    )
    edited_arguments: Any
    comments: int
    created_at: datetime
    decided_at: datetime | None
    seconds_to_decision: float | None


class HistoryPage(Schema):
    items: list[HistoryItem]
    next: str = Field(description="Pass as `after` for the next page; empty on the last")


@router.get(
    "/history", response={200: HistoryPage, 403: Error}, tags=["audit"], auth=needs(Scope.HISTORY_READ)
)
def read_history(request: HttpRequest, query: Query[HistoryQuery]) -> dict[str, Any]:
    """The team's decided history, newest first, 50 a page: searched (`q`: every word, in the
    message, data, answer, reason, comments and the run's input) and filtered as the history
    page is, a filter's bad value refused (422). Another team's history is refused (403)."""
    token = token_of(request)
    after = query.after
    params = {
        "q": query.q, "status": query.status or "", "action": query.action, "decided_by": query.decided_by,
        "run": query.run or "", "team": query.team,
        "since": query.since.isoformat() if query.since else "",
        "until": query.until.isoformat() if query.until else "",
    }  # fmt: skip
    try:
        interrupts, applied = history.filtered(
            params, [token.team_id], newest=history.PAGE_SIZE + 1, after=after
        )
    except history.Refused as exc:
        raise HttpError(403, str(exc)) from None
    rows, next_cursor = history.page(interrupts.annotate(comment_count=Count("comments")), after)
    # Read through the API, the history is exported like any other time: recorded.
    AuditExport.objects.create(
        user=None,
        user_name=actor_name(token),
        what="interrupts",
        format="api",
        filters={key: value for key, value in applied.items() if value}
        | {"teams": [token.team_id]}
        | ({"after": after} if after else {}),
    )
    return {"items": [history.interrupt_record(it) for it in rows], "next": next_cursor}


@router.post(
    "/interrupts/{interrupt_id}/resume",
    response={200: RunOut, 202: RunOut, 403: Error, 404: Error, 409: DecidedError, 413: Error, 422: Error},
    url_name="resume_interrupt",
    tags=["interrupts"],
    auth=needs(Scope.INTERRUPTS_DECIDE),
)
async def resume_interrupt(
    request: HttpRequest, response: HttpResponse, interrupt_id: int, payload: ResumeIn
) -> Status[dict[str, Any]]:
    """Answer a pending interrupt; the run re-runs its action with `data` as the answer."""
    return await decided(
        request,
        response,
        interrupt_id,
        lambda it, token: engine.resume(it, payload.data, token, arguments=payload.arguments),
    )


@router.post(
    "/interrupts/{interrupt_id}/reject",
    response={200: RunOut, 202: RunOut, 403: Error, 404: Error, 409: DecidedError, 413: Error, 422: Error},
    url_name="reject_interrupt",
    tags=["interrupts"],
    auth=needs(Scope.INTERRUPTS_DECIDE),
)
async def reject_interrupt(
    request: HttpRequest, response: HttpResponse, interrupt_id: int, payload: RejectIn
) -> Status[dict[str, Any]]:
    """Reject a pending interrupt with a reason: an action's run ends `rejected`."""
    return await decided(
        request, response, interrupt_id, lambda it, token: engine.reject(it, payload.why, token)
    )
