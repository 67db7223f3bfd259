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
# Path segments after which webhook services put the secret (Slack's /services/T…/B…/<secret>, Mattermost's
# /hooks/<key>, Rocket.Chat's /hooks/<id>/<token>, Discord's /api/webhooks/<id>/<token>): the last one is masked.
HOOK_KEYWORDS = ("services", "hooks", "webhooks", "webhook", "hook")
# A path segment or user name that reads as a key: long, of key characters, with a digit or very long.
TOKEN = re.compile(r"^[A-Za-z0-9_\-.=~+%]{20,}$")


def _looks_secret(segment: str) -> bool:
    return bool(TOKEN.match(segment)) and (any(char.isdigit() for char in segment) or len(segment) >= 32)


class WebhookNotifier(Notifier):
    kind = "webhook"
    label = "Webhook (JSON)"
    target_label = "URL"
    target_help = "Receives a POST with a JSON object: event, alert, rule, severity, subject, summary, text, url."

    @classmethod
    def clean_target(cls, target: str) -> str:
        url = super().clean_target(target)
        URLValidator(schemes=["http", "https"], message="Enter an http(s) URL.")(url)
        # A host name is checked on what it resolves to when a notification is sent (core/http.py).
        address = literal_address(urlsplit(url).hostname or "")
        reason = refusal(address) if address is not None else None
        if reason is not None:
            raise ValidationError(f"Not allowed: {reason}.")
        return url

    @classmethod
    def display_target(cls, target: str) -> str:
        """The URL with its secrets masked, so two channels can be told apart without showing how to post to
        them: the password (or a token-like user name) before the host, every query value, the fragment, and
        secret path segments: the one after a Slack-style `/services/T…/B…/`, the last one after `hooks` or
        `webhooks` (Mattermost, Rocket.Chat, Discord, most receivers), and any segment that looks like a token."""
        parts = urlsplit(target)
        if not parts.scheme or not parts.hostname:
            return MASK
        host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
        netloc = f"{host}:{parts.port}" if parts.port else host
        if parts.username is not None or parts.password is not None:
            user = parts.username or ""
            shown_user = MASK if not user or _looks_secret(user) or parts.password is None else user
            netloc = f"{shown_user}:{MASK}@{netloc}" if parts.password is not None else f"{MASK}@{netloc}"
        segments = parts.path.split("/")
        lowered = [segment.lower() for segment in segments]
        masked = [MASK if _looks_secret(segment) else segment for segment in segments]
        for keyword in HOOK_KEYWORDS:
            if keyword in lowered[:-1]:
                after = lowered.index(keyword) + 1
                if any(segments[after:]):
                    last = max(index for index in range(after, len(segments)) if segments[index])
                    masked[last] = MASK
                break
        path = "/".join(masked)
        query = "&".join(
            f"{MASK if _looks_secret(key) else key}={MASK}" for key, _ in parse_qsl(parts.query, keep_blank_values=True)
        )
        shown = f"{parts.scheme}://{netloc}{path}"
        if parts.query:
            shown += f"?{query}" if query else f"?{MASK}"
        if parts.fragment:
            shown += f"#{MASK}"
        return shown

    def send(self, notification: Notification) -> None:
        self.post(self.channel.target, payload={**notification.context, "text": self.render(notification)})
