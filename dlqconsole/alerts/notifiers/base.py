"""The Notifier contract: one subclass per channel kind, registered in notifiers/__init__.py."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, ClassVar

from django.core.exceptions import ValidationError
from django.template.loader import render_to_string
from django.utils import timezone

from dlqconsole.alerts.signing import signature_headers
from dlqconsole.core.http import HttpError, post_json

if TYPE_CHECKING:
    from dlqconsole.alerts.models import Channel, Notification


class NotifierError(Exception):
    """A send that failed. `permanent` means trying again cannot help (bad address, receiver gone)."""

    def __init__(self, message: str, permanent: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.permanent = permanent


class Notifier:
    kind: ClassVar[str]
    label: ClassVar[str]
    target_label: ClassVar[str] = "Target"
    target_help: ClassVar[str] = ""
    # Whether what it posts carries the channel's signature (signing.py); the channel pages offer its secret then.
    signed: ClassVar[bool] = False

    def __init__(self, channel: Channel) -> None:
        self.channel = channel

    @classmethod
    def clean_target(cls, target: str) -> str:
        """Validate and normalise what an admin typed as the target; raise ValidationError when it is wrong."""
        if not target.strip():
            raise ValidationError("Required.")
        return target.strip()

    @classmethod
    def display_target(cls, target: str) -> str:
        return target

    def send(self, notification: Notification) -> None:
        """Deliver one notification or raise NotifierError."""
        raise NotImplementedError

    def render(self, notification: Notification, *, suffix: str = "txt") -> str:
        """The message text, from templates/alerts/notifications/<kind>.<suffix>."""
        return render_to_string(
            f"alerts/notifications/{self.kind}.{suffix}", {"n": notification.context, "kind": notification.kind}
        ).strip()

    def post(self, url: str, *, payload: Any, notification: Notification) -> None:
        """POST `payload` as JSON, signed with the channel's secrets when the kind is signed."""

        def sign(body: bytes) -> dict[str, str]:
            # Called just before the body goes out: its timestamp is the send time, on a retry too.
            return signature_headers(
                signing_secrets=self.channel.signing_secrets(timezone.now()),
                message_id=notification.message_id,
                timestamp=int(time.time()),
                body=body,
            )

        try:
            post_json(url, payload=payload, sign=sign if self.signed else None)
        except HttpError as error:
            raise NotifierError(error.message, permanent=error.permanent) from None
