"""What every channel shares: the failure a transport reports, and the site's own links."""

from __future__ import annotations

from django.conf import settings


class DeliveryFailed(Exception):
    """A channel could not deliver; the attempt is recorded with this and tried again later."""

    def __init__(self, error: str, status_code: int | None = None) -> None:
        super().__init__(error)
        self.status_code = status_code


def absolute(path: str) -> str:
    """A path of this site as a link from outside it (GRUNDLAG_BASE_URL)."""
    return settings.GRUNDLAG_BASE_URL.rstrip("/") + path
