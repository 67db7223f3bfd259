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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from dlqconsole.ingest.consumer import DeadLetterConsumer
from tests.factories import dead_letter_properties
from tests.support import ROOT, DeadLetterQueue, declare_with_dlq, subprocess_database_url, wait_for_depth


@pytest.fixture
def dead_letter_queue(queue_name: Callable[[str], str], amqp_channel: Any) -> DeadLetterQueue:
    return declare_with_dlq(amqp_channel, queue_name("orders"))


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
