"""Durations as people write them: 90s, 5m, 1h30m, 2 days (a bare number is seconds), and back.

Used by the alert rule form and by every time filter that takes an age ("since 30m"), through parse_moment.
"""

from __future__ import annotations

import datetime as dt
import re

from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

DURATION_UNITS = {
    "": 1,
    "s": 1,
    "sec": 1,
    "secs": 1,
    "second": 1,
    "seconds": 1,
    "m": 60,
    "min": 60,
    "mins": 60,
    "minute": 60,
    "minutes": 60,
    "h": 3600,
    "hr": 3600,
    "hrs": 3600,
    "hour": 3600,
    "hours": 3600,
    "d": 86400,
    "day": 86400,
    "days": 86400,
    "w": 604800,
    "week": 604800,
    "weeks": 604800,
}
# Digits, each run with an optional unit, spaces anywhere between. Every part is taken whole and never given back
# (possessive), so a text that is no duration is refused at once: with plain quantifiers a run of forty digits
# followed by something unreadable ("1111…1a b") was cut into parts every possible way first, for days.
DURATION_FORMAT = re.compile(r"\s*+(?:\d++\s*+[a-z]*+\s*+)++")
DURATION_PART = re.compile(r"(\d+)\s*([a-z]*)")
# An age (30m, 1h30m, 2 days) rather than a date: digits then a unit letter, no dashes or colons.
RELATIVE = re.compile(r"^\d+\s*[a-z][a-z\d\s]*$", re.IGNORECASE)


def parse_duration(text: str) -> int:
    """Seconds in `90`, `90s`, `5m`, `1h30m`, `2 days`; raise ValueError saying what is wrong."""
    cleaned = text.strip().lower()
    if not DURATION_FORMAT.fullmatch(cleaned):
        raise ValueError(f"“{text}” is not a duration: write it like 90s, 5m, 1h30m or 2d.")
    total = 0
    for amount, unit in DURATION_PART.findall(cleaned):
        if unit not in DURATION_UNITS:
            raise ValueError(f"“{unit}” is not a unit: use s, m, h, d or w.")
        total += int(amount) * DURATION_UNITS[unit]
    return total


def format_duration(seconds: int) -> str:
    """The shortest way to write a duration back: 0, 45s, 5m, 1h30m, 1d."""
    if seconds <= 0:
        return "0"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return "".join(parts)


def parse_moment(value: str, *, name: str, now: dt.datetime | None = None) -> dt.datetime:
    """An ISO date or datetime, or a relative age like 15m, 2h, 1h30m, 7d (that long ago); ValueError, naming the
    field (`name`), for anything else."""
    now = now or timezone.now()
    text = value.strip()
    if RELATIVE.match(text):
        try:
            seconds = parse_duration(text)
        except ValueError:
            raise ValueError(f"{name}: {text!r} is not an age like 30m, 2h or 7d") from None
        try:
            return now - dt.timedelta(seconds=seconds)
        except OverflowError:
            raise ValueError(f"{name}: {text!r} reaches back before the year 1; try a shorter age") from None
    try:
        # Both raise ValueError for a well-formed date that does not exist (2026-13-45, 2026-02-30).
        moment = parse_datetime(text)
        if moment is None:
            day = parse_date(text)
            if day is not None:
                moment = dt.datetime.combine(day, dt.time.min)
        if moment is not None and timezone.is_naive(moment):
            moment = timezone.make_aware(moment, dt.UTC)
        if moment is not None:
            # Past the first or last day once in UTC (9999-12-31T23:00-05:00): the database cannot store it.
            moment.astimezone(dt.UTC)
    except (ValueError, OverflowError):
        moment = None
    if moment is None:
        raise ValueError(f"{name} must be an ISO date/time or an age like 30m, 2h, 7d; not {value!r}")
    return moment
