"""A generic JSON webhook: POSTs the notification's facts and a readable text to a URL."""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from django.core.exceptions import ValidationError
from django.core.validators import URLValidator

from dlqconsole.alerts.notifiers.base import Notifier
from dlqconsole.core.http import literal_address, refusal

if TYPE_CHECKING:
    from dlqconsole.alerts.models import Notification


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
        # Paths and queries of webhook URLs are often secrets; show where it goes, not how to get in.
        parts = urlsplit(target)
        return f"{parts.scheme}://{parts.hostname or ''}{':' + str(parts.port) if parts.port else ''}/…"

    def send(self, notification: Notification) -> None:
        self.post(self.channel.target, payload={**notification.context, "text": self.render(notification)})
