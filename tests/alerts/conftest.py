"""The alerts test world: dead letters ingested through the real ingest service (so the counters are exact), a
real local HTTP receiver for webhooks, and channels pointing at it."""

from __future__ import annotations

import itertools
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.migrations.executor import MigrationExecutor

from dlqconsole.alerts.models import AlertRule, Channel
from dlqconsole.deadletters.counters import add_counts
from dlqconsole.deadletters.models import DeadLetter, DeadLetterStatus
from dlqconsole.ingest.envelope import ParsedDeadLetter
from dlqconsole.ingest.services import ingest_batch

_serial = itertools.count()


def ingest(
    count: int = 1,
    *,
    queue: str = "orders.dlq",
    error_type: str = "TimeoutError",
    message: str = "Request timed out after 30000ms",
    reason: str = "TIMEOUT",
) -> list[DeadLetter]:
    """Store `count` new dead letters through ingest_batch and return them."""
    letters = [
        ParsedDeadLetter(
            source_queue=queue,
            body=b"{}",
            dedupe_key=f"{uuid.uuid4().hex}{next(_serial)}",
            original_queue=queue.removesuffix(".dlq"),
            error_type=error_type,
            error_message=message,
            failure_reason=reason,
        )
        for _ in range(count)
    ]
    ingest_batch(letters=letters)
    return list(DeadLetter.objects.filter(dedupe_key__in=[letter.dedupe_key for letter in letters]))


def settle(letters: list[DeadLetter], *, status: str = DeadLetterStatus.REPLAYED) -> None:
    """Move dead letters out of parked the way an operation does: row and counter in one transaction."""
    with transaction.atomic():
        changes: dict[tuple[str, int, str], int] = {}
        for letter in letters:
            key = (letter.source_queue, letter.pattern_id, letter.failure_reason)
            changes[key] = changes.get(key, 0) + 1
        DeadLetter.objects.filter(pk__in=[letter.pk for letter in letters]).update(status=status)
        add_counts(
            [(queue, pattern, reason, DeadLetterStatus.PARKED, -n) for (queue, pattern, reason), n in changes.items()]
            + [(queue, pattern, reason, status, n) for (queue, pattern, reason), n in changes.items()]
        )


@dataclass
class Received:
    at: float
    path: str
    body: dict[str, Any]
    # The body exactly as it came (a signature covers these bytes) and the request's headers, names in lower case.
    raw: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Receiver:
    """A real HTTP server on 127.0.0.1 that records what it is sent and answers as told."""

    status: int = 200
    delay: float = 0.0
    received: list[Received] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {"raw": raw.decode("utf-8", "replace")}
                headers = {name.lower(): value for name, value in self.headers.items()}
                receiver.received.append(Received(time.monotonic(), self.path, body, raw, headers))
                if receiver.delay:
                    time.sleep(receiver.delay)
                try:
                    self.send_response(receiver.status)
                    self.send_header("Content-Type", "text/plain")
                    self.end_headers()
                    self.wfile.write(b"ok" if receiver.status < 400 else b"nope")
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def wait_for(self, predicate: Callable[[Received], bool], *, timeout: float) -> Received | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for item in list(self.received):
                if predicate(item):
                    return item
            time.sleep(0.05)
        return None


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver().start()
    yield server
    server.stop()


@pytest.fixture
def webhook(db: None, receiver: Receiver) -> Channel:
    return Channel.objects.create(name="ops webhook", kind="webhook", target=receiver.url)


def rule(kind: str, *, channels: list[Channel] | None = None, **fields: Any) -> AlertRule:
    """A rule of the given kind; the default rules of the data migration are switched off so only it speaks."""
    AlertRule.objects.exclude(name__startswith="test ").update(enabled=False)
    created = AlertRule.objects.create(name=f"test {kind} {uuid.uuid4().hex[:6]}", kind=kind, **fields)
    if channels:
        created.channels.set(channels)
    return created


@pytest.fixture
def migrate() -> Iterator[Any]:
    """migrate(targets) -> the historical apps at that state; the database is migrated forward again after."""

    def to(targets: list[tuple[str, str]]) -> Any:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(targets)
        return executor.loader.project_state(targets).apps

    yield to
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())
