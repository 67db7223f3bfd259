"""Signatures on webhook and Slack-compatible notifications, in the Standard Webhooks format (standardwebhooks.com).

Every request carries three headers: `webhook-id` (the notification's id, the same on every attempt, so a
receiver can drop a repeat), `webhook-timestamp` (the send time, whole seconds since the epoch) and
`webhook-signature` (`v1,` and the base64 of an HMAC-SHA256 over "{id}.{timestamp}.{body}"). Just after a
rotation the header holds two signatures, separated by a space: one with the new secret and one with the old, so a
receiver keeps verifying while it is switched over. Secrets are written `whsec_` and the base64 of the key, as the
specification's libraries read them. docs/webhooks.md tells receivers how to verify.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Iterable

SECRET_PREFIX = "whsec_"
# The specification asks for keys of 24 to 64 bytes; 32 is SHA-256's own output size.
SECRET_BYTES = 32


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode("ascii")


def signature(secret: str, *, message_id: str, timestamp: int, body: bytes) -> str:
    """One `v1,<base64>` signature of `body` sent as `message_id` at `timestamp`."""
    key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
    signed = f"{message_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode("ascii")


def signature_headers(
    *, signing_secrets: Iterable[str], message_id: str, timestamp: int, body: bytes
) -> dict[str, str]:
    """The three Standard Webhooks headers for `body`, with one signature per secret."""
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(
            signature(secret, message_id=message_id, timestamp=timestamp, body=body) for secret in signing_secrets
        ),
    }
