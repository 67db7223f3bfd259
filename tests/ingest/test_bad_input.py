"""Malformed and hostile dead letters, through the real broker and one real consume_dlq process.

Every case is published once (most to a work queue whose messages RabbitMQ dead-letters at once, so they carry
a real x-death; those about x-death itself straight into the DLQ), then a single consume_dlq drains the DLQ.
Each case must be stored, body byte for byte, with its problem in parse_errors, and the consumer must keep
running: one process, no reconnection, every message acked.

Some byte sequences are built with a raw table encoder (pika cannot produce them). What RabbitMQ 3.10 itself
refuses at publish time (NaN or infinite doubles, unknown field types: the publisher's connection is closed
with INTERNAL_ERROR) never reaches a queue, so it is not a consumer's concern. What it accepts but stock pika
cannot decode (a timestamp beyond the year 9999) tears down a stock pika consumer's connection and comes back
forever; consume_dlq decodes it (see amqp_decoding.install_tolerant_decoding).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import struct
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pika
import psycopg
import pytest
from django.conf import settings
from django.core.management import call_command

from dlqconsole.core.amqp import connect
from tests.ingest.conftest import ConsumerProcess
from tests.support import declare_with_dlq, wait_for_depth

# Makes pytest-django set up the test database even when this module runs alone (the fixture needs it).
pytestmark = pytest.mark.django_db

CASE_HEADER = "test-case"
BIG_BODY = hashlib.sha256(b"seed").digest() * (20 * 1024 * 1024 // 32)
PLACEHOLDER = {"__raw__": "PLACEHOLDER"}
PLACEHOLDER_BYTES = struct.pack(">I", 24) + b"\x07__raw__S" + struct.pack(">I", 11) + b"PLACEHOLDER"


class RawHeaders(pika.BasicProperties):
    """BasicProperties whose header table is given as encoded bytes: values pika's encoder cannot write."""

    def __init__(self, raw_table: bytes, **properties: Any) -> None:
        super().__init__(headers=PLACEHOLDER, **properties)
        self.raw_table = raw_table

    def encode(self) -> list[bytes]:
        encoded = b"".join(super().encode())
        assert PLACEHOLDER_BYTES in encoded
        return [encoded.replace(PLACEHOLDER_BYTES, struct.pack(">I", len(self.raw_table)) + self.raw_table)]


def raw_entry(key: bytes, value: bytes) -> bytes:
    return struct.pack("B", len(key)) + key + value


def raw_text(text: bytes) -> bytes:
    return b"S" + struct.pack(">I", len(text)) + text


@dataclass
class Case:
    name: str
    body: bytes = b'{"order": 1}'
    headers: dict[Any, Any] = field(default_factory=dict)
    properties: dict[str, Any] = field(default_factory=dict)
    raw_entries: list[tuple[bytes, bytes]] | None = None
    # Published straight into the DLQ (no broker dead-lettering, so no x-death added).
    direct: bool = False
    # A substring of one parse_errors entry; None for hostile input that is not malformed (stored as is).
    problem: str | None = None

    def amqp_properties(self) -> pika.BasicProperties:
        values = {"content_type": "application/json", "message_id": f"case-{self.name}", **self.properties}
        if not self.direct:
            values["expiration"] = "0"
        if self.raw_entries is not None:
            table = raw_entry(CASE_HEADER.encode(), raw_text(self.name.encode())) + b"".join(
                raw_entry(key, value) for key, value in self.raw_entries
            )
            return RawHeaders(table, **values)
        return pika.BasicProperties(headers={CASE_HEADER: self.name, **self.headers}, **values)


def nested_table(depth: int) -> dict[str, Any]:
    table: dict[str, Any] = {"leaf": "bottom"}
    for _ in range(depth):
        table = {"child": table}
    return table


def x_death_entry(**overrides: Any) -> dict[str, Any]:
    return {
        "count": 1,
        "reason": "rejected",
        "queue": "orders",
        "time": dt.datetime(2026, 11, 20, tzinfo=dt.UTC),
        "exchange": "shop",
        "routing-keys": ["orders.created"],
        **overrides,
    }


CASES = [
    Case("binary-body-declared-json", body=bytes(range(256)) * 8, problem="is not utf-8 text"),
    Case("latin-1-body", body="café crème".encode("latin-1"), properties={"content_type": "text/plain"},
         problem="is not utf-8 text"),
    Case(
        "twenty-megabyte-body",
        body=BIG_BODY,
        properties={"content_type": "application/octet-stream"},
        problem="over DLQ_MAX_BODY_BYTES",
    ),
    Case("empty-body", body=b"", problem="the body is empty"),
    Case("invalid-json", body=b'{"order": 1,,}', problem="the body is not valid JSON"),
    Case("deeply-nested-json", body=b"[" * 200_000 + b"]" * 200_000, problem="nested too deeply"),
    Case("nul-in-json-body", body=b'{"note": "a\x00b"}', problem="the body is not valid JSON"),
    Case("html-and-script-payload",
         body=b"<html><script>alert(document.cookie)</script><img src=x onerror=alert(1)></html>",
         headers={"x-exception-message": "<script>alert('xss')</script><b onmouseover=alert(1)>boom</b>"},
         properties={"content_type": "text/html"}),
    Case("unknown-content-encoding", properties={"content_encoding": "x-rot13"}, problem="unknown content encoding"),
    Case("gzip-that-is-not", properties={"content_encoding": "gzip"}, problem="does not start like gzip"),
    Case("unknown-charset", properties={"content_type": "text/plain; charset=klingon"}, problem="unknown charset"),
    Case("no-x-death", direct=True, problem="no x-death header"),
    Case("x-death-is-text", direct=True, headers={"x-death": "rejected"}, problem="x-death is a str, not an array"),
    Case("x-death-is-number", direct=True, headers={"x-death": 42}, problem="x-death is a int, not an array"),
    Case("x-death-is-boolean", direct=True, headers={"x-death": True}, problem="x-death is a bool, not an array"),
    Case("x-death-is-a-table", direct=True, headers={"x-death": x_death_entry()}, problem="x-death is a table"),
    Case("x-death-is-bytes", direct=True, headers={"x-death": b"\x00\x01"}, problem="x-death is a byte array"),
    Case("x-death-is-a-timestamp", direct=True, headers={"x-death": dt.datetime(2026, 1, 1, tzinfo=dt.UTC)},
         problem="x-death is a timestamp"),
    Case("x-death-is-void", direct=True, headers={"x-death": None}, problem="no x-death header"),
    Case("x-death-is-empty", direct=True, headers={"x-death": []}, problem="x-death is empty"),
    Case("x-death-holds-strings", direct=True, headers={"x-death": ["orders", "rejected"]},
         problem="x-death[0] is a str, not a table"),
    Case("x-death-entry-of-wrong-types", direct=True,
         headers={"x-death": [x_death_entry(count="three", time="yesterday", queue=7, **{"routing-keys": "orders"})]},
         problem="x-death[0] count 'three' is not a positive integer"),
    Case("x-death-unknown-reason", direct=True, headers={"x-death": [x_death_entry(reason="exploded")]},
         problem="unknown death reason 'exploded'"),
    Case("x-death-time-at-epoch", direct=True,
         headers={"x-death": [x_death_entry(time=dt.datetime(1970, 1, 1, tzinfo=dt.UTC))]},
         problem="time 1970-01-01T00:00:00+00:00 is out of range"),
    Case("x-death-time-negative", direct=True, headers={"x-death": [x_death_entry(time=-5)]},
         problem="x-death[0] time '-5' is not a timestamp"),
    Case("timestamp-beyond-year-9999", raw_entries=[(b"x-sent-at", b"T" + struct.pack(">Q", 2**63))],
         problem="beyond the year 9999"),
    Case("timestamp-property-far-future", properties={"timestamp": 32_503_680_000},
         problem="timestamp property 32503680000 is out of range"),
    Case("timestamp-property-zero", properties={"timestamp": 0}, problem="timestamp property 0 is out of range"),
    Case("priority-out-of-range", properties={"priority": 200}, problem="priority 200 is above 9"),
    Case("huge-header-table", headers={f"x-h-{index}": f"v{index}" for index in range(3000)},
         problem="the header table has 300"),
    Case("deeply-nested-header-table", headers={"x-nested": nested_table(100)}, problem="nested deeper than 64 levels"),
    Case("nul-in-header-value", headers={"x-exception-message": "boom\x00boom"},
         problem="error message contains NUL characters"),
    Case("nul-in-header-key", headers={"x-bad\x00key": "value"}, problem="contains NUL characters"),
    Case("non-utf-8-header-key", raw_entries=[(b"x-\xff\xfe", raw_text(b"value"))], problem="is not UTF-8 text"),
    Case("non-utf-8-error-type", raw_entries=[(b"x-exception-type", raw_text(b"Bad\xffType"))],
         problem="error type is not UTF-8 text"),
    Case("nul-in-message-id", properties={"message_id": "id\x00with\x00nul"}, problem="message_id contains NUL"),
    Case("overlong-error-type", headers={"x-exception-type": "E" * 1000}, problem="error type is 1000 characters long"),
    Case("celery-headers-of-wrong-types", headers={"task": 123, "id": {"not": "text"}, "retries": "three"},
         problem="Celery retries 'three' is not a count"),
    Case("delivery-count-not-a-number", headers={"x-delivery-count": "lots"},
         problem="x-delivery-count 'lots' is not a count"),
]  # fmt: skip


@dataclass(frozen=True)
class Stored:
    headers: Any
    body: bytes
    parse_errors: list[str]
    error_type: str
    error_message: str
    message_id: str
    body_size: int
    original_queue: str
    body_truncated: bool


@dataclass
class Run:
    rows: dict[str, Stored]
    total_rows: int
    counters: tuple[int, int]
    exit_code: int
    output: str
    dlq_depth: int


@pytest.fixture(scope="module")
def run(django_db_setup: None, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """Publish every case, drain the DLQ with one consume_dlq process, read back what it stored."""
    from tests.support import subprocess_database_url

    with django_db_blocker.unblock():
        database_url = subprocess_database_url()
    work = f"t{uuid.uuid4().hex[:10]}.hostile"
    amqp = connect()
    channel = amqp.channel()
    queues = declare_with_dlq(channel, work)
    try:
        for case in CASES:
            channel.basic_publish(
                exchange="",
                routing_key=queues.dlq if case.direct else queues.work,
                body=case.body,
                properties=case.amqp_properties(),
            )
        assert wait_for_depth(channel, queues.dlq, len(CASES), timeout=60) == len(CASES)
        log_path = tmp_path_factory.mktemp("bad-input") / "consume_dlq.log"
        consumer = ConsumerProcess(
            ["--queues", queues.dlq, "--batch-size", "8", "--exit-when-idle", "3"],
            database_url=database_url,
            log_path=log_path,
            env={},
        )
        try:
            exit_code = consumer.wait(timeout=180)
            output = consumer.output
        finally:
            consumer.kill()
        with psycopg.connect(database_url) as database:
            found = database.execute(
                "SELECT headers, body, parse_errors, error_type, error_message, message_id, body_size, original_queue, "
                "body_truncated FROM deadletters_deadletter WHERE source_queue = %s",
                [queues.dlq],
            ).fetchall()
            counters = database.execute(
                "SELECT (SELECT coalesce(sum(count), 0) FROM deadletters_deadlettercount WHERE source_queue = %s), "
                "(SELECT inserted FROM ingest_ingeststat WHERE source_queue = %s)",
                [queues.dlq, queues.dlq],
            ).fetchone()
        rows = {}
        for headers, *values in found:
            pairs = headers["$map"] if "$map" in headers else headers.items()
            (name,) = [value for key, value in pairs if key == CASE_HEADER]
            rows[name] = Stored(headers, bytes(values[0]), *values[1:])
        yield Run(
            rows=rows,
            total_rows=len(found),
            counters=tuple(counters or (0, 0)),
            exit_code=exit_code,
            output=output,
            dlq_depth=wait_for_depth(channel, queues.dlq, 1, timeout=0),
        )
    finally:
        with django_db_blocker.unblock():
            # The consumer committed for real: empty the tables as a transactional test does after itself.
            call_command("flush", verbosity=0, interactive=False, reset_sequences=False)
        for name in (queues.work, queues.dlq):
            channel.queue_delete(queue=name)
        channel.exchange_delete(exchange=f"{work}.dlx")
        amqp.close()


def test_there_are_at_least_25_hostile_cases() -> None:
    assert len(CASES) >= 25
    assert len({case.name for case in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_hostile_message_is_stored_whole_with_its_problem_recorded(run: Run, case: Case) -> None:
    stored = run.rows[case.name]

    # Whole, or (over DLQ_MAX_BODY_BYTES) its first part, with its size.
    assert stored.body == case.body[: settings.DLQ_MAX_BODY_BYTES]
    assert stored.body_size == len(case.body)
    assert stored.body_truncated == (len(case.body) > settings.DLQ_MAX_BODY_BYTES)
    if case.problem is None:
        assert stored.parse_errors == []
    else:
        assert any(case.problem in problem for problem in stored.parse_errors), stored.parse_errors
    if not case.direct:
        # RabbitMQ dead-lettered it: the real x-death was read despite the rest.
        assert stored.original_queue.endswith(".hostile")
        assert not any("x-death" in problem for problem in stored.parse_errors)


def test_consumer_kept_running_and_acked_every_hostile_message(run: Run) -> None:
    assert run.exit_code == 0
    assert f"{len(CASES)} received, {len(CASES)} new, 0 duplicates" in run.output
    assert "0 broker errors, 0 database errors" in run.output
    assert "connection lost" not in run.output
    assert run.total_rows == len(CASES)
    assert run.counters == (len(CASES), len(CASES))
    assert run.dlq_depth == 0


def test_html_error_message_is_kept_verbatim(run: Run) -> None:
    stored = run.rows["html-and-script-payload"]

    assert stored.error_message == "<script>alert('xss')</script><b onmouseover=alert(1)>boom</b>"


def test_nul_characters_never_reach_text_columns_but_survive_in_the_headers(run: Run) -> None:
    stored = run.rows["nul-in-header-value"]
    assert stored.error_message == "boom\ufffdboom"
    assert stored.headers["x-exception-message"] == {"$str": "Ym9vbQBib29t"}
    assert run.rows["nul-in-message-id"].message_id == "id\ufffdwith\ufffdnul"


def test_timestamp_that_stock_pika_cannot_decode_is_kept_as_a_number(run: Run) -> None:
    assert run.rows["timestamp-beyond-year-9999"].headers["x-sent-at"] == {"$ts": 2**63}


def test_non_utf_8_header_name_is_kept_as_bytes(run: Run) -> None:
    headers = run.rows["non-utf-8-header-key"].headers
    assert [{"$bytes": "eC3//g=="}, "value"] in headers["$map"]


def test_a_body_over_the_limit_is_stored_cut_with_its_size_and_hash(run: Run) -> None:
    stored = run.rows["twenty-megabyte-body"]
    assert stored.body_size == 20 * 1024 * 1024
    assert len(stored.body) == settings.DLQ_MAX_BODY_BYTES == 16 * 1024 * 1024
    assert stored.body_truncated
    assert f"sha256 of the whole body {hashlib.sha256(BIG_BODY).hexdigest()}" in stored.parse_errors[-1]
