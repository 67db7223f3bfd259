"""The alerts app's domain errors: each message says why the change cannot be made, for the page to show."""

from __future__ import annotations


class AlertError(Exception):
    """A change to alerts, rules or channels that cannot be made; the message says why."""


class ChannelError(Exception):
    """A channel action that cannot be done now; the message says why."""
