"""Broker credentials at rest: encrypted with DLQ_CREDENTIALS_KEY (Fernet: AES-128-CBC and HMAC-SHA256).

The key is any text, stretched with SHA-256 to a Fernet key. Several keys, comma-separated: the first encrypts,
every one decrypts, so a key is rotated by putting the new one first and re-saving (`rotate`)."""

from __future__ import annotations

import base64
import hashlib

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings


class CredentialsError(Exception):
    """A credential cannot be stored or read; the message says why and what to set."""


def _keys() -> list[str]:
    return [key.strip() for key in settings.DLQ_CREDENTIALS_KEY.split(",") if key.strip()]


def _fernet() -> MultiFernet:
    keys = _keys()
    if not keys:
        raise CredentialsError(
            "DLQ_CREDENTIALS_KEY is not set: a broker's credentials are stored encrypted with it. Set it (any long "
            "random text) in the environment of every console process, or name the broker in DLQ_BROKERS instead."
        )
    return MultiFernet([Fernet(base64.urlsafe_b64encode(hashlib.sha256(key.encode()).digest())) for key in keys])


def available() -> bool:
    return bool(_keys())


def encrypt(text: str) -> str:
    return _fernet().encrypt(text.encode()).decode("ascii")


def decrypt(token: str) -> str:
    try:
        return _fernet().decrypt(token.encode("ascii")).decode()
    except (InvalidToken, ValueError):
        raise CredentialsError(
            "a broker's stored credentials do not decrypt with DLQ_CREDENTIALS_KEY (was the key changed? put the "
            "old key after the new one, comma-separated)"
        ) from None


def rotate(token: str) -> str:
    """The same secret encrypted with the first key."""
    return _fernet().rotate(token.encode("ascii")).decode("ascii")
