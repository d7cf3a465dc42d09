from __future__ import annotations

import gc
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "grundlag_site.settings")
# Build the HTTP app first: it sets Django up before the consumers' imports touch models.
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import OriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402

from actions import mcp  # noqa: E402
from actions.live import waiting  # noqa: E402
from actions.web.health import answering_liveness  # noqa: E402
from actions.web.middleware import BodyLimit, RequestThreads, TokenConcurrency, cap_daphne_bodies  # noqa: E402
from actions.web.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        # /mcp/: agent hosts call the team's actions as MCP tools (actions.mcp); the rest is Django.
        # Every body is capped before either reads it (Django's handler would read it whole).
        # One token's requests under way at once are capped before anything runs; /healthz is
        # answered before even that.
        # Each request's synchronous part runs on a thread kept from the requests before it.
        "http": answering_liveness(TokenConcurrency(BodyLimit(mcp.mount(RequestThreads(django_asgi_app))))),
        # The pages that may open it are those that may call /mcp/ (which checks them itself).
        "websocket": OriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns)), settings.GRUNDLAG_ALLOWED_ORIGINS
        ),
    }
)

# Daphne keeps no body over the cap either: refused as it arrives.
cap_daphne_bodies(settings.DATA_UPLOAD_MAX_MEMORY_SIZE)

# On PostgreSQL, listen for the runs' changes from the start (`Prefer: wait` wakes on them).
waiting.listen()

# What is loaded by now lives as long as the process: out of the collector's sight, so that a
# full collection walks what requests left behind, not the whole app again (50 to 70 ms each
# time, every request and step of the process stopped meanwhile).
gc.collect()
gc.freeze()
