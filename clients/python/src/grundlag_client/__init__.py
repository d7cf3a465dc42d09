"""A typed client for the Grundlag approvals API.

    from grundlag_client import Client, Rejected, TimedOut, requires_approval

    client = Client("https://approvals.example.com", token="gl_...")
    answer = client.request_approval("Deploy v2.3 to production?", {"service": "billing"}, timeout=3600)

Every POST is sent with an ``Idempotency-Key`` and retried with the same key when the answer
was lost on the way (a timeout, a dropped connection, a 502/503/504, or the server saying the
first attempt is still being answered): a retry never starts a second run or decides twice.
Waiting is done by the server (``Prefer: wait``): one long request at a time, no busy polling.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from typing import Any, ParamSpec, TypeVar

import httpx

__all__ = [
    "Approval",
    "ApiError",
    "Client",
    "Interrupt",
    "InterruptSummary",
    "Rejected",
    "Requires",
    "Run",
    "RunSummary",
    "TimedOut",
    "requires_approval",
]

# The server holds a `Prefer: wait` request at most this long (GRUNDLAG_MAX_WAIT_SECONDS).
MAX_WAIT_SECONDS = 30
RETRIED_STATUSES = (429, 502, 503, 504)
# How long past the server's longest wait a retry waits for the first attempt's answer.
IN_USE_MARGIN_SECONDS = 90


# Errors


class ApiError(Exception):
    """The API refused the request: ``status`` and its ``detail`` (a message, or field errors)."""

    def __init__(self, status: int, detail: Any, body: dict[str, Any] | None = None) -> None:
        super().__init__(f"{status}: {detail}")
        self.status, self.detail, self.body = status, detail, body or {}


class Rejected(Exception):
    """The approval was not given: rejected by a reviewer (or a rule), expired at its deadline,
    cancelled, or failed. ``reason`` says why, ``status`` which."""

    def __init__(self, reason: str, status: str = "rejected", approval: Approval | None = None) -> None:
        super().__init__(f"{status}: {reason}" if reason else status)
        self.reason, self.status, self.approval = reason, status, approval


class TimedOut(Exception):
    """The caller's timeout passed before a decision; the approval is still pending (``id``)."""

    def __init__(self, approval_id: int) -> None:
        super().__init__(f"approval {approval_id} is still pending")
        self.id = approval_id


# What the API returns (the OpenAPI document's schemas, kept in agreement by the server's tests)


T = TypeVar("T", bound="Model")


@dataclass(frozen=True)
class Model:
    # The OpenAPI schema this model reads.
    SCHEMA = ""

    @classmethod
    def from_json(cls: type[T], body: dict[str, Any]) -> T:
        known = {each.name for each in fields(cls)}
        return cls(**{name: value for name, value in body.items() if name in known})


@dataclass(frozen=True)
class Requires(Model):
    """What deciding an interrupt requires (its decision contract, settled when it was made):
    the team that decides it, how many distinct people must approve the same answer, who alone
    may (``assignees``; empty: any member), whether the requester may approve, the deadline and
    what it does (``"default_answer"`` or ``"expires"``), and escalation."""

    SCHEMA = "Requires"
    team: str
    approvals: int
    assignees: list[str]
    requester_may_approve: bool
    deadline: str | None
    at_deadline: str | None
    escalate_to: str | None
    escalate_at: str | None


def _with_requires(model: T, body: dict[str, Any]) -> T:
    requires = body.get("requires")
    return model if requires is None else _replace(model, requires=Requires.from_json(requires))


@dataclass(frozen=True)
class Interrupt(Model):
    """A pause a run waits on: answer it with ``Client.resume`` or ``Client.reject``."""

    SCHEMA = "InterruptOut"
    id: int
    seq: int
    message: str
    data: Any
    resume_url: str
    reject_url: str
    tool_call_id: str = ""
    requires: Requires | None = None  # None from a server older than 2026-12

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Interrupt:
        return _with_requires(super().from_json(body), body)


@dataclass(frozen=True)
class _RunFields(Model):
    id: int
    action: str
    consumer: str
    status: str
    output: Any
    error: str


@dataclass(frozen=True)
class Run(_RunFields):
    SCHEMA = "RunOut"
    interrupt: Interrupt | None = None

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Run:
        run = super().from_json(body)
        pending = body.get("interrupt")
        return run if pending is None else _replace(run, interrupt=Interrupt.from_json(pending))

    @property
    def settled(self) -> bool:
        return self.status not in ("queued", "running")


@dataclass(frozen=True)
class Approval(Model):
    SCHEMA = "ApprovalRequestOut"
    id: int
    status: str  # pending, approved, rejected, expired, cancelled, failed
    message: str
    data: Any
    answer: Any
    reason: str
    decided_by: str | None
    decided_via: str
    decided_at: str | None
    created_at: str
    expires_at: str | None
    approvals_required: int
    assignees: list[str]
    answer_schema: dict[str, Any] | None
    url: str
    # The interrupt people decide, recorded when it was asked (None from a server before it).
    interrupt_id: int | None = None
    # Once approved: the decision, signed (grundlag_client.receipts.verify_receipt checks it).
    receipt: str | None = None

    @property
    def decided(self) -> bool:
        return self.status != "pending"


@dataclass(frozen=True)
class RunSummary(_RunFields):
    SCHEMA = "RunListItem"
    started_by: str
    created_at: str
    finished_at: str | None


@dataclass(frozen=True)
class InterruptSummary(Model):
    SCHEMA = "InterruptListItem"
    id: int
    run_id: int
    seq: int
    action: str
    message: str
    data: Any
    status: str
    created_at: str
    decided_by: str | None
    decided_at: str | None
    requires: Requires | None = None  # None from a server older than 2026-12

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> InterruptSummary:
        return _with_requires(super().from_json(body), body)


def _replace(model: T, **changes: Any) -> T:
    return dataclasses.replace(model, **changes)


# The operations this client calls: name -> (method, path, the schema of its answer). The
# server's tests check each against its OpenAPI document.
OPERATIONS: dict[str, tuple[str, str, str]] = {
    "start_run": ("post", "/api/runs", Run.SCHEMA),
    "get_run": ("get", "/api/runs/{run_id}", "RunDetailOut"),
    "cancel": ("post", "/api/runs/{run_id}/cancel", Run.SCHEMA),
    "runs": ("get", "/api/runs", "RunPage"),
    "interrupts": ("get", "/api/interrupts", "InterruptPage"),
    "resume": ("post", "/api/interrupts/{interrupt_id}/resume", Run.SCHEMA),
    "reject": ("post", "/api/interrupts/{interrupt_id}/reject", Run.SCHEMA),
    "create_approval": ("post", "/api/approvals", Approval.SCHEMA),
    "get_approval": ("get", "/api/approvals/{approval_id}", Approval.SCHEMA),
    "cancel_approval": ("post", "/api/approvals/{approval_id}/cancel", Approval.SCHEMA),
}


@dataclass
class _Retry:
    attempts: int = 4
    backoff: float = 0.5  # seconds, doubled each time, up to 8
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)


class Client:
    """The API of one team, as its token sees it. Thread-safe as httpx.Client is; close it (or
    use it as a context manager) when done."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 10.0,
        retries: int = 4,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
            # A waiting request is held up to MAX_WAIT_SECONDS: its read timeout allows for it.
            timeout=httpx.Timeout(timeout, read=timeout + MAX_WAIT_SECONDS),
            transport=transport,
        )
        self._retry = _Retry(attempts=max(1, retries))

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # Runs of the team's registered actions

    def start_run(
        self, action: str, input: dict[str, Any] | None = None, *, wait: float = 0, idempotency_key: str = ""
    ) -> Run:
        """Start a run; ``wait`` seconds (at most 30) for it to settle (paused or finished)."""
        body = {"action": action, "input": input or {}}
        return Run.from_json(self._post("/api/runs", body, wait=wait, key=idempotency_key))

    def get_run(self, run_id: int, *, wait: float = 0) -> Run:
        """The run; ``wait`` seconds (at most 30) for it to settle while it is queued or running."""
        return Run.from_json(self._request("GET", f"/api/runs/{run_id}", wait=wait))

    def wait(self, run_id: int, *, timeout: float | None = None) -> Run:
        """Wait for the run to settle: paused on an interrupt (answer it), or finished. Raises
        TimedOut after ``timeout`` seconds (None: forever)."""
        return _hold(lambda wait: self.get_run(run_id, wait=wait), lambda run: run.settled, run_id, timeout)

    def resume(
        self,
        interrupt_id: int,
        data: Any = None,
        *,
        arguments: dict[str, Any] | None = None,
        wait: float = 0,
        idempotency_key: str = "",
    ) -> Run:
        """Answer an interrupt; the run re-runs its action with ``data`` as the answer."""
        body: dict[str, Any] = {"data": data}
        if arguments is not None:
            body["arguments"] = arguments
        path = f"/api/interrupts/{interrupt_id}/resume"
        return Run.from_json(self._post(path, body, wait=wait, key=idempotency_key))

    def reject(
        self,
        interrupt_id: int,
        reason: str = "",
        *,
        wait: float = 0,
        idempotency_key: str = "",
        error: str = "",
    ) -> Run:
        """Reject the interrupt, saying why (``error=``: the parameter's earlier name)."""
        if not (reason := reason or error):
            raise ValueError("reject needs a reason")
        path = f"/api/interrupts/{interrupt_id}/reject"
        return Run.from_json(self._post(path, {"reason": reason}, wait=wait, key=idempotency_key))

    def cancel(self, run_id: int, *, idempotency_key: str = "") -> Run:
        return Run.from_json(self._post(f"/api/runs/{run_id}/cancel", {}, key=idempotency_key))

    def runs(self, **filters: Any) -> Iterator[RunSummary]:
        """The team's runs, newest first, every page (filters: status, action, consumer, since,
        until, limit)."""
        for item in self._pages("/api/runs", filters):
            yield RunSummary.from_json(item)

    def interrupts(self, **filters: Any) -> Iterator[InterruptSummary]:
        """The team's interrupts, newest first, every page (``status="pending"``: open ones)."""
        for item in self._pages("/api/interrupts", filters):
            yield InterruptSummary.from_json(item)

    # Approvals asked from outside

    def create_approval(
        self,
        message: str,
        data: Any = None,
        *,
        answer_schema: dict[str, Any] | None = None,
        deadline_seconds: int | None = None,
        default_answer: Any = None,
        approvals_required: int | None = None,
        assignees: list[str] | None = None,
        wait: float = 0,
        idempotency_key: str = "",
    ) -> Approval:
        """Ask the team; returns at once (or after ``wait`` seconds, at most 30) with its state."""
        body: dict[str, Any] = {"message": message, "data": data}
        optional = {
            "answer_schema": answer_schema,
            "deadline_seconds": deadline_seconds,
            "default_answer": default_answer,
            "approvals_required": approvals_required,
        }
        body.update({name: value for name, value in optional.items() if value is not None})
        if assignees:
            body["assignees"] = assignees
        then = "/api/approvals/{}"
        return Approval.from_json(
            self._post("/api/approvals", body, wait=wait, key=idempotency_key, then=then)
        )

    def get_approval(self, approval_id: int, *, wait: float = 0) -> Approval:
        """The approval; ``wait`` seconds (at most 30) for a decision while it is pending."""
        return Approval.from_json(self._request("GET", f"/api/approvals/{approval_id}", wait=wait))

    def cancel_approval(self, approval_id: int, *, idempotency_key: str = "") -> Approval:
        path, then = f"/api/approvals/{approval_id}/cancel", "/api/approvals/{}"
        return Approval.from_json(self._post(path, {}, key=idempotency_key, then=then))

    def wait_for_approval(self, approval_id: int, *, timeout: float | None = None) -> Approval:
        """Hold until the approval is decided (each request held by the server up to 30 s);
        raises TimedOut after ``timeout`` seconds (None: forever)."""
        read = lambda wait: self.get_approval(approval_id, wait=wait)  # noqa: E731
        return _hold(read, lambda approval: approval.decided, approval_id, timeout)

    def request_approval(
        self,
        message: str,
        data: Any = None,
        *,
        answer_schema: dict[str, Any] | None = None,
        timeout: float | None = None,
        cancel_on_timeout: bool = False,
        **policy: Any,
    ) -> Any:
        """Ask the team and block until it decides: the answer when approved; Rejected (with the
        reason) when rejected, expired, cancelled or failed; TimedOut after ``timeout`` seconds
        (the approval stays pending unless ``cancel_on_timeout``). ``policy``: deadline_seconds,
        default_answer, approvals_required, assignees."""
        deadline = _deadline(timeout)
        approval = self.create_approval(
            message, data, answer_schema=answer_schema, wait=_left(deadline), **policy
        )
        try:
            if not approval.decided:
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                approval = self.wait_for_approval(approval.id, timeout=remaining)
        except TimedOut:
            if not cancel_on_timeout:
                raise
            try:
                self.cancel_approval(approval.id)
                raise
            except ApiError as refused:
                # Decided just before the cancel (409): the decision stands, and is the answer.
                if refused.status != 409:
                    raise
                approval = self.get_approval(approval.id)
                if not approval.decided:
                    raise TimedOut(approval.id) from None
        if approval.status != "approved":
            raise Rejected(approval.reason, approval.status, approval)
        return approval.answer

    # HTTP

    def _post(
        self, path: str, body: Any, *, wait: float = 0, key: str = "", then: str = "/api/runs/{}"
    ) -> dict[str, Any]:
        """POST with an idempotency key: one for every attempt of this call, so the server makes
        its change once. Should the first attempt's change be made and its answer lost with its
        server (409 with the run), the run is read at ``then``: the change is not made again."""
        try:
            return self._request("POST", path, json=body, wait=wait, key=key or str(uuid.uuid4()))
        except ApiError as exc:
            if exc.status == 409 and isinstance(exc.body.get("run_id"), int):
                return self._request("GET", then.format(exc.body["run_id"]))
            raise

    def _request(
        self, method: str, path: str, *, json: Any = None, wait: float = 0, key: str = "", params: Any = None
    ) -> dict[str, Any]:
        headers = {}
        if key:
            headers["Idempotency-Key"] = key
        if wait > 0:
            headers["Prefer"] = f"wait={max(1, min(int(wait), MAX_WAIT_SECONDS))}"
        delay, attempt = self._retry.backoff, 0
        # While the first attempt is being answered (held by its wait), its retries are told so.
        patience = time.monotonic() + MAX_WAIT_SECONDS + IN_USE_MARGIN_SECONDS
        while True:
            attempt += 1
            try:
                response = self._http.request(method, path, json=json, headers=headers, params=params)
            except (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError):
                if attempt >= self._retry.attempts or (method == "POST" and not key):
                    raise
            else:
                if _in_use(response):
                    if time.monotonic() >= patience:
                        return _body(response)
                    self._retry.sleep(max(1.0, _retry_after(response)))
                    continue
                if response.status_code not in RETRIED_STATUSES or attempt >= self._retry.attempts:
                    return _body(response)
                delay = max(delay, _retry_after(response))
            self._retry.sleep(delay)
            delay = min(delay * 2, 8.0)

    def _pages(self, path: str, filters: dict[str, Any]) -> Iterator[dict[str, Any]]:
        params = {name: value for name, value in filters.items() if value is not None}
        after = ""
        while True:
            page = self._request("GET", path, params={**params, **({"after": after} if after else {})})
            yield from page["items"]
            after = page["next"]
            if not after:
                return


def _in_use(response: httpx.Response) -> bool:
    """The server is still answering the first attempt with this key (409 with Retry-After; a
    decided interrupt or a finished run is a 409 without one, and final)."""
    return response.status_code == 409 and "Retry-After" in response.headers


def _retry_after(response: httpx.Response) -> float:
    try:
        return min(float(response.headers.get("Retry-After", "0")), 30.0)
    except ValueError:
        return 0.0


def _body(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        body = {"detail": response.text}
    if response.status_code >= 400:
        if not isinstance(body, dict):
            body = {"detail": body}
        raise ApiError(response.status_code, body.get("detail"), body)
    assert isinstance(body, dict)
    return body


M = TypeVar("M")


def _hold(read: Callable[[float], M], done: Callable[[M], bool], what: int, timeout: float | None) -> M:
    """Read until ``done``, each read held by the server (``Prefer: wait``) up to its limit;
    TimedOut after ``timeout`` seconds (None: never)."""
    deadline = _deadline(timeout)
    while True:
        found = read(_left(deadline))
        if done(found):
            return found
        if deadline is not None and time.monotonic() >= deadline:
            raise TimedOut(what)


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


def _left(deadline: float | None) -> float:
    """Seconds to ask the server to wait: up to its limit, and no longer than the caller's."""
    if deadline is None:
        return MAX_WAIT_SECONDS
    return max(0.0, min(deadline - time.monotonic(), MAX_WAIT_SECONDS))


# A decorator for functions in other services

P = ParamSpec("P")
R = TypeVar("R")


def requires_approval(
    client: Client | Callable[[], Client],
    message: str | Callable[..., str],
    *,
    data: Callable[..., Any] | None = None,
    answer_schema: dict[str, Any] | None = None,
    timeout: float | None = None,
    **policy: Any,
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Run the function only once the team approves the call.

        @requires_approval(client, "Refund {amount} EUR to {customer}?", timeout=3600)
        def refund(customer: str, amount: int) -> None: ...

    ``message`` is formatted with the call's arguments (or is a function of them); the
    reviewers see the arguments as the approval's data (or ``data(*args, **kwargs)``; a
    method's ``self`` is left out). A rejection raises Rejected and the function does not run;
    a function with an ``approval`` parameter is given the answer. An ``async def`` waits in a
    thread, not on its event loop."""

    def decorate(function: Callable[P, R]) -> Callable[P, R]:
        signature = inspect.signature(function)
        wants_answer = "approval" in signature.parameters
        # A method's own object is not the call's data.
        skipped = {"approval", *(name for name in ("self", "cls") if name in signature.parameters)}

        def ask(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            bound = signature.bind_partial(*args, **kwargs)
            bound.apply_defaults()
            arguments = {name: value for name, value in bound.arguments.items() if name not in skipped}
            text = message(*args, **kwargs) if callable(message) else message.format(**arguments)
            shown = data(*args, **kwargs) if data is not None else arguments
            api = client() if callable(client) and not isinstance(client, Client) else client
            assert isinstance(api, Client)
            return api.request_approval(text, shown, answer_schema=answer_schema, timeout=timeout, **policy)

        if inspect.iscoroutinefunction(function):

            @functools.wraps(function)
            async def waits(*args: P.args, **kwargs: P.kwargs) -> Any:
                # The wait is a blocking client's: in a thread, not on the event loop.
                answer = await asyncio.to_thread(ask, args, kwargs)
                if wants_answer:
                    kwargs["approval"] = answer
                return await function(*args, **kwargs)

            return waits  # type: ignore[return-value]

        @functools.wraps(function)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            answer = ask(args, kwargs)
            if wants_answer:
                kwargs["approval"] = answer
            return function(*args, **kwargs)

        return wrapper

    return decorate
