"""Showing a channel's signing secret once: after the channel is made or its secret rotated, on the console's pages
or in the admin, the session remembers which channel's page shows the secret on its next full load. The views and
the admin both call this; the admin's own pages never show the secret.
"""

from __future__ import annotations

import hashlib

from django.http import HttpRequest

from dlqconsole.alerts.models import Channel

# The session entry naming the channel whose page shows its signing secret on its next full load, once.
REVEAL_SECRET_KEY = "alerts.reveal-signing-secret"


def reveal_signing_secret(request: HttpRequest, channel: Channel) -> None:
    """Have the next full load of the channel's page show its signing secret, once (after the channel is made or
    its secret rotated, on the console's pages or in the admin). The session holds the channel and a digest of the
    secret, never the secret itself, and the page shows the secret only while it is still that one."""
    request.session[REVEAL_SECRET_KEY] = {"channel": channel.pk, "digest": _secret_digest(channel.signing_secret)}


def revealed_secret(request: HttpRequest, channel: Channel) -> str:
    """The secret to show on this load of the channel's page, or "" (and never again after it is shown)."""
    reveal = request.session.get(REVEAL_SECRET_KEY)
    if not isinstance(reveal, dict) or reveal.get("channel") != channel.pk:
        return ""
    del request.session[REVEAL_SECRET_KEY]
    return channel.signing_secret if reveal.get("digest") == _secret_digest(channel.signing_secret) else ""


def _secret_digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()
