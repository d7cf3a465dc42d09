"""The public keys approval receipts are checked with (actions.engine.receipts)."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_safe

from actions import engine


@require_safe
def jwks(request: HttpRequest) -> JsonResponse:
    """/.well-known/jwks.json: a JWK Set (RFC 7517) of the keys receipts are signed with, for any
    tool to fetch (no sign-in; a browser page of another origin too)."""
    response = JsonResponse(engine.receipts.jwks())
    response["Cache-Control"] = f"public, max-age={engine.receipts.JWKS_MAX_AGE}"
    response["Access-Control-Allow-Origin"] = "*"
    response["Content-Type"] = "application/jwk-set+json"
    return response
