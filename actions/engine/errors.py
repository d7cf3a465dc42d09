"""What the engine refuses, and the limits on what it stores.

Every refusal is an ``EngineError`` whose message is safe to show to whoever made the request;
the views and the API map each class to a status code. Nothing changed when one is raised.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable
from functools import wraps
from typing import Any, ParamSpec, TypeVar

from django.conf import settings
from django.db import OperationalError, connection
from django.utils import timezone

from actions.core import MAX_NESTING, value_problem
from actions.models import Interrupt

logger = logging.getLogger(__name__)


# What a caller is told while the database does not answer (a page's 503, the API's).
DATABASE_UNAVAILABLE = (
    "The database is unavailable right now. Nothing was changed; please try again in a moment."
)


class EngineError(Exception):
    """A refused request. The message is safe to show to whoever made it."""


class InvalidInput(EngineError):
    def __init__(self, message: str, errors: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.errors = errors


class InvalidAnswer(InvalidInput):
    pass


class PayloadTooLarge(EngineError):
    pass


class AlreadyDecided(EngineError):
    def __init__(self, interrupt: Interrupt) -> None:
        self.interrupt = interrupt
        if interrupt.decided_at is not None:
            when = timezone.localtime(interrupt.decided_at).strftime("%Y-%m-%d %H:%M:%S %Z")
            text = f"already {interrupt.status} by {interrupt.decided_by_name} at {when}"
        else:
            text = f"this interrupt is {interrupt.status} and can no longer be decided"
        super().__init__(text)


class NotCancellable(EngineError):
    pass


class NotAllowed(EngineError):
    """The caller may see this interrupt but not decide it (assignment, N-of-M rules,
    separation of duties)."""


class Busy(EngineError):
    """A change lost to concurrent changes more often than it is retried. Nothing changed."""


# Transient conflicts a transaction may lose to another (PostgreSQL's deadlock_detected and
# serialization_failure): the loser is rolled back whole, so running it again is safe.
RETRYABLE_SQLSTATES = frozenset({"40P01", "40001"})
RETRIES = 5

P = ParamSpec("P")
R = TypeVar("R")


def _is_conflict(exc: OperationalError) -> bool:
    cause = exc.__cause__
    return getattr(cause, "sqlstate", None) in RETRYABLE_SQLSTATES


def retry_on_conflict(change: Callable[P, R]) -> Callable[P, R]:
    """Run an engine change again when the database rolled it back for a deadlock or a
    serialization failure. Only the outermost transaction can be retried: inside a caller's
    own ``atomic()`` block the conflict goes up to it."""

    @wraps(change)
    def retrying(*args: P.args, **kwargs: P.kwargs) -> R:
        for attempt in range(1, RETRIES + 1):
            try:
                return change(*args, **kwargs)
            except OperationalError as exc:
                if not _is_conflict(exc) or connection.in_atomic_block:
                    raise
                logger.info("%s lost a conflict (attempt %s): %s", change.__name__, attempt, exc)
                time.sleep(random.uniform(0, 0.02 * attempt))
        raise Busy("the change met concurrent changes too often; nothing was changed, try again")

    return retrying


MAX_ERROR_CHARS = 4000
# A driver's state (an agent's conversation, a script's call log) grows with the run: its limit
# is this many times GRUNDLAG_MAX_PAYLOAD_BYTES.
DRIVER_STATE_LIMIT_FACTOR = 16


def safe_text(text: str, limit: int | None = None) -> str:
    """Text any database stores: lone surrogates escaped, and at most ``limit`` characters."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "…"
    return text


def check_size(what: str, value: Any, *, limit: int | None = None) -> None:
    """Refuse a value that cannot be stored and shown safely: nested deeper than MAX_NESTING
    (pages, exports and the admin render it), a number JSON has no word for (NaN, Infinity:
    the database's JSON check refuses them), or larger than GRUNDLAG_MAX_PAYLOAD_BYTES."""
    if problem := value_problem(value):
        kind, path = problem
        msg = {
            "too_deep": f"nested deeper than {MAX_NESTING} levels",
            "not_finite": "NaN and Infinity are not JSON numbers",
            "not_unicode": "text with a lone surrogate is not Unicode",
            "nul": "text with the NUL character (\\u0000) cannot be stored",
        }[kind]
        path = [safe_text(step) if isinstance(step, str) else step for step in path]
        where = "".join(f"[{step!r}]" if isinstance(step, int) else f".{step}" for step in path)
        raise InvalidInput(
            f"{what}{' at ' + where.lstrip('.') if where else ''}: {msg}",
            [{"loc": list(path), "msg": msg, "type": kind}],
        )
    limit = settings.GRUNDLAG_MAX_PAYLOAD_BYTES if limit is None else limit
    size = len(json.dumps(value, ensure_ascii=False).encode())
    if size > limit:
        raise PayloadTooLarge(f"{what} is {size} bytes; the limit is {limit} bytes")


def storing_problem(what: str, value: Any, factor: int = 1) -> str:
    """Why ``value`` cannot be stored (check_size's message), or ""."""
    try:
        check_size(what, value, limit=settings.GRUNDLAG_MAX_PAYLOAD_BYTES * factor)
    except EngineError as exc:
        return str(exc)
    return ""
