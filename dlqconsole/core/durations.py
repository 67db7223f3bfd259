"""Durations as people write them: 90s, 5m, 1h30m, 2 days (a bare number is seconds), and back.

Used by the alert rule form and by every time filter that takes an age ("since 30m").
"""

from __future__ import annotations

import re

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
DURATION_FORMAT = re.compile(r"(?:\s*\d{1,9}\s*[a-z]*\s*)+")
DURATION_PART = re.compile(r"(\d+)\s*([a-z]*)")


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
