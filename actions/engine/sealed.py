"""Secrets kept in the database sealed (an upstream MCP server's credentials, the receipts'
private keys): Fernet (AES-128-CBC with HMAC-SHA256, from ``cryptography``), with a key derived
from SECRET_KEY by HKDF. SECRET_KEY_FALLBACKS still open what older keys sealed, so rotating
SECRET_KEY the way Django documents keeps them readable (re-register an upstream's credentials,
and rotate the receipts' key, before dropping the old key from the fallbacks)."""

from __future__ import annotations

import base64
import functools

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings


class Unreadable(Exception):  # noqa: N818 - what the value is
    """Sealed under a key the site no longer has (SECRET_KEY changed without a fallback)."""


def _fernet(secret: str) -> Fernet:
    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=b"grundlag.sealed", info=b"fernet").derive(
        secret.encode()
    )
    return Fernet(base64.urlsafe_b64encode(derived))


@functools.cache
def _keys(secret: str, fallbacks: tuple[str, ...]) -> MultiFernet:
    return MultiFernet([_fernet(secret), *(_fernet(old) for old in fallbacks)])


def _current() -> MultiFernet:
    return _keys(settings.SECRET_KEY, tuple(getattr(settings, "SECRET_KEY_FALLBACKS", ())))


def seal(text: str) -> str:
    return _current().encrypt(text.encode()).decode()


def unseal(token: str) -> str:
    try:
        return _current().decrypt(token.encode()).decode()
    except InvalidToken:
        raise Unreadable(
            "sealed under a key this site no longer has: put the old SECRET_KEY in SECRET_KEY_FALLBACKS"
        ) from None
