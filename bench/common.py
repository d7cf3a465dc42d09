"""What every benchmark shares: production settings (DEBUG off records no queries), on loopback."""

from __future__ import annotations

PRODUCTION_ENV = {
    "DEBUG": "false",
    "SECRET_KEY": "benchmark-only-secret-key-not-for-any-deployment-0123456789",
    # Plain HTTP on 127.0.0.1: cookies must not demand HTTPS here.
    "SECURE_COOKIES": "false",
}
