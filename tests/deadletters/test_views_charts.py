"""The server-drawn SVG charts: numbers in, markup only from us."""

from __future__ import annotations

import datetime as dt

from django.template import Context, Template

from dlqconsole.deadletters.templatetags.charts import age, bar_chart, duration, sparkline


def test_sparkline_scales_to_the_peak_and_marks_the_latest_value() -> None:
    svg = str(sparkline([0, 5, 10], width=100, height=20))

    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert 'points="3.0,17.0 50.0,10.0 97.0,3.0"' in svg
    assert '<circle cx="97.0" cy="3.0"' in svg
    assert "15 in the last 3 buckets, peak 10, latest 10" in svg


def test_chart_labels_are_escaped() -> None:
    start = dt.datetime(2026, 11, 20, 10, 0, tzinfo=dt.UTC)

    bars = str(bar_chart([(start, 1), (start + dt.timedelta(hours=1), 3)], label="<script>x</script>"))
    line = str(sparkline([1], label='"><img src=x>'))

    assert "<script>" not in bars and "&lt;script&gt;" in bars
    assert "<img" not in line and "&quot;&gt;&lt;img src=x&gt;" in line


def test_bar_chart_draws_a_bar_per_bucket_with_its_count_as_a_tooltip() -> None:
    start = dt.datetime(2026, 11, 20, 10, 0, tzinfo=dt.UTC)
    buckets = [(start + dt.timedelta(hours=hour), count) for hour, count in enumerate([0, 4, 2])]

    svg = str(bar_chart(buckets, width=300, height=120))

    assert svg.count("<rect") == 3
    assert "2026-11-20 11:00: 4</title>" in svg
    assert "peak 4" in svg
    assert 'height="0.0"' in svg  # the empty bucket draws no bar


def test_empty_bar_chart_says_so() -> None:
    assert "No data." in str(bar_chart([]))


def test_age_and_duration_are_compact() -> None:
    assert duration(dt.timedelta(seconds=45)) == "45s"
    assert duration(dt.timedelta(seconds=725)) == "12m 5s"
    assert duration(dt.timedelta(hours=3, minutes=20)) == "3h 20m"
    assert age(None) == "—"
    rendered = Template("{% load charts %}{{ moment|age }}").render(
        Context({"moment": dt.datetime.now(dt.UTC) - dt.timedelta(days=2, hours=4)})
    )
    assert rendered == "2d 4h"
