"""Errors: always JSON with a ``detail``, one status code per refusal."""

from __future__ import annotations

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse
from ninja import NinjaAPI
from ninja.errors import AuthenticationError

from actions import engine
from actions.api.base import MissingScope
from actions.core import UnknownAction
from actions.drivers.agent import ModelError
from actions.drivers.sandbox import SandboxUnavailable


def register(api: NinjaAPI) -> None:
    """Map what the engine and the drivers refuse to JSON responses with a ``detail``."""

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

    @api.exception_handler(engine.idempotency.KeyInUse)
    def key_in_use(request: HttpRequest, exc: engine.idempotency.KeyInUse) -> HttpResponse:
        response = api.create_response(request, {"detail": str(exc)}, status=409)
        response["Retry-After"] = "1"
        return response

    @api.exception_handler(MissingScope)
    def missing_scope(request: HttpRequest, exc: MissingScope) -> HttpResponse:
        return api.create_response(
            request, {"detail": str(exc), "missing_scope": list(exc.scopes)}, status=403
        )

    @api.exception_handler(AuthenticationError)
    def not_authenticated(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
        detail = (
            "Send a token in force as `Authorization: Bearer <token>`:"
            " this request's is missing, unknown, revoked or expired."
        )
        response = api.create_response(request, {"detail": detail}, status=401)
        response["WWW-Authenticate"] = 'Bearer error="invalid_token"'
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
        return api.create_response(request, {"detail": engine.DATABASE_UNAVAILABLE}, status=503)

    @api.exception_handler(ModelError)
    def model_error(request: HttpRequest, exc: ModelError) -> HttpResponse:
        return api.create_response(request, {"detail": str(exc)}, status=422)

    @api.exception_handler(UnknownAction)
    def unknown_action(request: HttpRequest, exc: UnknownAction) -> HttpResponse:
        return api.create_response(request, {"detail": str(exc)}, status=404)
