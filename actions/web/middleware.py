from __future__ import annotations

import logging
from collections.abc import Callable

from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse

logger = logging.getLogger(__name__)

UNAVAILABLE = "The database is unavailable right now. Nothing was changed; please try again in a moment."


class DatabaseUnavailableMiddleware:
    """Turn a lost database connection into a clear 503 instead of a 500 page.

    Every state change is one transaction, so a failure leaves nothing half-written: saying
    "nothing was changed" is true. The page is plain HTML: rendering the site's templates
    would need the database (the session, the user)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, (OperationalError, InterfaceError)):
            return None
        logger.warning("database unavailable during %s %s: %s", request.method, request.path, exception)
        if request.headers.get("HX-Request"):
            return HttpResponse(UNAVAILABLE, status=503, content_type="text/plain")
        body = f"<!doctype html><title>Unavailable</title><h1>503</h1><p>{UNAVAILABLE}</p>"
        return HttpResponse(body, status=503)


class RequestSizeLimitMiddleware:
    """Refuse a request body over the limit with 413 naming the limit, before it is read.
    (Without this, Django answers a plain 400 page when the view reads the body.)"""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        if limit is not None and length > limit:
            detail = f"the request body is {length} bytes; the limit is {limit} bytes"
            if request.path.startswith("/api/"):
                return JsonResponse({"detail": detail}, status=413)
            return HttpResponse(detail, status=413, content_type="text/plain")
        return self.get_response(request)


class ApiJsonErrorsMiddleware:
    """Every error under /api/ is JSON with a "detail", whoever produced it: ninja's own 405,
    Django's 404 for an unknown path, a CSRF or size refusal."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if (
            request.path.startswith("/api/")
            and response.status_code >= 400
            and not response.get("Content-Type", "").startswith("application/json")
        ):
            detail = response.content.decode(errors="replace").strip() if len(response.content) < 200 else ""
            json_response = JsonResponse(
                {"detail": detail or response.reason_phrase}, status=response.status_code
            )
            for header in ("Allow", "WWW-Authenticate"):
                if header in response:
                    json_response[header] = response[header]
            return json_response
        return response
