"""Helpers every test folder shares: the broker's dead-letter topology, waiting on a queue, dead letters that die on
the real broker and are ingested as consume_dlq ingests them, and real subprocesses (a Celery worker) on the test's
database. The fixtures built on them (`celery_worker`, `migrate`) are in tests/conftest.py; the rows and messages
the tests start from are made by tests/factories.py."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pika
import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone
from pika.adapters.blocking_connection import BlockingChannel

from dlqconsole.brokers import registry
from dlqconsole.brokers.models import Broker
from dlqconsole.core.amqp import connect
from dlqconsole.deadletters.models import DeadLetter
from dlqconsole.ingest.envelope import ParsedDeadLetter, broker_scope, parse_envelope
from dlqconsole.ingest.services import ingest_batch
from dlqconsole.operations.models import Operation

ROOT = Path(__file__).resolve().parents[1]


# The broker -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeadLetterQueue:
    work: str
    dlq: str


def declare_with_dlq(channel: BlockingChannel, work: str, **arguments: Any) -> DeadLetterQueue:
    """WORK dead-letters into WORK.dlx (fanout) → WORK.dlq, the console's topology."""
    channel.exchange_declare(exchange=f"{work}.dlx", exchange_type="fanout", durable=True)
    channel.queue_declare(queue=f"{work}.dlq", durable=True)
    channel.queue_bind(queue=f"{work}.dlq", exchange=f"{work}.dlx")
    channel.queue_declare(queue=work, durable=True, arguments={"x-dead-letter-exchange": f"{work}.dlx", **arguments})
    return DeadLetterQueue(work=work, dlq=f"{work}.dlq")


def wait_for_depth(channel: BlockingChannel, queue: str, depth: int, timeout: float = 15.0) -> int:
    """Wait until QUEUE holds at least `depth` messages; returns the depth it reached (less on a timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        count = int(channel.queue_declare(queue=queue, passive=True).method.message_count)
        if count >= depth or time.monotonic() > deadline:
            return count
        time.sleep(0.05)


def wait_until(condition: Callable[[], bool], timeout: float = 30.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return condition()


def wait_for(operation: Operation, *statuses: str, timeout: float) -> Operation:
    """Wait until the operation reaches one of `statuses`; fail naming the one it is in."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        operation.refresh_from_db()
        if operation.status in statuses:
            return operation
        time.sleep(0.1)
    raise AssertionError(f"operation {operation.pk} is {operation.status} after {timeout}s, not {statuses}")


def queue_depth(queue: str) -> int:
    amqp = connect()
    try:
        return int(amqp.channel().queue_declare(queue=queue, passive=True).method.message_count)
    finally:
        amqp.close()


def kill_on_broker(channel: BlockingChannel, queue: str, count: int) -> None:
    """Reject `count` messages from QUEUE without requeue, as a failing consumer does: they die into the DLQ."""
    for _ in range(count):
        method = None
        for _attempt in range(100):
            method, _, _ = channel.basic_get(queue=queue)
            if method is not None:
                break
            time.sleep(0.05)
        assert method is not None, f"{queue} ran dry"
        channel.basic_reject(delivery_tag=method.delivery_tag, requeue=False)


def die_on_broker(
    channel: BlockingChannel, queue: str, bodies: list[bytes], *, headers: dict[str, Any] | None = None
) -> None:
    """Publish each body to QUEUE and reject it without requeue, as a failing consumer does."""
    for number, body in enumerate(bodies):
        channel.basic_publish(
            exchange="",
            routing_key=queue,
            body=body,
            properties=pika.BasicProperties(
                message_id=f"{queue}-{number}", content_type="application/json", headers=dict(headers or {})
            ),
        )
    kill_on_broker(channel, queue, len(bodies))


def ingest_from(
    channel: BlockingChannel, dlq: str, *, expect: int | None = None, broker: Broker | None = None
) -> list[DeadLetter]:
    """Drain a DLQ into the database the way consume_dlq does (parse, ingest, then ack), as a DLQ of `broker`
    (default unless given). With `expect`, wait up to 10 s for that many messages and check that many came."""
    scope = broker_scope(broker.pk, default=broker.is_default) if broker is not None else ""
    letters: list[ParsedDeadLetter] = []
    tags: list[int] = []
    deadline = time.monotonic() + 10
    while True:
        method, properties, body = channel.basic_get(queue=dlq)
        if method is None:
            if expect is None or len(letters) >= expect or time.monotonic() > deadline:
                break
            time.sleep(0.05)
            continue
        letters.append(
            parse_envelope(
                source_queue=dlq,
                body=body,
                properties=properties,
                now=timezone.now(),
                broker_id=broker.pk if broker is not None else None,
                broker_scope=scope,
            )
        )
        tags.append(method.delivery_tag)
    ingest_batch(letters=letters)
    for tag in tags:
        channel.basic_ack(delivery_tag=tag)
    if expect is not None:
        assert len(letters) == expect
    return list(DeadLetter.objects.filter(dedupe_key__in=[letter.dedupe_key for letter in letters]).order_by("pk"))


def drain(channel: BlockingChannel, queue: str) -> list[tuple[pika.BasicProperties, bytes]]:
    found: list[tuple[pika.BasicProperties, bytes]] = []
    while True:
        method, properties, body = channel.basic_get(queue=queue, auto_ack=True)
        if method is None:
            return found
        found.append((properties, body))


@dataclass(frozen=True)
class Vhost:
    """A virtual host of the local RabbitMQ made for one test, and the AMQP URL of guest on it."""

    name: str
    url: str

    def revoke(self) -> None:
        """Take guest's permissions away and close guest's connections to it: the broker refuses us."""
        rabbitmqctl("clear_permissions", "-p", self.name, "guest")
        listed = rabbitmqctl("list_connections", "pid", "vhost", "--no-table-headers", "-q")
        for line in listed.splitlines():
            pid, _, vhost = line.partition("\t")
            if vhost.strip() == self.name:
                rabbitmqctl("close_connection", pid.strip(), "access revoked by a test", check=False)

    def grant(self) -> None:
        rabbitmqctl("set_permissions", "-p", self.name, "guest", ".*", ".*", ".*")


def rabbitmqctl(*arguments: str, check: bool = True) -> str:
    done = subprocess.run(["rabbitmqctl", *arguments], capture_output=True, text=True, timeout=60, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"rabbitmqctl {' '.join(arguments)} failed: {done.stderr.strip()[:500]}")
    return done.stdout


@contextlib.contextmanager
def vhost_broker(settings: Any, name: str) -> Iterator[Vhost]:
    """A virtual host of its own on the local RabbitMQ, as the broker `name` (DLQ_BROKERS) beside default; deleted
    with everything in it afterwards."""
    vhost_name = f"dlqtest-{uuid.uuid4().hex[:10]}"
    rabbitmqctl("add_vhost", vhost_name)
    vhost = Vhost(name=vhost_name, url=f"amqp://guest:guest@127.0.0.1:5672/{vhost_name}")
    try:
        vhost.grant()
        settings.DLQ_BROKERS = {name: vhost.url}
        registry.forget()
        yield vhost
    finally:
        rabbitmqctl("delete_vhost", vhost_name, check=False)


# Subprocesses on the test's database ----------------------------------------------------------------------------


def subprocess_database_url() -> str:
    """The URL of the database this test runs against (pytest-django's test_<name>), for subprocesses."""
    database = connection.settings_dict
    if database["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{database['NAME']}"
    user = database.get("USER") or "postgres"
    password = f":{database['PASSWORD']}" if database.get("PASSWORD") else ""
    host = f"{database.get('HOST') or '127.0.0.1'}:{database.get('PORT') or 5432}"
    return f"postgres://{user}{password}@{host}/{database['NAME']}"


class Worker:
    """A real Celery worker subprocess on this test run's queues and database."""

    def __init__(self, *, log: Path, env: dict[str, str], app: str, queues: list[str]) -> None:
        self.log = log
        self.env = env
        self.app = app
        self.queues = queues
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        handle = self.log.open("ab")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                self.app,
                "worker",
                "--pool=solo",
                # A unique node name: workers of other tests (and other people) on this broker must not clash.
                f"--hostname=test-{uuid.uuid4().hex[:12]}@%h",
                "--without-heartbeat",
                "--without-gossip",
                "--without-mingle",
                "--loglevel=INFO",
                "-Q",
                ",".join(self.queues),
            ],
            cwd=ROOT,
            env=self.env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_until_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if b" ready." in self.log.read_bytes():
                return
            assert self.process is not None and self.process.poll() is None, self.log.read_text()[-3000:]
            time.sleep(0.1)
        raise AssertionError(f"worker not ready after {timeout}s:\n{self.log.read_text()[-3000:]}")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self, grace: float = 1.0) -> None:
        """SIGTERM, then SIGKILL after `grace` seconds (Celery's warm shutdown takes seconds even when idle)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.kill()


def worker_environment(tmp_path: Path, extra: dict[str, str]) -> dict[str, str]:
    env = {
        **os.environ,
        "DATABASE_URL": subprocess_database_url(),
        "CELERY_TASK_DEFAULT_QUEUE": settings.CELERY_TASK_DEFAULT_QUEUE,
        "REDIS_URL": settings.REDIS_URL,
        "DLQ_VAR_DIR": str(tmp_path),
        "PYTHONUNBUFFERED": "1",
        **extra,
    }
    # The browser tests allow the ORM in Playwright's event loop; the worker has no such loop.
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    return env


# Celery task arguments ------------------------------------------------------------------------------------------

# A nested value no task takes as an argument, for the tests that send hostile arguments.
NESTED = {"nested": {"dict": {"deeper": [1, 2, {"x": None}]}}}


def refusals(caplog: pytest.LogCaptureFixture, task: str) -> list[str]:
    """The lines logged by the argument checks of Celery tasks (dlqconsole.core.taskargs) for TASK: each an error
    of one line, without a traceback."""
    found = [record for record in caplog.records if record.name == "dlqconsole.core.taskargs"]
    assert all(record.levelname == "ERROR" and record.exc_info is None for record in found)
    return [record.getMessage() for record in found if f"task {task} refused" in record.getMessage()]
