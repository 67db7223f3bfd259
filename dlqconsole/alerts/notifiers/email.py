"""E-mail through Django's mail settings (EMAIL_BACKEND, EMAIL_HOST, ...)."""

from __future__ import annotations

import smtplib
from typing import TYPE_CHECKING

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.mail import send_mail
from django.core.validators import validate_email

from dlqconsole.alerts.notifiers.base import Notifier, NotifierError

if TYPE_CHECKING:
    from dlqconsole.alerts.models import Notification


class EmailNotifier(Notifier):
    kind = "email"
    label = "E-mail"
    target_label = "Addresses"
    target_help = "One or more addresses, separated by commas."

    @classmethod
    def clean_target(cls, target: str) -> str:
        addresses = cls.addresses(super().clean_target(target))
        if not addresses:
            raise ValidationError("Enter at least one address.")
        for address in addresses:
            validate_email(address)
        return ", ".join(addresses)

    @staticmethod
    def addresses(target: str) -> list[str]:
        return [part.strip() for part in target.replace(";", ",").split(",") if part.strip()]

    def send(self, notification: Notification) -> None:
        subject = " ".join(self.render(notification, suffix="subject.txt").split())
        try:
            send_mail(
                subject[:200],
                self.render(notification),
                settings.DEFAULT_FROM_EMAIL,
                self.addresses(self.channel.target),
                fail_silently=False,
            )
        except smtplib.SMTPRecipientsRefused as error:
            raise NotifierError(f"Recipients refused: {error.recipients}", permanent=True) from None
        except (smtplib.SMTPException, OSError) as error:
            raise NotifierError(f"Mail not sent: {type(error).__name__}: {error}"[:500]) from None
