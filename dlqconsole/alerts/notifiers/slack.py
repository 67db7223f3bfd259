"""A Slack-compatible incoming webhook (Slack, Mattermost, Rocket.Chat): {"text": ...} in Slack's markup."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dlqconsole.alerts.notifiers.webhook import WebhookNotifier

if TYPE_CHECKING:
    from dlqconsole.alerts.models import Notification


class SlackNotifier(WebhookNotifier):
    kind = "slack"
    label = "Slack-compatible webhook"
    target_label = "Incoming webhook URL"
    target_help = 'Slack, Mattermost or Rocket.Chat incoming webhook; receives {"text": ...}.'

    def send(self, notification: Notification) -> None:
        self.post(self.channel.target, payload={"text": self.render(notification)}, notification=notification)
