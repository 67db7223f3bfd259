"""Charts drawn on the server as small inline SVGs: no JavaScript, readable without it, cheap to poll.

Every number is formatted by us and every label goes through `escape`, so nothing from a dead letter can
become markup.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from django import template
from django.utils import timezone
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

register = template.Library()


@register.simple_tag
def sparkline(values: Sequence[int], width: int = 120, height: int = 24, label: str = "") -> SafeString:
    """A line of the values (oldest first) over a light area, scaled to the largest, with a dot on the latest
    value; an empty series draws a flat line."""
    points = list(values) or [0]
    peak = max(max(points), 1)
    pad = 3
    step = (width - 2 * pad) / max(len(points) - 1, 1)
    coordinates = [
        (pad + index * step, height - pad - (value / peak) * (height - 2 * pad)) for index, value in enumerate(points)
    ]
    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in coordinates)
    area = f"{pad:.1f},{height - pad:.1f} {line} {coordinates[-1][0]:.1f},{height - pad:.1f}"
    last_x, last_y = coordinates[-1]
    total = sum(points)
    title = escape(label or f"{total} in the last {len(points)} buckets, peak {max(points)}, latest {points[-1]}")
    return mark_safe(  # noqa: S308  (numbers formatted above, the title escaped)
        f'<svg class="spark" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{title}"><title>{title}</title>'
        f'<polygon points="{area}" fill="currentColor" fill-opacity=".12" stroke="none"/>'
        f'<polyline fill="none" stroke="currentColor" stroke-width="1.5" points="{line}"/>'
        f'<circle cx="{last_x:.1f}" cy="{last_y:.1f}" r="2" fill="currentColor"/></svg>'
    )


@register.simple_tag
def bar_chart(
    buckets: Sequence[tuple[dt.datetime, int]], width: int = 600, height: int = 120, label: str = ""
) -> SafeString:
    """Bars of (bucket start, count), with the peak and the time span written on the axes."""
    if not buckets:
        return mark_safe('<p class="muted">No data.</p>')
    counts = [count for _, count in buckets]
    peak = max(max(counts), 1)
    top, bottom = 14, 16
    plot = height - top - bottom
    slot = width / len(buckets)
    bar = max(slot - 2, 1)
    bars = []
    for index, (start, count) in enumerate(buckets):
        bar_height = 0 if count == 0 else max(1.0, count / peak * plot)
        local = timezone.localtime(start)
        tip = escape(f"{local:%Y-%m-%d %H:%M}: {count}")
        bars.append(
            f'<rect x="{index * slot + 1:.1f}" y="{top + plot - bar_height:.1f}" width="{bar:.1f}" '
            f'height="{bar_height:.1f}"><title>{tip}</title></rect>'
        )
    first = timezone.localtime(buckets[0][0])
    last = timezone.localtime(buckets[-1][0])
    first_label = f"{first:%a %H:%M}" if first.date() != last.date() else f"{first:%H:%M}"
    title = escape(label or f"{sum(counts)} in total")
    return mark_safe(  # noqa: S308  (numbers formatted above, every text escaped)
        f'<svg class="bars" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{title}"><title>{title}</title>'
        f'<text x="0" y="10" class="axis">peak {max(counts)}</text>'
        f'<line x1="0" x2="{width}" y1="{top + plot + 0.5}" y2="{top + plot + 0.5}" class="base"/>'
        f"{''.join(bars)}"
        f'<text x="0" y="{height - 3}" class="axis">{first_label}</text>'
        f'<text x="{width}" y="{height - 3}" class="axis" text-anchor="end">{last:%H:%M}</text></svg>'
    )


@register.filter
def age(moment: dt.datetime | None) -> str:
    """How long ago, compact: 42s, 7m, 3h 5m, 2d 4h."""
    if moment is None:
        return "—"
    seconds = max(int((timezone.now() - moment).total_seconds()), 0)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    if minutes:
        return f"{minutes}m"
    return f"{seconds}s"


@register.simple_tag
def percent(part: int | None, whole: int | None) -> int:
    if not whole:
        return 0
    return max(0, min(100, round((part or 0) * 100 / whole)))


@register.filter
def duration(value: dt.timedelta | None) -> str:
    """A time span, compact: 45s, 12m 5s, 3h 20m."""
    if value is None:
        return "—"
    seconds = max(int(value.total_seconds()), 0)
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes}m"
    if minutes:
        return f"{minutes}m {seconds}s"
    return f"{seconds}s"


def _local(moment: dt.datetime) -> dt.datetime:
    # A naive moment (USE_TZ is on, so only a caller's own value) is taken as UTC rather than refused.
    aware = moment if timezone.is_aware(moment) else moment.replace(tzinfo=dt.UTC)
    return timezone.localtime(aware)


def _stamp_text(local: dt.datetime) -> str:
    # %Z is the zone's abbreviation (UTC, CET, EDT); a zone without one ("+03") is shown as its offset.
    return f"{local:%Y-%m-%d %H:%M:%S} {local.strftime('%Z') or local.strftime('%z')}"


@register.filter
def stamp(moment: dt.datetime | None) -> str:
    """A moment in the console's time zone (settings.TIME_ZONE), sortable and unambiguous, as plain text:
    2026-11-20 10:00:03 UTC. Plain text fits anywhere, a title attribute included; in the flow of a page,
    `stamp_time` also carries the full ISO time."""
    if moment is None:
        return "—"
    return _stamp_text(_local(moment))


@register.filter
def stamp_time(moment: dt.datetime | None) -> SafeString | str:
    """The stamp as a <time> element whose datetime and title give the full ISO time with its offset:
    <time datetime="2026-11-20T10:00:03.250000+00:00" title="...">2026-11-20 10:00:03 UTC</time>."""
    if moment is None:
        return "—"
    local = _local(moment)
    iso = escape(local.isoformat())
    return mark_safe(  # noqa: S308  (formatted from a datetime here, escaped all the same)
        f'<time datetime="{iso}" title="{iso}">{escape(_stamp_text(local))}</time>'
    )
