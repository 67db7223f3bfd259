"""Dead letters made by the real broker, and consume_dlq as a real process.

`dead_letter_queue` declares a work queue whose dead-letter exchange (fanout) feeds `<work>.dlq`; messages
published to the work queue with a per-message TTL of 0 are dead-lettered by RabbitMQ at once (reason
`expired`, with x-death), which is the quickest way to have the broker itself produce many dead letters.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pika
import psutil
import pytest
from django.db import connection

from dlqconsole.core.amqp import connect
from dlqconsole.ingest.consumer import DeadLetterConsumer

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class DeadLetterQueue:
    work: str
    dlq: str


def declare_dead_letter_queue(channel: Any, work: str) -> DeadLetterQueue:
    channel.exchange_declare(exchange=f"{work}.dlx", exchange_type="fanout", durable=True)
    channel.queue_declare(queue=f"{work}.dlq", durable=True)
    channel.queue_bind(queue=f"{work}.dlq", exchange=f"{work}.dlx")
    channel.queue_declare(queue=work, durable=True, arguments={"x-dead-letter-exchange": f"{work}.dlx"})
    return DeadLetterQueue(work=work, dlq=f"{work}.dlq")


@pytest.fixture
def dead_letter_queue(queue_name: Callable[[str], str], amqp_channel: Any) -> DeadLetterQueue:
    return declare_dead_letter_queue(amqp_channel, queue_name("orders"))


def dead_letter_properties(index: int, **overrides: Any) -> pika.BasicProperties:
    """Properties of a realistic failed message; expiration "0" makes the broker dead-letter it at once."""
    values: dict[str, Any] = {
        "message_id": f"m-{index}",
        "content_type": "application/json",
        "delivery_mode": 2,
        "expiration": "0",
        "headers": {
            "x-exception-type": ["TimeoutError", "ValidationError", "ConnectionResetError"][index % 3],
            "x-exception-message": [
                f"Request to payments-{index % 40} timed out after {index}ms",
                f"Field amount_{index % 50} of order {index} is invalid",
                f"Connection reset by peer (node {index % 30})",
            ][index % 3],
        },
    }
    values.update(overrides)
    return pika.BasicProperties(**values)


def publish_dead_letters(
    channel: Any, queue: DeadLetterQueue, indexes: range, *, wait: bool = True, timeout: float = 60
) -> None:
    """Publish one message per index to the work queue; the broker dead-letters each into the DLQ."""
    for index in indexes:
        channel.basic_publish(
            exchange="",
            routing_key=queue.work,
            body=f'{{"order": {index}}}'.encode(),
            properties=dead_letter_properties(index),
        )
    if wait:
        assert wait_for_depth(channel, queue.dlq, len(indexes), timeout=timeout) == len(indexes)


def wait_for_depth(channel: Any, queue: str, depth: int, timeout: float = 15.0) -> int:
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


def queue_depth(queue: str) -> int:
    amqp = connect()
    try:
        return int(amqp.channel().queue_declare(queue=queue, passive=True).method.message_count)
    finally:
        amqp.close()


def subprocess_database_url() -> str:
    """The URL of the database this test runs against (pytest-django's test_<name>), for subprocesses."""
    settings = connection.settings_dict
    assert settings["ENGINE"] == "django.db.backends.postgresql", "consumer subprocesses need PostgreSQL"
    user = settings.get("USER") or "postgres"
    password = f":{settings['PASSWORD']}" if settings.get("PASSWORD") else ""
    host = f"{settings.get('HOST') or '127.0.0.1'}:{settings.get('PORT') or 5432}"
    return f"postgres://{user}{password}@{host}/{settings['NAME']}"


class ConsumerProcess:
    """`manage.py consume_dlq` in a subprocess, with its output kept in a file for assertions."""

    def __init__(self, arguments: list[str], *, database_url: str, log_path: Path, env: dict[str, str]) -> None:
        self.log_path = log_path
        self.log = log_path.open("ab")
        environment = dict(os.environ, DATABASE_URL=database_url, LOG_LEVEL="INFO", PYTHONUNBUFFERED="1")
        environment.pop("DLQ_QUEUES", None)
        environment.update(env)
        self.process = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "consume_dlq", *arguments],
            cwd=ROOT,
            env=environment,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    @property
    def output(self) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.process.poll() is None

    def signal(self, number: int) -> None:
        if self.alive():
            self.process.send_signal(number)

    def children(self) -> list[psutil.Process]:
        """Its consumer processes, when it runs several."""
        try:
            return psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def kill_tree(self) -> None:
        """SIGKILL the command and its consumer processes at the same moment."""
        for process in [*self.children(), psutil.Process(self.process.pid)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        self.process.wait(timeout=30)

    def wait(self, timeout: float = 120) -> int:
        try:
            return self.process.wait(timeout=timeout)
        finally:
            self.log.flush()

    def kill(self) -> None:
        if self.alive():
            self.process.kill()
            self.process.wait(timeout=30)
        self.log.close()


@pytest.fixture
def consume_dlq(tmp_path: Path) -> Iterator[Callable[..., ConsumerProcess]]:
    """Starts consume_dlq processes against this test's database; kills whatever is left at the end."""
    started: list[ConsumerProcess] = []

    def start(*arguments: str, database_url: str | None = None, **env: str) -> ConsumerProcess:
        process = ConsumerProcess(
            list(arguments),
            database_url=database_url or subprocess_database_url(),
            log_path=tmp_path / f"consume_dlq-{len(started)}.log",
            env=env,
        )
        started.append(process)
        return process

    yield start
    for process in started:
        if process.alive():
            process.kill_tree()
        process.kill()


@pytest.fixture
def make_consumer() -> Iterator[Callable[..., DeadLetterConsumer]]:
    """Builds in-process consumers for step-by-step tests and shuts each down at the end (its writer thread
    holds a database connection that would otherwise outlive the test database)."""
    made: list[DeadLetterConsumer] = []

    def make(**options: Any) -> DeadLetterConsumer:
        consumer = DeadLetterConsumer(**options)
        made.append(consumer)
        return consumer

    yield make
    for consumer in made:
        consumer.shutdown()
