"""The registry of notifier kinds. It also feeds Channel.kind's choices: a new kind is one module and one line.

Modelled on healthchecks' TRANSPORTS: each kind is a Notifier subclass with send(), raising NotifierError.
"""

from __future__ import annotations

from dlqconsole.alerts.notifiers.base import Notifier, NotifierError
from dlqconsole.alerts.notifiers.email import EmailNotifier
from dlqconsole.alerts.notifiers.slack import SlackNotifier
from dlqconsole.alerts.notifiers.webhook import WebhookNotifier

NOTIFIERS: dict[str, type[Notifier]] = {
    "email": EmailNotifier,
    "webhook": WebhookNotifier,
    "slack": SlackNotifier,
}


def notifier_choices() -> list[tuple[str, str]]:
    return [(kind, notifier.label) for kind, notifier in NOTIFIERS.items()]


__all__ = ["NOTIFIERS", "Notifier", "NotifierError", "notifier_choices"]
