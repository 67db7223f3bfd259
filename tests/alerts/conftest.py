"""The alerts test world: a real local HTTP receiver for webhooks and a channel pointing at it, and dead letters
settled as an operation settles them (the dead letters and rules themselves come from tests/factories.py)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.db import transaction

from dlqconsole.alerts.models import Channel
from dlqconsole.deadletters.counters import add_counts
from dlqconsole.deadletters.models import DeadLetter, DeadLetterStatus
from tests.factories import ChannelFactory


def settle(letters: list[DeadLetter], *, status: str = DeadLetterStatus.REPLAYED) -> None:
    """Move dead letters out of parked the way an operation does: row and counter in one transaction."""
    with transaction.atomic():
        changes: dict[tuple[int, str, int, str], int] = {}
        for letter in letters:
            key = (letter.broker_id or 0, letter.source_queue, letter.pattern_id, letter.failure_reason)
            changes[key] = changes.get(key, 0) + 1
        DeadLetter.objects.filter(pk__in=[letter.pk for letter in letters]).update(status=status)
        add_counts(
            [(*cell, str(DeadLetterStatus.PARKED), -n) for cell, n in changes.items()]
            + [(*cell, status, n) for cell, n in changes.items()]
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
    return ChannelFactory.create(name="ops webhook", kind="webhook", target=receiver.url)
