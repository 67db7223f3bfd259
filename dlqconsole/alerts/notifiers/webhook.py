"""A generic JSON webhook: POSTs the notification's facts and a readable text to a URL."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlsplit

from django.core.exceptions import ValidationError
from django.core.validators import URLValidator

from dlqconsole.alerts.notifiers.base import Notifier
from dlqconsole.core.http import literal_address, refusal

if TYPE_CHECKING:
    from dlqconsole.alerts.models import Notification

# Shown in place of a secret part of a target.
MASK = "••••"
# A user name that reads as a key: long, of key characters, with a digit or very long.
TOKEN = re.compile(r"^[A-Za-z0-9_\-.=~+%]{20,}$")


def _looks_secret(segment: str) -> bool:
    return bool(TOKEN.match(segment)) and (any(char.isdigit() for char in segment) or len(segment) >= 32)


def _without_parameters(segment: str) -> str:
    """A path segment's name, its ;parameters' values masked (`notify;token=••••`)."""
    name, *parameters = segment.split(";")
    if _looks_secret(name):
        name = MASK
    return ";".join([name, *(f"{parameter.partition('=')[0]}={MASK}" for parameter in parameters)])


class WebhookNotifier(Notifier):
    kind = "webhook"
    label = "Webhook (JSON)"
    target_label = "URL"
    target_help = (
        "Receives a POST with a JSON object: event, alert, rule, severity, subject, summary, text, url; "
        "signed with the channel's secret (Standard Webhooks)."
    )
    signed = True

    @classmethod
    def clean_target(cls, target: str) -> str:
        url = super().clean_target(target)
        if len(url) > URLValidator.max_length:
            raise ValidationError(f"The URL is {len(url):,} characters long; at most {URLValidator.max_length:,}.")
        URLValidator(schemes=["http", "https"], message="Enter an http(s) URL.")(url)
        # A host name is checked on what it resolves to when a notification is sent (core/http.py).
        address = literal_address(urlsplit(url).hostname or "")
        reason = refusal(address) if address is not None else None
        if reason is not None:
            raise ValidationError(f"Not allowed: {reason}.")
        return url

    @classmethod
    def display_target(cls, target: str) -> str:
        """The URL with everything that may be the secret to post to it masked, for the channel pages (admins
        only): the user part's password (and a token-like user name), every path segment past the first (the
        last one whenever there is only one: ntfy's topic, a receiver's key), parameters' and query values, the
        fragment. Whatever a receiver names its secret, it is never shown; what is left (scheme, host, port,
        first segment, query keys) and the channel's name tell channels apart."""
        parts = urlsplit(target)
        if not parts.scheme or not parts.hostname:
            return MASK
        host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
        try:
            netloc = f"{host}:{parts.port}" if parts.port else host
        except ValueError:  # a port that is not a number
            netloc = f"{host}:{MASK}"
        if parts.username is not None or parts.password is not None:
            user = parts.username or ""
            shown_user = MASK if not user or _looks_secret(user) or parts.password is None else user
            netloc = f"{shown_user}:{MASK}@{netloc}" if parts.password is not None else f"{MASK}@{netloc}"
        segments = [segment for segment in parts.path.split("/") if segment]
        if not segments:
            path = parts.path
        elif len(segments) == 1:
            path = f"/{MASK}"
        else:
            path = f"/{_without_parameters(segments[0])}/{MASK}"
        query = "&".join(
            f"{MASK if _looks_secret(key) else key}={MASK}" for key, _ in parse_qsl(parts.query, keep_blank_values=True)
        )
        shown = f"{parts.scheme}://{netloc}{path}"
        if parts.query:
            shown += f"?{query}" if query else f"?{MASK}"
        if parts.fragment:
            shown += f"#{MASK}"
        return shown

    @classmethod
    def audit_target(cls, target: str) -> str:
        """What an audit row says of the URL: its scheme and host only (viewers read the audit log, and the
        secret may be anywhere in the rest)."""
        parts = urlsplit(target)
        if not parts.scheme or not parts.hostname:
            return MASK
        host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
        return f"{parts.scheme}://{host}/…"

    def send(self, notification: Notification) -> None:
        self.post(
            self.channel.target,
            payload={**notification.context, "text": self.render(notification)},
            notification=notification,
        )
