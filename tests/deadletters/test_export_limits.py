"""How many exports run at once: at most DLQ_EXPORTS_PER_USER per person (streamed ones included), at most
DLQ_EXPORT_CONCURRENCY background ones writing; a finished or crashed export frees its place."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.signals import request_finished
from django.db import close_old_connections
from django.http import HttpResponseBase
from django.test import Client, RequestFactory
from pytest_django import Settings

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.core.leases import get_leases
from dlqconsole.deadletters import exports
from dlqconsole.deadletters.views import messages as message_views
from tests.conftest import client_for
from tests.deadletters.export_world import clear_export_leases
from tests.factories import many

pytestmark = [pytest.mark.django_db]

REFUSED = "You already have 2 exports running"


@pytest.fixture(autouse=True)
def _no_export_leases() -> Iterator[None]:
    clear_export_leases()
    yield
    clear_export_leases()


@pytest.fixture
def export_dir(tmp_path: Path, settings: Settings) -> Path:
    settings.VAR_DIR = tmp_path
    settings.DLQ_EXPORTS_PER_USER = 2
    return tmp_path / "exports"


def body_of(response: Any) -> str:
    return b"".join(response.streaming_content).decode()


def went_away(response: HttpResponseBase) -> None:
    """What a WSGI server does when its client goes away: it closes the response. (request_finished would also
    close the database connection the test runs in.)"""
    request_finished.disconnect(close_old_connections)
    try:
        response.close()
    finally:
        request_finished.connect(close_old_connections)


def test_a_third_export_is_refused_while_two_run(viewer: User, export_dir: Path) -> None:
    many(3)
    client = client_for(viewer)
    streaming = client.get("/messages/export/?format=csv")  # streaming, not yet read to its end
    started = client.post("/messages/export/", {"format": "jsonl"})  # a background export, not yet written
    assert streaming.streaming and started.status_code == 302

    refused = client.get("/messages/export/?format=csv&queue=orders.dlq", follow=True)

    assert refused.redirect_chain == [("/messages/?queue=orders.dlq", 302)]
    assert REFUSED in refused.content.decode()
    assert client.post("/messages/export/", {"format": "csv"})["Location"] == "/messages/"
    assert len(list(export_dir.iterdir())) == 1  # no second background file
    refusals = AuditEntry.objects.filter(action="export.refused")
    assert refusals.count() == 2
    assert refusals.filter(target="messages.csv", filter={"queue": ["orders.dlq"]}).exists()

    # The streamed one ends: its place is free again.
    assert body_of(streaming).count("\n") == 4
    third = client.get("/messages/export/?format=jsonl")
    assert third.streaming
    assert not client.get("/messages/export/?format=csv").streaming

    # The background one is written: its place is free too.
    token = started["Location"].rstrip("/").rpartition("/")[2]
    assert exports.write_export(token=token, filter={}, export_format="jsonl") == 3
    assert client.get("/messages/export/?format=csv").streaming


def test_each_person_has_places_of_their_own(viewer: User, operator: User, export_dir: Path) -> None:
    many(2)
    busy = client_for(viewer)
    held = [busy.get("/messages/export/?format=csv"), busy.get("/messages/export/?format=jsonl")]

    assert not busy.get("/messages/export/?format=csv").streaming
    assert client_for(operator).get("/messages/export/?format=csv").streaming
    assert all(response.streaming for response in held)


def test_a_streamed_export_closed_before_its_end_frees_its_place(viewer: User, export_dir: Path) -> None:
    many(3)
    # Straight from the view, as a WSGI server gets it (the test client wraps the content in its own closing).
    request = RequestFactory().get("/messages/export/", {"format": "csv"})
    request.user = viewer
    first, second = message_views.message_export(request), message_views.message_export(request)  # type: ignore[arg-type]
    assert len(get_leases().holders(exports.user_pool(viewer.pk))) == 2
    # The header goes out, then the client goes away.
    next(iter(first.streaming_content))  # type: ignore[attr-defined]

    went_away(first)
    went_away(second)  # never read at all

    assert get_leases().holders(exports.user_pool(viewer.pk)) == set()
    assert client_for(viewer).get("/messages/export/?format=csv").streaming


def test_a_crashed_export_frees_its_place_when_its_lease_runs_out(
    viewer: User,
    export_dir: Path,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings.DLQ_EXPORT_READ_TIMEOUT_SECONDS = 0.1
    monkeypatch.setattr(exports, "LEASE_MARGIN_SECONDS", 0.1)
    many(2)
    client = client_for(viewer)
    # Two background exports whose worker died before it wrote anything (their tasks never run here).
    for export_format in ("csv", "jsonl"):
        assert client.post("/messages/export/", {"format": export_format}).status_code == 302
    assert not client.get("/messages/export/?format=csv").streaming

    time.sleep(0.5)  # past the lease of 0.3 s, which nothing renewed

    assert client.get("/messages/export/?format=csv").streaming


def test_an_export_waits_while_every_slot_is_busy_and_its_page_says_so(
    viewer: User,
    export_dir: Path,
    settings: Settings,
    django_capture_on_commit_callbacks,
    celery_queue: str,
) -> None:
    settings.DLQ_EXPORT_CONCURRENCY = 1
    many(4)
    client = client_for(viewer)
    # Another export is writing (on some other worker).
    assert get_leases().take(exports.RUNNING_POOL, "9-" + "f" * 32, limit=1, seconds=60)
    with django_capture_on_commit_callbacks(execute=True):
        started = client.post("/messages/export/", {"format": "csv"})
    token = started["Location"].rstrip("/").rpartition("/")[2]
    later: list[float] = []

    assert exports.write_export(token=token, filter={}, export_format="csv", continue_later=later.append) == 0

    assert later == [exports.WAIT_SECONDS]
    assert [path.name for path in export_dir.iterdir()] == [f"{token}.csv.part"]
    waiting = client.get(started["Location"], headers={"HX-Request": "true"})
    assert waiting.status_code == 200
    assert "Waiting: other exports are being written (at most 1 at a time)" in waiting.content.decode()
    assert "every 2s" in waiting.content.decode()
    # Still one of the person's places while it waits.
    assert get_leases().holders(exports.user_pool(viewer.pk)) == {token}

    get_leases().give_back(exports.RUNNING_POOL, "9-" + "f" * 32)

    assert exports.write_export(token=token, filter={}, export_format="csv", continue_later=later.append) == 4
    assert later == [exports.WAIT_SECONDS]
    assert client.get(started["Location"], headers={"HX-Request": "true"}).status_code == 286
    assert get_leases().holders(exports.RUNNING_POOL) == set()
    assert get_leases().holders(exports.user_pool(viewer.pk)) == set()


def test_a_writing_export_says_so(viewer: User, export_dir: Path) -> None:
    client: Client = client_for(viewer)
    started = client.post("/messages/export/", {"format": "csv"})
    token = started["Location"].rstrip("/").rpartition("/")[2]
    assert get_leases().take(exports.RUNNING_POOL, token, limit=1, seconds=60)

    page = client.get(started["Location"]).content.decode()

    assert "Writing…" in page and "Waiting" not in page
