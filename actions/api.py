"""The HTTP API: start runs, read them, answer their interrupts. OpenAPI at /api/openapi.json.

Every endpoint is scoped to the team of the bearer token: another team's ids are 404, as if
they did not exist. ``state`` appears in no response.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from datetime import UTC, date, datetime
from typing import Annotated, Any, Literal

from django.conf import settings
from django.db import InterfaceError, OperationalError, transaction
from django.db.models import Count
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import reverse
from ninja import NinjaAPI, Query, Schema, Status
from ninja.errors import HttpError
from ninja.security import HttpBearer
from pydantic import ConfigDict, Field, WithJsonSchema, field_validator, model_validator

from actions import engine
from actions.core import UnknownAction, registry
from actions.drivers.agent import ModelError, start_agent
from actions.drivers.approval import (
    APPROVAL_ACTION,
    MAX_APPROVALS,
    MAX_DEADLINE,
    MAX_MESSAGE_CHARS,
    policy_of,
    request_approval,
)
from actions.drivers.sandbox import SandboxUnavailable, start_script
from actions.engine import idempotency
from actions.engine.errors import DATABASE_UNAVAILABLE
from actions.engine.policies import as_requested
from actions.live import waiting
from actions.models import ApiToken, AuditExport, Interrupt, Run, Webhook, WebhookEvent, actor_name
from actions.notify import webhook
from actions.reads import history
from actions.reads.records import (
    INTERRUPT_OUT_FIELDS,
    REQUIRES_FIELDS,
    requires_out,
    run_fields,
    transcript_entry,
)


class TokenAuth(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str) -> ApiToken | None:
        return ApiToken.authenticate(token)


def token_of(request: HttpRequest) -> ApiToken:
    """The token that ninja's auth put on the request (every endpoint requires one)."""
    token = request.auth  # type: ignore[attr-defined]
    assert isinstance(token, ApiToken)
    return token


# Says a `Prefer: wait` was answered at once: the token had as many requests waiting as it may.
WAIT_DECLINED = "Grundlag-Wait-Declined"

IDEMPOTENCY_KEY = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "description": "1 to 255 printable ASCII characters. A retry with the same key and request gets "
    "the first answer again (Idempotent-Replayed: true); with another request, 422; while the first "
    "is being answered, 409 with Retry-After. Kept 24 hours per token.",
    "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[ -~]+$"},
}
PREFER_WAIT = {
    "name": "Prefer",
    "in": "header",
    "required": False,
    "description": "wait=N (at most 30): hold the answer up to N seconds (half a second less, to answer "
    "before a client waiting N seconds gives up) for the run to settle. A token has at most "
    "GRUNDLAG_MAX_WAITS_PER_TOKEN requests held at once (per web process): past it, the answer comes at "
    f"once, with `{WAIT_DECLINED}: too-many-waits` and no `Preference-Applied`",
    "schema": {"type": "string", "example": "wait=10"},
}
# The answers to `Prefer: wait`.
WAIT_HEADERS = {
    "Preference-Applied": {
        "description": "wait=N when the request was held (up to N seconds) for the run to settle",
        "schema": {"type": "string"},
    },
    WAIT_DECLINED: {
        "description": "too-many-waits: answered at once, as this token has as many requests waiting "
        "as it may; ask again later",
        "schema": {"type": "string"},
    },
}
RATE_LIMITED = {
    "description": "Over the token's rate of requests (GRUNDLAG_API_RATE): try again after Retry-After",
    "headers": {"Retry-After": {"description": "Seconds to wait", "schema": {"type": "integer"}}},
}


UNAUTHORIZED = {"description": "No API token, or not one of this site's (Authorization: Bearer ...)"}
DOES_NOT_FIT = {
    "description": "The request does not fit: a path id, a query parameter or the body (or an "
    "Idempotency-Key sent again with another request); `detail` names the field"
}


class KnownQueryParameters:
    """Django middleware, for /api/: a query parameter the operation does not take is refused
    with 422 naming it (``?statuss=pending`` would otherwise list everything), as a body field
    it does not take is. What each operation takes is read from the API's OpenAPI document,
    so the two cannot differ."""

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response
        self.taken: list[tuple[str, re.Pattern[str], frozenset[str]]] | None = None

    def __call__(self, request: HttpRequest) -> Any:
        if request.GET and request.path_info.startswith("/api/"):
            known = self.known(request.method or "", request.path_info)
            if known is not None and (unknown := sorted(set(request.GET) - known)):
                said = "not a parameter of this operation"
                errors = [{"loc": ["query", name], "msg": said, "type": "extra"} for name in unknown]
                return JsonResponse({"detail": errors}, status=422)
        return self.get_response(request)

    def known(self, method: str, path: str) -> frozenset[str] | None:
        """The query parameters the operation at ``path`` takes; None when it is not one."""
        if self.taken is None:
            taken = []
            # Its paths as Django routes them (path_info), whatever prefix the site is served under.
            for template, operations in api.get_openapi_schema(path_prefix="/api/")["paths"].items():
                pattern = re.compile("^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template)) + "$")
                for verb, operation in operations.items():
                    query = [p["name"] for p in operation.get("parameters", []) if p.get("in") == "query"]
                    taken.append((verb.upper(), pattern, frozenset(query)))
            self.taken = taken
        for verb, pattern, known in self.taken:
            if verb == method and pattern.match(path):
                return known
        return None


def _document(responses: dict[Any, Any], code: int, response: dict[str, Any]) -> None:
    """Add ``code`` unless the operation documents it already (ninja keys its own by number)."""
    if code not in responses and str(code) not in responses:
        responses[str(code)] = response


class Api(NinjaAPI):
    def get_openapi_schema(self, *, path_prefix: str | None = None, path_params: Any = None) -> Any:
        """Ninja's document, with the headers every POST takes (and the waits of the reads)."""
        schema = super().get_openapi_schema(path_prefix=path_prefix, path_params=path_params)
        error = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
        for path, operations in schema["paths"].items():
            for operation in operations.values():
                _document(operation["responses"], 429, {**RATE_LIMITED, "content": error})
                if operation.get("security"):
                    _document(operation["responses"], 401, {**UNAUTHORIZED, "content": error})
                # Any operation: a query parameter it does not take is refused (KnownQueryParameters).
                _document(operation["responses"], 422, {**DOES_NOT_FIT, "content": error})
            if "post" in operations:
                post = operations["post"]
                post.setdefault("parameters", []).extend([IDEMPOTENCY_KEY, PREFER_WAIT])
                post["responses"].setdefault(
                    "400", {"description": "A bad Idempotency-Key", "content": error}
                )
                post["responses"].setdefault("409", {"description": "Its key is in use", "content": error})
            if path.endswith(("/runs/{run_id}", "/approvals/{approval_id}")) and "get" in operations:
                operations["get"].setdefault("parameters", []).append(PREFER_WAIT)
            for operation in operations.values():
                if PREFER_WAIT in operation.get("parameters", []):
                    for code in (200, 202):  # ninja's keys are numbers
                        if code in operation["responses"]:
                            operation["responses"][code].setdefault("headers", {}).update(WAIT_HEADERS)
        return schema


api = Api(
    title="Grundlag approvals",
    version="1.0",
    description="Start actions, read their runs, and answer the interrupts they pause on.",
    auth=TokenAuth(),
    # Per token: settings.GRUNDLAG_API_RATE, 429 with Retry-After past it (as the MCP endpoint).
    throttle=waiting.TokenRateThrottle(),
    urls_namespace="api",
)


# Schemas


class In(Schema):
    """A request body: a field it does not know is refused (422), not ignored, so that a
    misspelt option is not silently left out."""

    model_config = ConfigDict(extra="forbid")


class ActionOut(Schema):
    name: str
    description: str
    input_schema: dict[str, Any]
    answer_schema: dict[str, Any] | None


class Requires(Schema):
    """What deciding the interrupt requires: its decision contract, settled once when it was
    created from the action's policy, the team's, the request, the rules, routing and
    delegation (README: How the layers combine); its `interrupted` event says what each
    changed."""

    team: str = Field(description="The team that decides it (a routing rule may have sent it on)")
    approvals: int = Field(description="Distinct people who must approve the same answer")
    assignees: list[str] = Field(
        description="Only they may decide it (and no API token); empty: any member of the team (or its "
        "token, where one approval does). Empty too where a rule routed it to another team: that team's"
    )
    requester_may_approve: bool = Field(
        description="False: whoever started the run may not approve it, nor may an API token (not a person)"
    )
    deadline: datetime | None
    at_deadline: Literal["default_answer", "expires"] | None = Field(
        description="What the deadline does: approve with the default answer, or expire it (the run fails)"
    )
    escalate_to: str | None = Field(description="The team that may decide it too from `escalate_at`")
    escalate_at: datetime | None


class InterruptOut(Schema):
    id: int
    seq: int
    message: str
    data: Any
    tool_call_id: str = ""
    requires: Requires
    resume_url: str
    reject_url: str


class RunFields(Schema):
    """What every description of a run says (run_fields)."""

    id: int
    action: str
    consumer: str
    status: str
    output: Any
    error: str


class RunOut(RunFields):
    interrupt: InterruptOut | None


class ApprovalOut(Schema):
    by: str
    answer: Any
    at: datetime
    counted: bool = Field(description="False when a later approval with another answer superseded it")


class TranscriptEntry(Schema):
    id: int
    seq: int
    message: str
    data: Any
    call: dict[str, Any] | None = Field(
        None,
        description="The call this pause (and its answer) is bound to: action, and for agents and "
        "scripts its turn and/or position and arguments_sha256",
    )
    status: str
    answer: Any
    edited_arguments: Any = Field(
        None,
        description="An agent's tool call approved with arguments the reviewer edited: those it ran with",
    )
    reason: str
    decided_by: str | None
    decided_at: datetime | None
    created_at: datetime
    approvals: list[ApprovalOut] = Field(
        default_factory=list, description="With N-of-M approvals: each person's, in order"
    )


class RunDetailOut(RunOut):
    transcript: list[TranscriptEntry]


class InterruptListItem(Schema):
    id: int
    run_id: int
    seq: int
    action: str
    message: str
    data: Any
    status: str
    requires: Requires
    created_at: datetime
    decided_by: str | None
    decided_at: datetime | None


class RunIn(In):
    action: str = Field(min_length=1, max_length=200)
    input: dict[str, Any] = Field(default_factory=dict)


class ResumeIn(In):
    data: Any = None
    arguments: dict[str, Any] | None = Field(
        None,
        description="An agent's tool call only: approve it with these arguments instead of the "
        "proposed ones (validated by the tool's input schema); the model sees the call as edited",
    )


class RejectIn(In):
    """Why it is rejected: ``reason``, as every response and the README call it. ``error``, its
    first name, is still read, for clients written before (``reason`` wins where both are sent)."""

    reason: str | None = Field(None, min_length=1, max_length=10_000)
    error: str | None = Field(None, min_length=1, max_length=10_000, json_schema_extra={"deprecated": True})

    @model_validator(mode="after")
    def _a_reason(self) -> RejectIn:
        if self.reason is None and self.error is None:
            raise ValueError("give the reason for rejecting: reason (a non-empty string)")
        return self

    @property
    def why(self) -> str:
        return self.reason or self.error or ""


class ChatMessage(Schema):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class AgentRunIn(In):
    messages: list[ChatMessage] = Field(min_length=1, max_length=500)
    tools: list[str] = Field(default_factory=list, max_length=100)
    model: str | dict[str, Any] = Field(
        description='A model named in GRUNDLAG_MODELS, or {"scripted": [turns]} for a deterministic one'
    )


class AgentRunDetailOut(RunDetailOut):
    messages: list[dict[str, Any]]


class ScriptRunIn(In):
    source: str = Field(min_length=1, max_length=100_000, description="Python; calls tools.<action>(...)")
    input: dict[str, Any] = Field(default_factory=dict)


class ScriptRunDetailOut(RunDetailOut):
    call_log: list[dict[str, Any]]
    paused_at: int | None


class Error(Schema):
    detail: Any


class DecidedError(Schema):
    detail: str
    status: str
    decided_by: str
    decided_at: datetime | None


# Errors: always JSON with a "detail".


@api.exception_handler(engine.AlreadyDecided)
def already_decided(request: HttpRequest, exc: engine.AlreadyDecided) -> HttpResponse:
    it = exc.interrupt
    body = {
        "detail": str(exc),
        "status": it.status,
        "decided_by": it.decided_by_name,
        "decided_at": it.decided_at,
    }
    return api.create_response(request, body, status=409)


@api.exception_handler(engine.NotCancellable)
def not_cancellable(request: HttpRequest, exc: engine.NotCancellable) -> HttpResponse:
    return api.create_response(request, {"detail": str(exc)}, status=409)


@api.exception_handler(idempotency.KeyInUse)
def key_in_use(request: HttpRequest, exc: idempotency.KeyInUse) -> HttpResponse:
    response = api.create_response(request, {"detail": str(exc)}, status=409)
    response["Retry-After"] = "1"
    return response


@api.exception_handler(engine.NotAllowed)
def not_allowed(request: HttpRequest, exc: engine.NotAllowed) -> HttpResponse:
    return api.create_response(request, {"detail": str(exc)}, status=403)


@api.exception_handler(SandboxUnavailable)
def sandbox_unavailable(request: HttpRequest, exc: SandboxUnavailable) -> HttpResponse:
    return api.create_response(request, {"detail": str(exc)}, status=503)


@api.exception_handler(engine.Busy)
def busy(request: HttpRequest, exc: engine.Busy) -> HttpResponse:
    response = api.create_response(request, {"detail": str(exc)}, status=503)
    response["Retry-After"] = "1"
    return response


@api.exception_handler(engine.InvalidInput)
def invalid_input(request: HttpRequest, exc: engine.InvalidInput) -> HttpResponse:
    return api.create_response(request, {"detail": exc.errors, "message": str(exc)}, status=422)


@api.exception_handler(engine.PayloadTooLarge)
def too_large(request: HttpRequest, exc: engine.PayloadTooLarge) -> HttpResponse:
    return api.create_response(request, {"detail": str(exc)}, status=413)


@api.exception_handler(OperationalError)
@api.exception_handler(InterfaceError)
def database_unavailable(request: HttpRequest, exc: Exception) -> HttpResponse:
    return api.create_response(request, {"detail": DATABASE_UNAVAILABLE}, status=503)


@api.exception_handler(ModelError)
def model_error(request: HttpRequest, exc: ModelError) -> HttpResponse:
    return api.create_response(request, {"detail": str(exc)}, status=422)


@api.exception_handler(UnknownAction)
def unknown_action(request: HttpRequest, exc: UnknownAction) -> HttpResponse:
    return api.create_response(request, {"detail": str(exc)}, status=404)


# Serialising


def interrupt_out(request: HttpRequest, it: Interrupt) -> dict[str, Any]:
    return {
        "id": it.pk,
        "seq": it.seq,
        "message": it.message,
        "data": it.data,
        "tool_call_id": it.tool_call_id,
        "requires": requires_out(it, token_of(request).team_id),
        "resume_url": request.build_absolute_uri(reverse("api:resume_interrupt", args=[it.pk])),
        "reject_url": request.build_absolute_uri(reverse("api:reject_interrupt", args=[it.pk])),
    }


def run_out(request: HttpRequest, run: Run, *, transcript: bool = False) -> dict[str, Any]:
    if transcript:
        ordered = run.interrupts.order_by("seq").select_related("team", "escalate_to")
        interrupts = list(ordered.prefetch_related("approvals__user"))
        pending = next((it for it in interrupts if it.status == Interrupt.Status.PENDING), None)
    elif run.status == Run.Status.INTERRUPTED:
        # The one it waits on, only while it is interrupted: its interrupts are recorded with
        # that status, and it moves on only once none is left pending. Only what interrupt_out
        # tells of it (never its checkpoint): the other columns, JSON most, cost twice the query.
        waiting_on = Interrupt.objects.filter(run_id=run.pk, status=Interrupt.Status.PENDING)
        contract = waiting_on.select_related("team", "escalate_to")
        pending = contract.only(*INTERRUPT_OUT_FIELDS).order_by("seq").first()
    else:
        pending = None
    body: dict[str, Any] = {
        **run_fields(run),
        "interrupt": interrupt_out(request, pending) if pending else None,
    }
    if transcript:
        body["transcript"] = [transcript_entry(it) for it in interrupts]
    return body


def get_run(token: ApiToken, run_id: int, consumer: str | None = None) -> Run:
    runs = Run.objects.filter(team=token.team_id)
    if consumer:
        runs = runs.filter(consumer=consumer)
    try:
        return runs.get(pk=run_id)  # one or none: no ORDER BY to compile
    except Run.DoesNotExist:
        raise HttpError(404, "Not Found") from None


def get_interrupt(token: ApiToken, interrupt_id: int) -> Interrupt:
    try:
        return Interrupt.objects.get(Interrupt.visible_to([token.team_id]), pk=interrupt_id)
    except Interrupt.DoesNotExist:
        raise HttpError(404, "Not Found") from None


# Waiting: `Prefer: wait=N` (RFC 7240) holds the response until the run settles.

_WAIT = re.compile(r"\bwait\s*=\s*(\d{1,6})\b", re.IGNORECASE)
# A wait ends this long before the N seconds asked for: a client that gives up after N seconds
# gets the answer, rather than racing it.
WAIT_MARGIN_SECONDS = 0.5


def requested_wait(request: HttpRequest) -> int:
    """The seconds `Prefer: wait` asks for, at most settings.GRUNDLAG_MAX_WAIT_SECONDS."""
    match = _WAIT.search(request.headers.get("Prefer", ""))
    if not match:
        return 0
    return min(int(match.group(1)), settings.GRUNDLAG_MAX_WAIT_SECONDS)


async def settled_response(
    request: HttpRequest,
    act: Callable[[], int],
    *,
    done: Collection[str] = Run.SETTLED,
    describe: Callable[[HttpRequest, Run], dict[str, Any]] | None = None,
    response: HttpResponse | None = None,
) -> Status[dict[str, Any]]:
    """Do ``act`` (it names the run: started, decided on, looked up), wait for that run to
    settle as `Prefer: wait` asks (asynchronously, on an event), then describe it: 200 once it
    has, 202 while not. ``done`` are the statuses it settles in (an approval: decided, not paused);
    ``describe`` how it is told (the run's description by default). ``response`` (ninja's, for
    the view's headers) says whether the wait was taken (Preference-Applied), or declined
    because the token has as many requests held as it may (WAIT_DECLINED): then the answer
    comes at once, the act done all the same.

    Callers wait on the database row, the truth, not on a task result or a push
    (actions.live.waiting.settle)."""

    def respond(run: Run) -> Status[dict[str, Any]]:
        return Status(200 if run.status in done else 202, (describe or run_out)(request, run))

    asked = requested_wait(request)
    if not asked:
        return await waiting.settle(act, 0, done, respond)
    token = getattr(request, "auth", None)  # every API request's; a direct caller's may have none
    with waiting.place_to_wait(token.pk if isinstance(token, ApiToken) else None) as placed:
        seconds = max(asked - WAIT_MARGIN_SECONDS, 0) if placed else 0
        settled = await waiting.settle(act, seconds, done, respond)
    if response is not None:
        if placed:
            response["Preference-Applied"] = f"wait={asked}"
        else:
            response[WAIT_DECLINED] = "too-many-waits"
    return settled


async def started(
    request: HttpRequest, response: HttpResponse, start: Callable[[ApiToken], Run], **how: Any
) -> Status[dict[str, Any]]:
    """Start a run for the request's token, then answer as `Prefer: wait` asks (``how``: as
    settled_response's)."""
    token = token_of(request)
    return await settled_response(request, lambda: start(token).pk, response=response, **how)


async def decided(
    request: HttpRequest,
    response: HttpResponse,
    interrupt_id: int,
    decide: Callable[[Interrupt, ApiToken], Interrupt],
) -> Status[dict[str, Any]]:
    """Decide one of the token's team's interrupts, then answer as `Prefer: wait` asks."""
    token = token_of(request)
    return await settled_response(
        request, lambda: decide(get_interrupt(token, interrupt_id), token).run_id, response=response
    )


# Endpoints


@api.get("/actions", response=list[ActionOut], tags=["actions"])
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


@api.post(
    "/runs",
    response={200: RunOut, 202: RunOut, 404: Error, 413: Error, 422: Error},
    tags=["runs"],
)
async def create_run(request: HttpRequest, response: HttpResponse, payload: RunIn) -> Status[dict[str, Any]]:
    """Start a run of an action in the token's team. `Prefer: wait=N` waits up to N seconds
    (at most 30) for it to settle: 200 when it has, 202 while it is still queued or running."""
    return await started(
        request,
        response,
        lambda token: engine.start_run(payload.action, payload.input, token.team, token, Run.Consumer.API),
    )


@api.get("/runs/{run_id}", response={200: RunDetailOut, 404: Error}, tags=["runs"])
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


@api.post("/runs/{run_id}/cancel", response={200: RunOut, 403: Error, 404: Error, 409: Error}, tags=["runs"])
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


@api.get("/runs", response={200: RunPage, 422: Error}, tags=["runs"])
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


@api.get("/interrupts", response={200: InterruptPage, 422: Error}, tags=["interrupts"])
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


@api.get("/history", response={200: HistoryPage, 403: Error}, tags=["audit"])
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
        interrupts, applied = history.filtered(params, [token.team_id])
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


@api.post(
    "/interrupts/{interrupt_id}/resume",
    response={200: RunOut, 202: RunOut, 403: Error, 404: Error, 409: DecidedError, 413: Error, 422: Error},
    url_name="resume_interrupt",
    tags=["interrupts"],
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


@api.post(
    "/interrupts/{interrupt_id}/reject",
    response={200: RunOut, 202: RunOut, 403: Error, 404: Error, 409: DecidedError, 413: Error, 422: Error},
    url_name="reject_interrupt",
    tags=["interrupts"],
)
async def reject_interrupt(
    request: HttpRequest, response: HttpResponse, interrupt_id: int, payload: RejectIn
) -> Status[dict[str, Any]]:
    """Reject a pending interrupt with a reason: an action's run ends `rejected`."""
    return await decided(
        request, response, interrupt_id, lambda it, token: engine.reject(it, payload.why, token)
    )


# Agents


def agent_out(request: HttpRequest, run: Run) -> dict[str, Any]:
    return {**run_out(request, run, transcript=True), "messages": run.driver_state.get("messages", [])}


@api.post(
    "/agents/runs",
    response={200: RunOut, 202: RunOut, 404: Error, 413: Error, 422: Error},
    tags=["agents"],
)
async def create_agent_run(
    request: HttpRequest, response: HttpResponse, payload: AgentRunIn
) -> Status[dict[str, Any]]:
    """Start an agent: the model loops over its tool calls; a call that pauses stops the run as
    `interrupted` with the interrupt (and its `tool_call_id`); answer it like any interrupt."""
    messages = [message.model_dump(exclude_none=True) for message in payload.messages]
    return await started(
        request,
        response,
        lambda token: start_agent(messages, payload.tools, payload.model, token.team, token),
    )


@api.get("/agents/runs/{run_id}", response={200: AgentRunDetailOut, 404: Error}, tags=["agents"])
def read_agent_run(request: HttpRequest, run_id: int) -> dict[str, Any]:
    """The agent run with its transcript and its conversation (`messages`)."""
    return agent_out(request, get_run(token_of(request), run_id, consumer=Run.Consumer.AGENT))


# Scripts


@api.post(
    "/scripts/runs",
    response={200: RunOut, 202: RunOut, 413: Error, 422: Error, 503: Error},
    tags=["scripts"],
)
async def create_script_run(
    request: HttpRequest, response: HttpResponse, payload: ScriptRunIn
) -> Status[dict[str, Any]]:
    """Run a script in the sandbox. It reads `input`, calls `tools.<action>(**kwargs)`, and its
    `return` value is the output. A call that pauses stops it as `interrupted`; answering the
    interrupt replays the script from its call log."""
    return await started(
        request, response, lambda token: start_script(payload.source, payload.input, token.team, token)
    )


@api.get("/scripts/runs/{run_id}", response={200: ScriptRunDetailOut, 404: Error}, tags=["scripts"])
def read_script_run(request: HttpRequest, run_id: int) -> dict[str, Any]:
    """The script run with its transcript and its call log."""
    run = get_run(token_of(request), run_id, consumer=Run.Consumer.SANDBOX)
    paused = run.driver_state.get("paused")
    return {
        **run_out(request, run, transcript=True),
        "call_log": run.driver_state.get("call_log", []),
        "paused_at": paused["position"] if paused else None,
    }


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
        policy = as_requested(engine.effective_policy(run.team_id, APPROVAL_ACTION), policy_of(asked))
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
    }


# An approval is settled once decided (its run finished), not while it waits for the decision.
APPROVAL_DECIDED = Run.FINISHED


@api.post(
    "/approvals",
    response={200: ApprovalRequestOut, 202: ApprovalRequestOut, 413: Error, 422: Error},
    tags=["approvals"],
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


@api.get("/approvals/{approval_id}", response={200: ApprovalRequestOut, 404: Error}, tags=["approvals"])
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


@api.post(
    "/approvals/{approval_id}/cancel",
    response={200: ApprovalRequestOut, 403: Error, 404: Error, 409: Error},
    tags=["approvals"],
)
def cancel_approval(request: HttpRequest, approval_id: int) -> dict[str, Any]:
    """Withdraw a pending approval: it leaves the inbox and ends `cancelled`. 409 once decided."""
    token = token_of(request)
    run = get_run(token, approval_id, Run.Consumer.APPROVAL)
    engine.cancel(run, token)
    run.refresh_from_db()
    return approval_out(request, run)


# Webhooks: the token's team's endpoints, told of its events (actions.notify.webhook).

# Each event is one request per endpoint: a cap keeps a team from turning the server into an
# amplifier, and the other teams' deliveries from waiting behind its own.
MAX_WEBHOOKS_PER_TEAM = 10


class WebhookIn(In):
    url: str = Field(
        min_length=1,
        max_length=2000,
        description="An http or https URL whose host resolves to public addresses only (unless the "
        "site sets GRUNDLAG_WEBHOOK_ALLOW_PRIVATE); checked again at each delivery",
        json_schema_extra={"format": "uri", "pattern": "^[Hh][Tt][Tt][Pp][Ss]?://"},
    )
    events: list[WebhookEvent] = Field(min_length=1, max_length=len(Webhook.EVENTS))


class WebhookOut(Schema):
    id: int
    url: str
    events: list[str]
    created_at: datetime
    disabled_at: datetime | None = Field(description="Set when every delivery failed for a day")
    disabled_reason: str
    failing_since: datetime | None


class WebhookCreatedOut(WebhookOut):
    secret: str = Field(description="whsec_...: verifies the signatures; shown only now")


def webhook_out(hook: Webhook) -> dict[str, Any]:
    return {
        "id": hook.pk,
        "url": hook.url,
        "events": hook.events,
        "created_at": hook.created_at,
        "disabled_at": hook.disabled_at,
        "disabled_reason": hook.disabled_reason,
        "failing_since": hook.failing_since,
    }


@api.post("/webhooks", response={201: WebhookCreatedOut, 422: Error}, tags=["webhooks"])
def create_webhook(request: HttpRequest, payload: WebhookIn) -> Status[dict[str, Any]]:
    """Register an endpoint for the team's events. Each request it gets is signed per the
    Standard Webhooks spec with the `secret` in this response, which is not shown again."""
    token = token_of(request)
    if problem := webhook.url_problem(payload.url):
        raise HttpError(422, f"url: {problem}")
    if Webhook.objects.filter(team=token.team_id).count() >= MAX_WEBHOOKS_PER_TEAM:
        raise HttpError(422, f"a team has at most {MAX_WEBHOOKS_PER_TEAM} webhooks; delete one first")
    events = sorted(set(payload.events))
    with transaction.atomic():
        hook = Webhook.objects.create(
            team_id=token.team_id, url=payload.url, events=events, created_by_name=actor_name(token)
        )
        idempotency.record(None)
    return Status(201, {**webhook_out(hook), "secret": hook.secret})


@api.get("/webhooks", response=list[WebhookOut], tags=["webhooks"])
def list_webhooks(request: HttpRequest) -> list[dict[str, Any]]:
    return [webhook_out(hook) for hook in Webhook.objects.filter(team=token_of(request).team_id)]


@api.delete("/webhooks/{webhook_id}", response={204: None, 404: Error}, tags=["webhooks"])
def delete_webhook(request: HttpRequest, webhook_id: int) -> Status[None]:
    deleted, _ = Webhook.objects.filter(team=token_of(request).team_id, pk=webhook_id).delete()
    if not deleted:
        raise HttpError(404, "no such webhook")
    return Status(204, None)
