"""Exports of the filtered set: streamed CSV and JSON lines, and a background file for large sets."""

from __future__ import annotations

import base64
import csv
import io
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.deadletters import export_lines, exports
from tests.deadletters.export_world import clear_export_leases
from tests.factories import EnvelopeFactory, many, store

pytestmark = [pytest.mark.django_db]


@pytest.fixture(autouse=True)
def _no_export_leases() -> Iterator[None]:
    clear_export_leases()
    yield
    clear_export_leases()


@pytest.fixture
def viewer_client(viewer: User) -> Client:
    client = Client()
    client.force_login(viewer)
    return client


@pytest.fixture
def export_dir(tmp_path: Path, settings) -> Path:  # type: ignore[no-untyped-def]
    settings.VAR_DIR = tmp_path
    return tmp_path / "exports"


def body_of(response) -> str:  # type: ignore[no-untyped-def]
    return b"".join(response.streaming_content).decode()


@pytest.mark.sqlite
def test_csv_export_streams_the_filtered_set(viewer_client: Client) -> None:
    many(3, queue="orders")
    store(EnvelopeFactory.build(queue="billing", error='=HYPERLINK("http://evil")', error_type="CardError"))

    response = viewer_client.get("/messages/export/?format=csv&queue=billing.dlq")

    assert response.streaming
    assert response["Content-Disposition"].startswith("attachment;")
    rows = list(csv.DictReader(io.StringIO(body_of(response))))
    assert len(rows) == 1
    assert rows[0]["source_queue"] == "billing.dlq"
    # A spreadsheet must not run text from a dead letter as a formula.
    assert rows[0]["error_message"] == '\'=HYPERLINK("http://evil")'
    assert AuditEntry.objects.filter(action="export", target="messages.csv").exists()


@pytest.mark.sqlite
def test_jsonl_export_keeps_binary_bodies_as_base64(viewer_client: Client) -> None:
    store(EnvelopeFactory.build(body=b"\x00\xffbinary", content_type="application/octet-stream"))
    store(EnvelopeFactory.build(body=b'{"ok": true}'))

    response = viewer_client.get("/messages/export/?format=jsonl")

    records = [json.loads(line) for line in body_of(response).splitlines()]
    assert len(records) == 2
    binary = next(record for record in records if record["body_encoding"] == "base64")
    assert base64.b64decode(binary["body"]) == b"\x00\xffbinary"
    text = next(record for record in records if record["body_encoding"] == "utf-8")
    assert text["body"] == '{"ok": true}'
    assert text["headers"]["x-host"] == "web-1"


@pytest.mark.sqlite
def test_csv_export_writes_a_text_body_holding_nul_as_base64(viewer_client: Client) -> None:
    store(EnvelopeFactory.build(body=b"nul\x00body", content_type="text/plain"))
    store(EnvelopeFactory.build(body=b"plain text"))

    text = body_of(viewer_client.get("/messages/export/?format=csv"))

    assert "\x00" not in text
    bodies = {row["body_encoding"]: row["body"] for row in csv.DictReader(io.StringIO(text))}
    assert base64.b64decode(bodies["base64"]) == b"nul\x00body"
    assert bodies["utf-8"] == "plain text"


@pytest.mark.sqlite
def test_export_reads_every_row_across_keyset_chunks(viewer_client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(export_lines, "CHUNK", 7)
    stored = many(30)

    response = viewer_client.get("/messages/export/?format=jsonl")

    ids = [json.loads(line)["id"] for line in body_of(response).splitlines()]
    assert sorted(ids) == sorted(row.pk for row in stored)
    assert ids == sorted(ids, reverse=True)


@pytest.mark.sqlite
def test_bodies_written_in_pieces_read_back_whole(viewer_client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    # Pieces of 7 characters: quotes, separators, line ends and multi-byte characters fall across their edges.
    monkeypatch.setattr(export_lines, "PIECE", 7)
    bodies = [
        'say "hi", then\r\nleave "now"' * 5,
        "=SUM(A1:A9) ünïcødé 🐇 and ✓✓✓✓ across edges" * 3,
        "+" + "x" * 40,
        b"\xff\xfe binary \x00 and more bytes".decode("latin-1") * 3,
        "",
        "short",
    ]
    for body in bodies:
        store(EnvelopeFactory.build(body=body.encode("latin-1" if body.startswith("\xff") else "utf-8")))
    expected = sorted(body.encode("latin-1" if body.startswith("\xff") else "utf-8") for body in bodies)

    jsonl = body_of(viewer_client.get("/messages/export/?format=jsonl"))
    rows = list(csv.DictReader(io.StringIO(body_of(viewer_client.get("/messages/export/?format=csv")))))

    def decoded(body: str, encoding: str, *, sheet: bool) -> bytes:
        if encoding == "base64":
            return base64.b64decode(body)
        # The CSV marks a text body a spreadsheet would run as a formula with a leading quote.
        return (body[1:] if sheet and body.startswith("'") else body).encode()

    records = [json.loads(line) for line in jsonl.splitlines()]
    assert sorted(decoded(item["body"], item["body_encoding"], sheet=False) for item in records) == expected
    assert sorted(decoded(row["body"], row["body_encoding"], sheet=True) for row in rows) == expected
    assert [row["headers"] for row in rows] == [json.dumps(item["headers"], ensure_ascii=False) for item in records]
    assert {row["body"][:2] for row in rows if row["body"].startswith("'")} == {"'=", "'+"}


def test_unknown_export_format_is_404(viewer_client: Client) -> None:
    assert viewer_client.get("/messages/export/?format=xlsx").status_code == 404


def test_large_export_is_written_in_the_background_and_downloaded_by_its_owner(
    viewer: User,
    operator: User,
    viewer_client: Client,
    export_dir: Path,
    celery_queue: str,
    monkeypatch: pytest.MonkeyPatch,
    django_capture_on_commit_callbacks,
) -> None:
    monkeypatch.setattr(exports, "STREAM_LIMIT", 5)
    many(8)

    offer = viewer_client.get("/messages/export/?format=csv&queue=orders.dlq")
    assert offer.status_code == 200 and "more than 5" in offer.content.decode()

    with django_capture_on_commit_callbacks(execute=True) as enqueued:
        started = viewer_client.post("/messages/export/", {"format": "csv", "queue": "orders.dlq"})
    assert len(enqueued) == 1
    token = started["Location"].rstrip("/").rpartition("/")[2]
    waiting = viewer_client.get(started["Location"], headers={"HX-Request": "true"})
    assert waiting.status_code == 200 and "every 2s" in waiting.content.decode()

    # What the worker runs for that task:
    assert exports.write_export(token=token, filter={"queue": ["orders.dlq"]}, export_format="csv") == 8

    ready = viewer_client.get(started["Location"], headers={"HX-Request": "true"})
    assert ready.status_code == 286 and "Download" in ready.content.decode()
    page = viewer_client.get(started["Location"])
    assert page.status_code == 200 and "<html" in page.content.decode() and "Download" in page.content.decode()
    download = viewer_client.get(started["Location"] + "?download=1")
    rows = list(csv.DictReader(io.StringIO(b"".join(download.streaming_content).decode())))  # type: ignore[attr-defined]
    assert len(rows) == 8

    stranger = Client()
    stranger.force_login(operator)
    assert stranger.get(started["Location"]).status_code == 404
    assert viewer_client.get("/messages/exports/../../etc/passwd/").status_code == 404


@pytest.mark.sqlite
def test_export_files_older_than_the_retention_are_deleted(export_dir: Path, settings) -> None:  # type: ignore[no-untyped-def]
    settings.DLQ_EXPORT_RETENTION_HOURS = 24
    export_dir.mkdir(parents=True, exist_ok=True)
    token = "7-" + "a" * 32
    old = [export_dir / f"{token}.csv", export_dir / f"1-{'b' * 32}.jsonl.part", export_dir / f"2-{'c' * 32}.csv.error"]
    fresh = export_dir / f"3-{'d' * 32}.csv"
    unrelated = export_dir / "notes.txt"
    # Every time set from this process's clock: the retention compares file times with it.
    now = time.time()
    long_ago = now - 25 * 3600
    for path in [*old, fresh, unrelated]:
        path.write_text("x")
    for path in [*old, unrelated]:
        os.utime(path, (long_ago, long_ago))
    os.utime(fresh, (now, now))

    assert exports.delete_expired_exports() == 3

    assert not any(path.exists() for path in old)
    assert fresh.exists() and unrelated.exists()
    assert exports.delete_expired_exports() == 0


def test_an_export_name_with_a_trailing_newline_is_not_a_token(viewer: User, export_dir: Path) -> None:
    name = f"{viewer.pk}-{'a' * 32}"
    # A file of that odd name (the console never writes one) is still not served: the name is not a token.
    export_dir.mkdir(parents=True, exist_ok=True)
    (export_dir / f"{name}\n.csv").write_text("id\n")

    assert exports.find_export(name=name + "\n", user=viewer) is None
