"""What the resources share: a run and an interrupt as the API gives them, the token's own
runs and interrupts (another team's are 404), and ``Prefer: wait``."""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from typing import Any

from django.conf import settings
from django.db.models import prefetch_related_objects
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from ninja import Status
from ninja.errors import HttpError

from actions import engine
from actions.api.base import WAIT_DECLINED, token_of
from actions.live import waiting
from actions.models import ApiToken, Interrupt, Run
from actions.reads.records import (
    requires_out,
    run_fields,
    transcript_entry,
)

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
        interrupts = engine.run_interrupts(run.pk)
        # The approvals of those that need several (the transcript tells each), in one query.
        prefetch_related_objects([it for it in interrupts if it.approvals_required > 1], "approvals__user")
        pending = next((it for it in interrupts if it.status == Interrupt.Status.PENDING), None)
    elif run.status == Run.Status.INTERRUPTED:
        # The one it waits on, only while it is interrupted: its interrupts are recorded with
        # that status, and it moves on only once none is left pending.
        pending = engine.waiting_on(run.pk)
    else:
        pending = None
    if pending is not None:
        # The teams whose slugs its contract tells: the token's, read with it, as a rule.
        token = token_of(request)
        pending.team = token.team if pending.team_id == token.team_id else engine.read_team(pending.team_id)
        if pending.escalate_to_id is not None:
            pending.escalate_to = engine.read_team(pending.escalate_to_id)
    body: dict[str, Any] = {
        **run_fields(run),
        "interrupt": interrupt_out(request, pending) if pending else None,
    }
    if transcript:
        body["transcript"] = [transcript_entry(it) for it in interrupts]
    return body


def get_run(token: ApiToken, run_id: int, consumer: str | None = None) -> Run:
    run = engine.team_run(run_id, token.team_id, consumer)
    if run is None:
        raise HttpError(404, "Not Found")
    return run


def get_interrupt(token: ApiToken, interrupt_id: int) -> Interrupt:
    interrupt = engine.visible_interrupt(interrupt_id, token.team_id)
    if interrupt is None:
        raise HttpError(404, "Not Found")
    return interrupt


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
