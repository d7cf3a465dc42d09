"""What every operation of the HTTP API shares: the token auth, the headers documented on
every POST and read, the OpenAPI document that says so, and the schemas every resource uses."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from django.http import HttpRequest
from ninja import NinjaAPI, Schema
from ninja.security import HttpBearer
from pydantic import ConfigDict, Field, model_validator

from actions import engine
from actions.models import ApiToken, Scope


class MissingScope(Exception):
    """The token is in force, but has none of the scopes the operation needs (403)."""

    def __init__(self, scopes: tuple[str, ...]) -> None:
        self.scopes = scopes
        needs = " or ".join(scopes)
        super().__init__(
            f"This token may not do this: it needs the scope {needs}."
            " A team admin makes tokens with the scopes they need (the Team page, or manage.py"
            " create_api_token --scope)."
        )


class TokenAuth(HttpBearer):
    """The bearer token, read from its header as MCP and the idempotency middleware read it
    (ApiToken.key_in), so that the three accept the same headers; with one of ``scopes``
    (``needs``), or refused with 403 naming them."""

    def __init__(self, *scopes: str) -> None:
        super().__init__()
        self.scopes = scopes

    def __call__(self, request: HttpRequest) -> ApiToken | None:
        token = engine.authenticate(ApiToken.key_in(request.headers.get("Authorization", "")))
        if token is not None and not token.allows(self.scopes):
            raise MissingScope(self.scopes)
        return token

    def authenticate(self, request: HttpRequest, token: str) -> ApiToken | None:
        return engine.authenticate(token)


def needs(*scopes: Scope) -> list[TokenAuth]:
    """An operation's auth: a token in force with one of ``scopes``."""
    return [TokenAuth(*(str(scope) for scope in scopes))]


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


UNAUTHORIZED = {
    "description": "No API token, or not one in force here: unknown, revoked or expired"
    " (Authorization: Bearer ...)"
}
MISSING_SCOPE = {"description": "The token lacks the scope the operation needs: `missing_scope` names it"}
DOES_NOT_FIT = {
    "description": "The request does not fit: a path id, a query parameter or the body (or an "
    "Idempotency-Key sent again with another request); `detail` names the field"
}


def _document(responses: dict[Any, Any], code: int, response: dict[str, Any]) -> None:
    """Add ``code`` unless the operation documents it already (ninja keys its own by number)."""
    if code not in responses and str(code) not in responses:
        responses[str(code)] = response


class Api(NinjaAPI):
    def get_openapi_operation_id(self, operation: Any) -> str:
        """As when the API was one module: clients generated from the document keep their names."""
        return f"actions_api_{operation.view_func.__name__}"

    def scopes(self) -> dict[str, tuple[str, ...]]:
        """Each operation's scopes (any one of them), by its OpenAPI operationId."""
        return {
            self.get_openapi_operation_id(operation): auth.scopes
            for _prefix, router in self._routers
            for view in router.path_operations.values()
            for operation in view.operations
            for auth in operation.auth_callbacks
            if isinstance(auth, TokenAuth)
        }

    def get_openapi_schema(self, *, path_prefix: str | None = None, path_params: Any = None) -> Any:
        """Ninja's document, with the headers every POST takes (and the waits of the reads)."""
        schema = super().get_openapi_schema(path_prefix=path_prefix, path_params=path_params)
        error = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
        scopes = self.scopes()
        for path, operations in schema["paths"].items():
            for operation in operations.values():
                _document(operation["responses"], 429, {**RATE_LIMITED, "content": error})
                if operation.get("security"):
                    _document(operation["responses"], 401, {**UNAUTHORIZED, "content": error})
                if needed := scopes.get(operation.get("operationId", "")):
                    # OpenAPI 3.1: a scheme other than OAuth's may list the roles it requires;
                    # a requirement each: any one of them will do.
                    operation["security"] = [{"TokenAuth": [scope]} for scope in needed]
                    _document(operation["responses"], 403, {**MISSING_SCOPE, "content": error})
                    said = f"Token scope: {' or '.join(f'`{scope}`' for scope in needed)}."
                    operation["description"] = f"{operation.get('description', '')}\n\n{said}".strip()
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
    delegation (docs/explanation/engine.md: how the layers combine); its `interrupted` event says what each
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
    """Why it is rejected: ``reason``, as every response and the docs call it. ``error``, its
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
