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
    """Slack markup treats &, < and > as control characters (links, mentions); these are its escapes. The
    Slack-compatible servers (Mattermost, Rocket.Chat) also turn a plain @channel, @here, @all or @name into a
    mention: a zero-width space after every @ keeps text from a dead letter from paging a whole team."""
    return str(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("@", "@\u200b")


@register.filter
def one_line(value: object) -> str:
    """Text on one line: a notice in a digest is one line, whatever its summary holds."""
    return " ".join(str(value).split())


# How a digest names its counts: "9 firing, 2 reminders, 3 resolved".
COUNT_WORDS = (
    ("firing", "firing", "firing"),
    ("reminder", "reminder", "reminders"),
    ("resolved", "resolved", "resolved"),
)


@register.filter
def notice_counts(counts: object) -> str:
    """A digest's counts by kind in words, in a fixed order (a JSON object's keys may come back in any order)."""
    if not isinstance(counts, dict):
        return ""
    parts = []
    for kind, one, many in COUNT_WORDS:
        number = counts.get(kind) or 0
        if number:
            parts.append(f"{number} {one if number == 1 else many}")
    return ", ".join(parts)


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
