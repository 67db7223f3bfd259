"""The message detail page as an on-call engineer reads it: times with their zone, the AMQP timestamp as a date,
headers in order of name, the stack trace once."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pika
import pytest
from django.contrib.auth.models import User
from django.template import Context, Template
from django.test import Client
from django.utils import timezone

from dlqconsole.deadletters.models import DeadLetter
from dlqconsole.deadletters.templatetags.charts import stamp, stamp_time
from dlqconsole.ingest.envelope import parse_envelope
from tests.factories import EnvelopeFactory, store

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]

MOMENT = dt.datetime(2026, 11, 26, 6, 22, 31, 250000, tzinfo=dt.UTC)


@pytest.fixture
def viewer_client(viewer: User) -> Client:
    client = Client()
    client.force_login(viewer)
    return client


def test_stamp_names_the_time_zone() -> None:
    assert stamp(MOMENT) == "2026-11-26 06:22:31 UTC"
    assert stamp(None) == "—"


def test_stamp_is_in_the_consoles_time_zone(settings: Any) -> None:
    settings.TIME_ZONE = "Europe/Berlin"

    assert stamp(MOMENT) == "2026-11-26 07:22:31 CET"
    assert stamp(dt.datetime(2026, 7, 1, 12, 0, tzinfo=dt.UTC)) == "2026-07-01 14:00:00 CEST"


def test_stamp_time_carries_the_full_iso_time() -> None:
    assert stamp_time(MOMENT) == (
        '<time datetime="2026-11-26T06:22:31.250000+00:00" title="2026-11-26T06:22:31.250000+00:00">'
        "2026-11-26 06:22:31 UTC</time>"
    )


def test_stamp_stays_plain_text_inside_an_attribute() -> None:
    rendered = Template('{% load charts %}<td title="{{ moment|stamp }}">').render(Context({"moment": MOMENT}))

    assert rendered == '<td title="2026-11-26 06:22:31 UTC">'


def test_message_detail_shows_times_with_their_zone(viewer_client: Client) -> None:
    (stored,) = store(EnvelopeFactory.build())

    html = viewer_client.get(f"/messages/{stored.pk}/").content.decode()

    # The x-death time of the page world's letter, in the death history.
    assert (
        '<time datetime="2026-11-20T10:00:00+00:00" title="2026-11-20T10:00:00+00:00">2026-11-20 10:00:00 UTC</time>'
        in html
    )
    assert f">{stamp(stored.ingested_at)}</time>" in html


def stored_with(*, headers: dict[str, Any] | None = None, **properties: Any) -> DeadLetter:
    """A dead letter as ingest stores it, with these AMQP properties and headers (besides its x-death)."""
    death = {
        "count": 1,
        "reason": "rejected",
        "queue": "orders",
        "time": dt.datetime(2026, 11, 20, 10, 0, tzinfo=dt.UTC),
        "exchange": "shop",
        "routing-keys": ["orders.created"],
    }
    parsed = parse_envelope(
        source_queue="orders.dlq",
        body=b'{"order": 1}',
        properties=pika.BasicProperties(headers={"x-death": [death], **(headers or {})}, **properties),
        now=timezone.now(),
    )
    (stored,) = store(parsed)
    return stored


def property_cell(html: str, name: str) -> str:
    found = re.search(rf'data-testid="property-{name}">(.*?)</td>', html, re.S)
    assert found, f"no {name} property shown"
    return found.group(1)


def test_amqp_timestamp_is_shown_as_a_date_with_the_number_beside_it(viewer_client: Client) -> None:
    stored = stored_with(message_id="ts-1", timestamp=int(MOMENT.timestamp()))

    cell = property_cell(viewer_client.get(f"/messages/{stored.pk}/").content.decode(), "timestamp")

    assert '<time datetime="2026-11-26T06:22:31+00:00"' in cell and ">2026-11-26 06:22:31 UTC</time>" in cell
    assert f'<span class="muted small">{int(MOMENT.timestamp())}</span>' in cell


@pytest.mark.parametrize(
    ("seconds", "note"),
    [
        (-5, "not a plausible time (it would be 1969-12-31 23:59:55 UTC)"),
        (2**62, "not a time: beyond any calendar date"),
        (int(dt.datetime(2099, 1, 1, tzinfo=dt.UTC).timestamp()), "not a plausible time (it would be 2099-01-01"),
    ],
)
def test_nonsense_amqp_timestamp_is_shown_raw_with_a_note(viewer_client: Client, seconds: int, note: str) -> None:
    stored = stored_with(message_id=f"ts-{seconds}", timestamp=seconds)

    response = viewer_client.get(f"/messages/{stored.pk}/")

    cell = property_cell(response.content.decode(), "timestamp")
    assert response.status_code == 200
    assert cell.startswith(str(seconds)) and note in cell and "<time" not in cell


def header_names(html: str) -> list[str]:
    return re.findall(r'<td class="mono small nowrap" data-testid="header-name">(.*?)</td>', html)


def test_headers_are_sorted_by_name_ignoring_case(viewer_client: Client) -> None:
    stored = stored_with(
        message_id="sorted-1",
        headers={
            "zeta": "last",
            "Tenant": "acme",
            "x-first-death-queue": "orders",
            "x-first-death-reason": "rejected",
            "alpha": "first",
            "x-exception-message": "boom",
            "X-Last-Death-Queue": "orders",
        },
    )

    html = viewer_client.get(f"/messages/{stored.pk}/").content.decode()

    assert header_names(html) == [
        "alpha",
        "Tenant",
        "x-death",
        "x-exception-message",
        "x-first-death-queue",
        "x-first-death-reason",
        "X-Last-Death-Queue",
        "zeta",
    ]
    # x-death is listed where it sorts, pointing to the death history that shows its entries.
    assert '<a class="muted" href="#death-history">1 entry, shown in the death history</a>' in html
    assert 'id="death-history"' in html


TRACE = 'Traceback (most recent call last):\n  File "/app/shop/orders.py", line 12, in create\nValueError: bad <order>'


def test_the_stack_trace_is_shown_once_in_the_failure_card(viewer_client: Client) -> None:
    stored = stored_with(
        message_id="trace-1",
        headers={"x-exception-message": "bad order", "x-exception-stacktrace": TRACE, "x-note": "kept"},
    )

    html = viewer_client.get(f"/messages/{stored.pk}/").content.decode()

    assert html.count("Traceback (most recent call last)") == 1
    assert '<pre data-testid="stack-trace">Traceback (most recent call last):' in html
    assert "ValueError: bad &lt;order&gt;</pre>" in html
    assert '<a class="muted" href="#stack-trace">the stack trace (3 lines), shown above under Failure</a>' in html
    assert "x-exception-stacktrace" in header_names(html)


def test_only_the_trace_header_the_failure_card_shows_is_replaced(viewer_client: Client) -> None:
    """Two trace headers: ingest takes the first of DLQ_STACK_TRACE_HEADERS; the other keeps its value."""
    stored = stored_with(message_id="trace-2", headers={"traceback": "an older trace", "X-Exception-StackTrace": TRACE})

    html = viewer_client.get(f"/messages/{stored.pk}/").content.decode()

    assert stored.stack_trace == TRACE
    assert html.count("Traceback (most recent call last)") == 1
    assert "an older trace" in html
