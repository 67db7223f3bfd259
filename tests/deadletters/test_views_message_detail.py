"""The message detail page as an on-call engineer reads it: times with their zone, the AMQP timestamp as a date,
headers in order of name, the stack trace once."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.template import Context, Template
from django.test import Client

from dlqconsole.deadletters.templatetags.charts import stamp, stamp_time
from tests.deadletters.page_world import ingest, letter

pytestmark = [pytest.mark.django_db]

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
    (stored,) = ingest(letter())

    html = viewer_client.get(f"/messages/{stored.pk}/").content.decode()

    # The x-death time of the page world's letter, in the death history.
    assert (
        '<time datetime="2026-11-20T10:00:00+00:00" title="2026-11-20T10:00:00+00:00">2026-11-20 10:00:00 UTC</time>'
        in html
    )
    assert f">{stamp(stored.ingested_at)}</time>" in html
