"""Approval receipts, checked offline by the tool about to act (``pip install grundlag-client[receipts]``).

A receipt is a compact JWS the server signs (EdDSA over Ed25519) when a call was approved: who
approved what, for which call, with which arguments, until when. A tool checks it against the
server's public keys (``/.well-known/jwks.json``, fetched once and kept) and the arguments it is
about to run with::

    from grundlag_client.receipts import fetch_jwks, verify_receipt

    jwks = fetch_jwks("https://approvals.example.com")
    approved = verify_receipt(receipt, jwks, arguments, audience="https://payments.example.com/mcp",
                              seen=used_ids)

``seen`` (a set, or anything with ``in`` and ``add``, shared by the tool's processes if it has
several) makes a receipt good for one call: its id is the approved call's, the same on every
copy of it.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Protocol

__all__ = ["InvalidReceipt", "Receipt", "canonical_json", "fetch_jwks", "verify_receipt"]

ALGORITHMS = ["Ed25519", "EdDSA"]  # RFC 9864's fully-specified name, and the older one
TYPE = "grundlag-receipt+jwt"


class InvalidReceipt(Exception):
    """The receipt does not approve this call: why."""


class Seen(Protocol):
    def __contains__(self, item: object) -> bool: ...
    def add(self, item: str) -> None: ...


@dataclass(frozen=True)
class Receipt:
    """What a valid receipt says."""

    id: str
    audience: str
    team: str
    action: str
    run: int
    interrupt: int
    arguments_sha256: str
    answer: Any
    approved_by: list[dict[str, Any]]
    decided_via: str
    issuer: str
    issued_at: int
    expires_at: int


def _number(value: float | int) -> str:
    """A number as JavaScript's JSON.stringify writes it (RFC 8785, 3.2.2.3)."""
    if isinstance(value, bool):
        raise TypeError("not a number")
    if isinstance(value, int) and abs(value) < 2**53:
        return str(value)
    value = float(value)
    if not math.isfinite(value):
        raise ValueError("NaN and infinities have no JSON form")
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    _, digits, exponent = Decimal(repr(abs(value))).normalize().as_tuple()
    text = "".join(map(str, digits))
    k, n = len(text), len(text) + int(exponent)
    if k <= n <= 21:
        return sign + text + "0" * (n - k)
    if 0 < n <= 21:
        return sign + text[:n] + "." + text[n:]
    if -6 < n <= 0:
        return sign + "0." + "0" * -n + text
    mantissa = text[0] + ("." + text[1:] if k > 1 else "")
    return f"{sign}{mantissa}e{'+' if n - 1 >= 0 else '-'}{abs(n - 1)}"


def canonical_json(value: Any) -> str:
    """The JSON Canonicalization Scheme's form (RFC 8785) of a JSON value: keys sorted by their
    UTF-16 code units, no spaces, numbers as JavaScript writes them. The same in every language."""
    if value is None or isinstance(value, (bool, str)):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (int, float)):
        return _number(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(canonical_json(item) for item in value) + "]"
    if isinstance(value, dict):
        keys = sorted(value, key=lambda key: key.encode("utf-16-be"))
        return (
            "{"
            + ",".join(json.dumps(key, ensure_ascii=False) + ":" + canonical_json(value[key]) for key in keys)
            + "}"
        )
    raise TypeError(f"not a JSON value: {type(value).__name__}")


def arguments_sha256(arguments: Any) -> str:
    return hashlib.sha256(canonical_json(arguments).encode()).hexdigest()


def fetch_jwks(base_url: str, *, timeout: float = 10) -> dict[str, Any]:
    """The server's public keys (its /.well-known/jwks.json)."""
    import httpx  # noqa: PLC0415 - only for a tool that fetches them this way

    response = httpx.get(base_url.rstrip("/") + "/.well-known/jwks.json", timeout=timeout)
    response.raise_for_status()
    keys: dict[str, Any] = response.json()
    return keys


def verify_receipt(
    receipt: str,
    jwks: dict[str, Any],
    arguments: Any,
    *,
    audience: str | None = None,
    team: str | None = None,
    action: str | None = None,
    issuer: str | None = None,
    seen: Seen | None = None,
    now: float | None = None,
    leeway: int = 60,
) -> Receipt:
    """Check that ``receipt`` approves a call with exactly ``arguments``, for you: ``audience``
    (a gateway upstream's own URL, as the team registered it) or ``team`` (the team's slug), at
    least one of them, and where given this ``action`` and ``issuer``; signed by one of
    ``jwks``' keys, not expired, and not in ``seen`` (then added to it). Raises InvalidReceipt
    saying why not.

    Every team's receipts are signed with the site's keys: without ``audience`` or ``team``, a
    receipt made for another team's server would pass."""
    if audience is None and team is None:
        raise ValueError("say whom the receipt must be for: audience= (your URL) or team=")
    from joserfc import jws  # noqa: PLC0415 - the extra's dependency
    from joserfc.errors import JoseError  # noqa: PLC0415
    from joserfc.jwk import KeySet  # noqa: PLC0415

    try:
        keys = KeySet.import_key_set(jwks)  # type: ignore[arg-type]
        token = jws.deserialize_compact(receipt, keys, algorithms=ALGORITHMS)
    except (JoseError, ValueError, TypeError) as exc:
        raise InvalidReceipt(
            f"not signed by the server's keys (fetch them again if it names a new one): {exc}"
        ) from None
    if token.protected.get("typ") != TYPE:
        raise InvalidReceipt(f"not an approval receipt (typ {token.protected.get('typ')!r})")
    try:
        claims = json.loads(token.payload)
        said = Receipt(
            id=claims["jti"],
            audience=claims["aud"],
            team=claims["team"],
            action=claims["action"],
            run=claims["run"],
            interrupt=claims["interrupt"],
            arguments_sha256=claims["arguments_sha256"],
            answer=claims.get("answer"),
            approved_by=claims["approved_by"],
            decided_via=claims.get("decided_via", ""),
            issuer=claims["iss"],
            issued_at=int(claims["iat"]),
            expires_at=int(claims["exp"]),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise InvalidReceipt(f"its claims are not a receipt's: {exc}") from None
    moment = time.time() if now is None else now
    if moment > said.expires_at + leeway:
        raise InvalidReceipt("it has expired")
    if moment < said.issued_at - leeway:
        raise InvalidReceipt("it is not valid yet")
    if said.arguments_sha256 != arguments_sha256(arguments):
        raise InvalidReceipt("it approves other arguments than these")
    expectations = [("audience", audience, said.audience), ("team", team, said.team),
                    ("action", action, said.action), ("issuer", issuer, said.issuer)]  # fmt: skip
    for name, expected, actual in expectations:
        if expected is not None and expected != actual:
            raise InvalidReceipt(f"it approves {name} {actual!r}, not {expected!r}")
    if seen is not None:
        if said.id in seen:
            raise InvalidReceipt(f"it was used already (receipt {said.id})")
        seen.add(said.id)
    return said
