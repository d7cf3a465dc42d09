"""Approval receipts: a decision that approved something, as a compact JWS a tool can check
offline before it acts (docs/how-to/mcp-gateway.md#receipts).

A receipt is signed with Ed25519 (EdDSA; the header names it by RFC 9864's fully-specified
``Ed25519``) by the site's current key, and binds:

- ``jti``: the call it approves (its run, its pause, and the call's binding: action, turn,
  position, argument hash), the same for every copy: a tool that keeps the ids it has acted on
  acts once per approved call;
- ``aud``, whom it is for: a gateway call's upstream server (its URL as registered), else the
  team's page here; a tool checks it is its own, so that a receipt one team's admins made for
  their server cannot be replayed at another team's;
- ``team`` (whose call it is), ``action`` (a gateway call's is ``<upstream>/<tool>``), ``run``,
  ``interrupt``;
- ``arguments_sha256``: the SHA-256 of the arguments the call is to run with (a reviewer's edit,
  where they edited it), in RFC 8785's canonical JSON: the tool hashes what it was given and
  compares;
- ``answer``, ``approved_by`` (each of an N-of-M's approvers, with when), ``decided_via``;
- ``iat`` (the decision), ``exp`` (GRUNDLAG_RECEIPT_SECONDS later) and ``iss`` (the site).

Ed25519 signatures are deterministic: the receipt is made again whenever it is asked for (the same
while the signing key is), and nothing but the keys is stored. The public keys are served at
/.well-known/jwks.json: the current one, those retired less than GRUNDLAG_RECEIPT_SECONDS ago
(their receipts may still be in use), none revoked."""

from __future__ import annotations

import functools
import hashlib
import json
import math
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from joserfc import jws
from joserfc.jwk import OKPKey

from actions.engine import sealed
from actions.engine.rules import call_input
from actions.models import GatewayCall, Interrupt, ReceiptKey, Run

ALGORITHM = "Ed25519"
TYPE = "grundlag-receipt+jwt"
JWKS_MAX_AGE = 300  # seconds: /.well-known/jwks.json's Cache-Control


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


# The same as the clients' (clients/python, clients/typescript): the server may not depend on
# them. tests/test_receipts.py holds the server's and the Python client's to one answer, and to
# the text clients/typescript/test/client.test.mjs holds the TypeScript client's to.


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
    """What a receipt binds the arguments by: the SHA-256 of their RFC 8785 form, which a tool
    in any language computes the same (the Python and TypeScript clients' verify_receipt)."""
    return hashlib.sha256(canonical_json(arguments).encode()).hexdigest()


def _new_key() -> ReceiptKey:
    key = OKPKey.generate_key("Ed25519")
    public = key.as_dict(private=False)
    # The key's thumbprint (RFC 7638) is its id: the same key is always named the same.
    kid = key.thumbprint()
    return ReceiptKey.objects.create(
        kid=kid,
        private_sealed=sealed.seal(key.as_pem(private=True).decode()),
        public_jwk={**public, "kid": kid, "alg": ALGORITHM, "use": "sig"},
    )


# A new key is published this long before it signs: a verifier that keeps the key set as long
# as /.well-known/jwks.json's Cache-Control says has it before the first receipt it signs.
PUBLISHED_AHEAD = timedelta(seconds=JWKS_MAX_AGE)


def signing_key() -> ReceiptKey:
    """The key receipts are signed with now (made at first use): the newest in force that has
    been published PUBLISHED_AHEAD; the newest in force, while none has."""
    now = timezone.now()
    in_force = list(
        ReceiptKey.objects.filter(revoked_at=None).filter(Q(retired_at=None) | Q(retired_at__gt=now))[:10]
    )
    for key in in_force:
        if key.created_at <= now - PUBLISHED_AHEAD:
            return key
    return in_force[0] if in_force else _new_key()


def rotate() -> ReceiptKey:
    """A new signing key, published now and signing PUBLISHED_AHEAD from now; the keys before
    it retire then (and stay published until the receipts they signed expire)."""
    with transaction.atomic():
        key = _new_key()
        ReceiptKey.objects.filter(retired_at=None, revoked_at=None).exclude(pk=key.pk).update(
            retired_at=timezone.now() + PUBLISHED_AHEAD
        )
    return key


def revoke(kid: str) -> bool:
    """Withdraw a key at once (it may have leaked): receipts it signed no longer verify."""
    return bool(
        ReceiptKey.objects.filter(kid=kid, revoked_at=None).update(
            revoked_at=timezone.now(), retired_at=timezone.now()
        )
    )


def jwks() -> dict[str, Any]:
    """The public keys receipts are checked with (a JWK Set, RFC 7517)."""
    keys = [key.public_jwk for key in ReceiptKey.objects.filter(revoked_at=None) if key.published]
    if not keys:
        keys = [signing_key().public_jwk]
    return {"keys": keys}


@functools.lru_cache(maxsize=16)
def _private(kid: str, sealed_pem: str) -> OKPKey:
    return OKPKey.import_key(sealed.unseal(sealed_pem))


def call_id(run_id: int, seq: int, binding: dict[str, Any]) -> str:
    """The receipt's id: its call, one per pause of a run."""
    digest = hashlib.sha256(_canonical({"run": run_id, "seq": seq, "call": binding}).encode()).hexdigest()
    return f"{run_id}.{seq}.{digest[:16]}"


def approved_by(interrupt: Interrupt) -> list[dict[str, Any]]:
    """Who approved it: each of the counted approvals of one that needed several, else the one
    decider (a person, a rule, a grant, a deadline's default)."""
    if interrupt.approvals_required > 1:
        counted = interrupt.approvals.filter(superseded_at=None).select_related("user").order_by("at", "pk")
        return [{"name": approval.user.get_username(), "at": approval.at.isoformat()} for approval in counted]
    at = interrupt.decided_at.isoformat() if interrupt.decided_at else None
    return [{"name": interrupt.decided_by_name, "at": at}]


def arguments_of(interrupt: Interrupt, run: Run) -> Any:
    """What the approved call runs with: the reviewer's edit, where they edited it."""
    if interrupt.edited_arguments is not None:
        return interrupt.edited_arguments
    return call_input(run, interrupt.arguments)


def audience(run: Run) -> str:
    """Whom a receipt is for: the upstream MCP server a gateway call goes to (its URL as
    registered), else the team's page on this site."""
    if run.consumer == Run.Consumer.GATEWAY:
        call = GatewayCall.objects.filter(run_id=run.pk).select_related("upstream").first()
        if call is not None and call.upstream is not None:
            return call.upstream.url
    return f"{settings.GRUNDLAG_BASE_URL.rstrip('/')}/teams/{run.team.slug}/"


def claims(interrupt: Interrupt, run: Run) -> dict[str, Any]:
    assert interrupt.decided_at is not None
    decided = int(interrupt.decided_at.timestamp())
    return {
        "iss": settings.GRUNDLAG_BASE_URL.rstrip("/"),
        "jti": call_id(run.pk, interrupt.seq, interrupt.binding or {}),
        "iat": decided,
        "exp": decided + settings.GRUNDLAG_RECEIPT_SECONDS,
        # Whom it approves for: the team whose call it is (a rule may have routed the decision
        # to another), and where the call goes: a gateway upstream's URL, else the team's page.
        # A tool checks ``aud``: a receipt made for another team's server is not one for it.
        "aud": audience(run),
        "team": run.team.slug,
        "action": interrupt.action,
        "run": run.pk,
        "interrupt": interrupt.pk,
        "arguments_sha256": arguments_sha256(arguments_of(interrupt, run)),
        "answer": interrupt.answer,
        "approved_by": approved_by(interrupt),
        "decided_via": interrupt.decided_via,
    }


def receipt_for(interrupt: Interrupt, run: Run | None = None) -> str | None:
    """The interrupt's receipt (a compact JWS), or None: only an approval has one."""
    if interrupt.status != Interrupt.Status.APPROVED or interrupt.decided_at is None:
        return None
    run = run if run is not None else interrupt.run
    key = signing_key()
    header = {"alg": ALGORITHM, "kid": key.kid, "typ": TYPE}
    payload = _canonical(claims(interrupt, run)).encode()
    return jws.serialize_compact(
        header, payload, _private(key.kid, key.private_sealed), algorithms=[ALGORITHM]
    )
