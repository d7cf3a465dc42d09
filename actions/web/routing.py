from __future__ import annotations

from django.urls import path

from actions.web.consumers import InboxConsumer

websocket_urlpatterns = [path("ws/inbox/", InboxConsumer.as_asgi())]
