"""The HTTP API: start runs, read them, answer their interrupts. OpenAPI at /api/openapi.json.

Every endpoint is scoped to the team of the bearer token: another team's ids are 404, as if
they did not exist. ``state`` appears in no response.
"""

from __future__ import annotations

import re
from typing import Any

from django.http import HttpRequest, JsonResponse

from actions.api import agents, approvals, errors, gateway, runs, webhooks
from actions.api.base import Api, TokenAuth
from actions.live import waiting

api = Api(
    title="Grundlag approvals",
    version="1.0",
    description="Start actions, read their runs, and answer the interrupts they pause on.",
    auth=TokenAuth(),
    # Per token: settings.GRUNDLAG_API_RATE, 429 with Retry-After past it (as the MCP endpoint).
    throttle=waiting.TokenRateThrottle(),
    urls_namespace="api",
)
errors.register(api)
# One router per resource; the paths are the routers' own.
for resource in (runs, agents, approvals, webhooks, gateway):
    api.add_router("", resource.router)


class KnownQueryParameters:
    """Django middleware, for /api/: a query parameter the operation does not take is refused
    with 422 naming it (``?statuss=pending`` would otherwise list everything), as a body field
    it does not take is. What each operation takes is read from the API's OpenAPI document,
    so the two cannot differ."""

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response
        self.taken: list[tuple[str, re.Pattern[str], frozenset[str]]] | None = None

    def __call__(self, request: HttpRequest) -> Any:
        if request.GET and request.path_info.startswith("/api/"):
            known = self.known(request.method or "", request.path_info)
            if known is not None and (unknown := sorted(set(request.GET) - known)):
                said = "not a parameter of this operation"
                errors = [{"loc": ["query", name], "msg": said, "type": "extra"} for name in unknown]
                return JsonResponse({"detail": errors}, status=422)
        return self.get_response(request)

    def known(self, method: str, path: str) -> frozenset[str] | None:
        """The query parameters the operation at ``path`` takes; None when it is not one."""
        if self.taken is None:
            taken = []
            # Its paths as Django routes them (path_info), whatever prefix the site is served under.
            for template, operations in api.get_openapi_schema(path_prefix="/api/")["paths"].items():
                pattern = re.compile("^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template)) + "$")
                for verb, operation in operations.items():
                    query = [p["name"] for p in operation.get("parameters", []) if p.get("in") == "query"]
                    taken.append((verb.upper(), pattern, frozenset(query)))
            self.taken = taken
        for verb, pattern, known in self.taken:
            if verb == method and pattern.match(path):
                return known
        return None
