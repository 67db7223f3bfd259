"""Filters for notification text and the alerts pages."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

from django import template
from django.utils.dateparse import parse_datetime

from dlqconsole.alerts.failures import summarise_failure

if TYPE_CHECKING:
    from dlqconsole.alerts.models import Notification

register = template.Library()


@register.filter
def slack_escape(value: object) -> str:
    """Slack markup treats &, < and > as control characters (links, mentions); these are its escapes."""
    return str(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


@register.filter
def as_datetime(value: object) -> dt.datetime | None:
    """An ISO timestamp from a notification's frozen context back into a datetime for |date."""
    if isinstance(value, dt.datetime):
        return value
    return parse_datetime(value) if isinstance(value, str) and value else None


@register.filter
def duration(seconds: object) -> str:
    """Seconds as a short human duration: 45 s, 5 min, 2 h, 3 d."""
    try:
        total = int(float(str(seconds)))
    except ValueError:
        return ""
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if total >= size and total % size == 0:
            return f"{total // size} {unit}"
    return f"{total} s"


@register.filter
def failure_summary(notification: Notification) -> str:
    """A failed send's error said for people (the raw text stays on the row)."""
    channel = notification.channel
    return summarise_failure(notification.error, kind=channel.kind, target=channel.target)
