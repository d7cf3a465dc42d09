"""Idempotency keys: the request a change was made for, kept in the change's transaction.

An API request sent with an ``Idempotency-Key`` (actions.web.middleware.IdempotencyMiddleware)
is handled inside ``requested(claim)``. The first engine change it makes (``journal.atomic``,
as the transaction ends; or ``record`` in a transaction of the caller's own) writes the key's
row in that transaction: the change and the key are committed together, or neither is.

- Two requests with the same key at once: the second's row breaks the unique constraint, its
  change is rolled back (KeyInUse), and it is told to retry, when it gets the first's answer.
- A request that changes nothing (refused, invalid) leaves no key: sent again, it runs again.
- A process that stops after the change and before answering leaves the key without an answer:
  a retry is told the change was made, and to which run (``run_id``), not made again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from actions.engine.errors import EngineError
from actions.models import IdempotencyKey

KEPT = timedelta(hours=24)
IN_USE = "A request with this Idempotency-Key is being answered; retry in a moment for its answer."


class KeyInUse(EngineError):
    """Another request with the same key made its change first; this one's is undone."""


@dataclass
class Claim:
    token_id: int
    key: str
    request_hash: str
    # The key's row, once a change wrote it (in a transaction that may yet be rolled back).
    row_id: int | None = None


_claim: ContextVar[Claim | None] = ContextVar("grundlag_idempotency", default=None)


def request_hash(method: str, path: str, body: bytes) -> str:
    return hashlib.sha256(f"{method} {path}\n".encode() + body).hexdigest()


@contextmanager
def requested(claim: Claim) -> Iterator[Claim]:
    """Handle a request under ``claim``: its first change keeps the key."""
    token = _claim.set(claim)
    try:
        yield claim
    finally:
        _claim.reset(token)


def record(run_id: int | None) -> bool:
    """In the transaction of a change made for a request with a key: keep the key with it
    (``run_id``: the run changed, if one was). Whether a key was written now; False when there
    is none, or a change of the same request wrote it already. Raises KeyInUse."""
    claim = _claim.get()
    if claim is None or claim.row_id is not None:
        return False
    try:
        with transaction.atomic():  # a savepoint: the violation must not end the transaction
            row = IdempotencyKey.objects.create(
                token_id=claim.token_id, key=claim.key, request_hash=claim.request_hash, run_id=run_id
            )
    except IntegrityError:
        raise KeyInUse(IN_USE) from None
    claim.row_id = row.pk
    return True


def forget() -> None:
    """The transaction that wrote the key was rolled back: a retry of the change writes it."""
    claim = _claim.get()
    if claim is not None:
        claim.row_id = None


def answered(claim: Claim, status_code: int, body: bytes, content_type: str) -> None:
    """Keep the answer to the request whose change wrote the key, for its retries."""
    if claim.row_id is None:
        return
    IdempotencyKey.objects.filter(pk=claim.row_id, status_code=None).update(
        status_code=status_code, response=body, content_type=content_type
    )


def prune(now: datetime | None = None) -> int:
    """Forget the keys older than a day; how many."""
    deleted, _ = IdempotencyKey.objects.filter(created_at__lt=(now or timezone.now()) - KEPT).delete()
    return deleted
