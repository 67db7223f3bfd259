"""The operations test world: queues with a dead-letter queue on the real broker, dead letters that really died
there (or, for the big tests, envelopes shaped exactly like them), and a real Celery worker when one is needed."""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone
from pika.adapters.blocking_connection import BlockingChannel as Channel

from dlqconsole.core.amqp import connect
from dlqconsole.deadletters.models import DeadLetter
from dlqconsole.ingest.envelope import parse_envelope
from dlqconsole.ingest.services import ingest_batch

BASE_DIR = Path(__file__).resolve().parents[2]


def declare_with_dlq(channel: Channel, queue: str, **arguments: Any) -> None:
    """QUEUE dead-letters into QUEUE.dlx (fanout) → QUEUE.dlq, the console's topology."""
    channel.exchange_declare(exchange=queue + ".dlx", exchange_type="fanout", durable=True)
    channel.queue_declare(queue=queue + ".dlq", durable=True)
    channel.queue_bind(queue=queue + ".dlq", exchange=queue + ".dlx")
    channel.queue_declare(queue=queue, durable=True, arguments={"x-dead-letter-exchange": queue + ".dlx", **arguments})


def kill_on_broker(channel: Channel, queue: str, count: int) -> None:
    """Reject `count` messages from QUEUE without requeue, as a failing consumer does: they die into the DLQ."""
    for _ in range(count):
        method, _, _ = channel.basic_get(queue=queue)
        assert method is not None, f"{queue} ran dry"
        channel.basic_reject(delivery_tag=method.delivery_tag, requeue=False)


def ingest_from(channel: Channel, dlq: str) -> list[DeadLetter]:
    """Drain a DLQ into the database the way consume_dlq does (parse, ingest, then ack)."""
    letters = []
    tags = []
    while True:
        method, properties, body = channel.basic_get(queue=dlq)
        if method is None:
            break
        letters.append(parse_envelope(source_queue=dlq, body=body, properties=properties, now=timezone.now()))
        tags.append(method.delivery_tag)
    ingest_batch(letters=letters)
    for tag in tags:
        channel.basic_ack(delivery_tag=tag)
    return list(DeadLetter.objects.filter(dedupe_key__in=[letter.dedupe_key for letter in letters]).order_by("pk"))


def wait_for_depth(channel: Channel, queue: str, depth: int, *, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    current = -1
    while time.monotonic() < deadline:
        current = channel.queue_declare(queue=queue, passive=True).method.message_count
        if current >= depth:
            return current
        time.sleep(0.05)
    return current


def drain(channel: Channel, queue: str) -> list[tuple[pika.BasicProperties, bytes]]:
    found: list[tuple[pika.BasicProperties, bytes]] = []
    while True:
        method, properties, body = channel.basic_get(queue=queue, auto_ack=True)
        if method is None:
            return found
        found.append((properties, body))


def synthetic_dead_letters(
    *,
    queue: str,
    count: int,
    exchange: str = "",
    error: str = "Request timed out after 30s",
    start: int = 0,
    now: dt.datetime | None = None,
    extra_headers: dict[str, Any] | None = None,
) -> list[int]:
    """Ingest `count` dead letters shaped exactly as RabbitMQ delivers them from QUEUE.dlq (x-death and all),
    without making them die one by one on the broker: the big tests need thousands."""
    now = now or timezone.now()
    ids: list[int] = []
    for first in range(start, start + count, 1000):
        letters = []
        for n in range(first, min(start + count, first + 1000)):
            headers = {
                "x-death": [
                    {
                        "count": 1,
                        "reason": "rejected",
                        "queue": queue,
                        "time": dt.datetime(2026, 11, 20, 10, 0, tzinfo=dt.UTC),
                        "exchange": exchange,
                        "routing-keys": [queue],
                    }
                ],
                "x-first-death-queue": queue,
                "x-first-death-reason": "rejected",
                "x-first-death-exchange": exchange,
                "x-exception-message": error,
                "seq": n,
                **(extra_headers or {}),
            }
            properties = pika.BasicProperties(message_id=f"m-{n}", content_type="text/plain", headers=headers)
            letters.append(
                parse_envelope(
                    source_queue=queue + ".dlq", body=f"message {n}".encode(), properties=properties, now=now
                )
            )
        ingest_batch(letters=letters, now=now)
        ids.extend(
            DeadLetter.objects.filter(dedupe_key__in=[letter.dedupe_key for letter in letters]).values_list(
                "pk", flat=True
            )
        )
    return sorted(ids)


@pytest.fixture
def channel(amqp_channel: Channel) -> Channel:
    return amqp_channel


def subprocess_database_url() -> str:
    """The URL of the database the test runs against (pytest-django's test_<name>), for subprocesses."""
    database = settings.DATABASES["default"]
    if database["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{database['NAME']}"
    user = database.get("USER") or "postgres"
    host = database.get("HOST") or "127.0.0.1"
    port = database.get("PORT") or 5432
    return f"postgres://{user}@{host}:{port}/{connection.settings_dict['NAME']}"


class Worker:
    """A real Celery worker subprocess on this test run's queue and database."""

    def __init__(self, *, log: Path, env: dict[str, str], app: str, queue: str) -> None:
        self.log = log
        self.env = env
        self.app = app
        self.queue = queue
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
                self.queue,
            ],
            cwd=BASE_DIR,
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

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                # Celery's warm shutdown takes seconds even when idle; the tests are done with it by now.
                self.process.wait(timeout=1)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def celery_worker(tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    """Start workers with `celery_worker(**extra_env)` (the console's app on this run's queue, or another app and
    queue); every one is stopped (or killed) afterwards."""
    started: list[Worker] = []

    def start(*, app: str = "dlqconsole", queue: str = "", **extra_env: str) -> Worker:
        env = {
            **os.environ,
            "DATABASE_URL": subprocess_database_url(),
            "CELERY_TASK_DEFAULT_QUEUE": settings.CELERY_TASK_DEFAULT_QUEUE,
            "REDIS_URL": settings.REDIS_URL,
            "DLQ_VAR_DIR": str(tmp_path),
            "PYTHONUNBUFFERED": "1",
            **extra_env,
        }
        worker = Worker(
            log=tmp_path / f"worker-{len(started)}.log",
            env=env,
            app=app,
            queue=queue or settings.CELERY_TASK_DEFAULT_QUEUE,
        )
        worker.start()
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


@pytest.fixture(autouse=True)
def _purge_celery_queue() -> Iterator[None]:
    """Tasks one test enqueued must not run in the next test's worker."""
    yield
    connection_ = connect(settings.AMQP_URL)
    try:
        channel_ = connection_.channel()
        channel_.queue_declare(queue=settings.CELERY_TASK_DEFAULT_QUEUE, durable=True)
        channel_.queue_purge(queue=settings.CELERY_TASK_DEFAULT_QUEUE)
    except pika.exceptions.AMQPError:
        pass
    finally:
        if connection_.is_open:
            connection_.close()


@pytest.fixture
def refuse_deleting() -> Iterator[Callable[[int], None]]:
    """A database fault on the deletion of chosen dead letters (a PostgreSQL trigger raises), so the batch holding
    one rolls back the way a batch cut short by a lost connection or a killed worker does. Call it with the id of
    a dead letter whose deletion is to fail."""
    table = connection.ops.quote_name(DeadLetter._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE test_refused_deletion (id bigint PRIMARY KEY)")
        cursor.execute(
            "CREATE FUNCTION test_refuse_deletion() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "IF EXISTS (SELECT 1 FROM test_refused_deletion WHERE id = OLD.id) THEN "
            "RAISE EXCEPTION 'deletion of % refused', OLD.id; END IF; RETURN OLD; END $$"
        )
        cursor.execute(
            f"CREATE TRIGGER test_refuse_deletion BEFORE DELETE ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION test_refuse_deletion()"
        )

    def refuse(dead_letter_id: int) -> None:
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO test_refused_deletion (id) VALUES (%s)", [dead_letter_id])

    yield refuse
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TRIGGER IF EXISTS test_refuse_deletion ON {table}")
        cursor.execute("DROP FUNCTION IF EXISTS test_refuse_deletion()")
        cursor.execute("DROP TABLE IF EXISTS test_refused_deletion")
