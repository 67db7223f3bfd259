"""An export reads the database in bounded pieces: memory stays flat for rows with 16 MB bodies, and a read that
takes too long ends the stream or file with an error line instead of hanging."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.contrib.auth.models import User
from django.db import connection
from pytest_django import Settings

from dlqconsole.deadletters import export_lines, exports
from dlqconsole.deadletters.models import DeadLetter
from tests.conftest import client_for
from tests.deadletters.export_world import clear_export_leases
from tests.factories import EnvelopeFactory, many, store

MB = 1024 * 1024
BODY = 16 * MB
ROWS = 8


@pytest.fixture(autouse=True)
def _no_export_leases() -> Iterator[None]:
    clear_export_leases()
    yield
    clear_export_leases()


def streamed_peak(response: Any) -> tuple[int, int]:
    """(bytes streamed, peak of memory allocated while streaming them), measured in process with tracemalloc."""
    streamed = 0
    tracemalloc.start()
    try:
        for chunk in response.streaming_content:
            streamed += len(chunk)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return streamed, peak


@pytest.mark.django_db
@pytest.mark.parametrize("export_format", ["jsonl", "csv"])
def test_a_streamed_export_of_16_mb_bodies_keeps_memory_flat(viewer: User, export_format: str) -> None:
    for n in range(ROWS):
        store(EnvelopeFactory.build(body=bytes([ord("a") + n]) * BODY, content_type="text/plain"))

    response = client_for(viewer).get(f"/messages/export/?format={export_format}")
    streamed, peak = streamed_peak(response)

    assert streamed > ROWS * BODY
    # About one row's body (and a few pieces of it on their way out), never all eight at once (128 MB of bodies),
    # nor one body copied over and over (text, escaped, the whole line, its bytes).
    assert peak < 2 * BODY, f"peak {peak / MB:.0f} MB while streaming {streamed / MB:.0f} MB"


@contextlib.contextmanager
def table_locked() -> Iterator[None]:
    """Another session holds the dead letters table (as a long migration or VACUUM FULL would): every read of it
    waits until the lock goes, which is never without a timeout."""
    database = connection.settings_dict
    other = psycopg.connect(
        dbname=database["NAME"],
        user=database.get("USER") or "postgres",
        host=database.get("HOST") or "127.0.0.1",
        port=database.get("PORT") or 5432,
    )
    try:
        other.execute(f"LOCK TABLE {DeadLetter._meta.db_table} IN ACCESS EXCLUSIVE MODE")
        yield
    finally:
        other.rollback()
        other.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("export_format", ["csv", "jsonl"])
def test_a_read_that_times_out_ends_the_stream_with_an_error_line(
    viewer: User,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    export_format: str,
) -> None:
    settings.DLQ_EXPORT_READ_TIMEOUT_SECONDS = 0.5
    monkeypatch.setattr(export_lines, "CHUNK", 3)
    many(7)
    response = client_for(viewer).get(f"/messages/export/?format={export_format}")
    content = iter(response.streaming_content)  # type: ignore[attr-defined]
    # The header (CSV) and the first chunk's three rows are read and sent before the table is locked.
    first = [next(content) for _ in range(4 if export_format == "csv" else 3)]

    with table_locked():
        rest = list(content)

    text = b"".join(first + rest).decode()
    if export_format == "csv":
        rows = list(csv.reader(io.StringIO(text)))
        assert len(rows) == 5
        assert rows[0][0] == "id" and all(row[0].isdigit() for row in rows[1:4])
        marker = rows[-1]
    else:
        records = [json.loads(line) for line in text.splitlines()]
        assert len(records) == 4
        marker = [export_lines.ERROR_MARKER, records[-1][export_lines.ERROR_MARKER]]
    assert marker[0] == "export_error"
    assert marker[1].startswith("Reading the database took longer than 0.5 s after 3 dead letters")


@pytest.mark.django_db(transaction=True)
def test_a_read_that_times_out_ends_the_background_file_with_an_error_line(
    viewer: User, settings: Settings, tmp_path: Path, celery_queue: str
) -> None:
    settings.DLQ_EXPORT_READ_TIMEOUT_SECONDS = 0.5
    settings.VAR_DIR = tmp_path
    many(3)
    client = client_for(viewer)
    # Its task goes to this run's queue (emptied afterwards); the test writes the file itself.
    started = client.post("/messages/export/", {"format": "jsonl"})
    token = started["Location"].rstrip("/").rpartition("/")[2]

    with table_locked():
        assert exports.write_export(token=token, filter={}, export_format="jsonl") == 0

    (line,) = (tmp_path / "exports" / f"{token}.jsonl").read_text().splitlines()
    assert json.loads(line)[export_lines.ERROR_MARKER].startswith("Reading the database took longer than 0.5 s")
    page = client.get(started["Location"]).content.decode()
    assert "The export stopped early: Reading the database took longer than 0.5 s" in page
    assert "?download=1" in page
