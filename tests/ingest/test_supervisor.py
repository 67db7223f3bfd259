"""consume_dlq with several consumer processes: they share the queues, report one total, a consumer process
that dies is restarted, and a killed parent does not leave consumers running on their own."""

from __future__ import annotations

import re
import signal
from collections.abc import Callable
from typing import Any

import psutil
import pytest

from dlqconsole.ingest.supervisor import default_processes
from tests.ingest.conftest import (
    ConsumerProcess,
    DeadLetterQueue,
    publish_dead_letters,
    queue_depth,
    wait_until,
)
from tests.ingest.test_consume import counters

pytestmark = pytest.mark.django_db(transaction=True)


def started_pids(consumer: ConsumerProcess) -> list[int]:
    return [int(pid) for pid in re.findall(r"consumer process \d+ started \(pid (\d+)\)", consumer.output)]


def gone(pid: int) -> bool:
    """Exited (a zombie waiting for its new parent to reap it counts as exited)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_default_is_one_process_per_core_on_postgresql_and_one_on_sqlite() -> None:
    assert default_processes("sqlite") == 1
    assert 1 <= default_processes("postgresql") <= 4
    assert default_processes("postgresql") == min(4, len(psutil.Process().cpu_affinity() or [1]))


def test_processes_share_the_queue_and_report_one_total(
    dead_letter_queue: DeadLetterQueue, amqp_channel: Any, consume_dlq: Callable[..., ConsumerProcess]
) -> None:
    publish_dead_letters(amqp_channel, dead_letter_queue, range(3000))

    consumer = consume_dlq(
        "--queues",
        dead_letter_queue.dlq,
        "--processes",
        "3",
        "--batch-size",
        "50",
        "--prefetch",
        "100",
        "--exit-when-idle",
        "2",
    )

    assert consumer.wait() == 0
    assert "3 consumer processes" in consumer.output
    assert "consume_dlq: 3000 received, 3000 new, 0 duplicates" in consumer.output
    assert counters() == (3000, 3000, 3000)
    assert queue_depth(dead_letter_queue.dlq) == 0
    # Every process took part: each logged its own share when it stopped.
    shares = [int(count) for count in re.findall(r"consume_dlq stopped: (\d+) received", consumer.output)]
    assert len(shares) == 3 and sum(shares) == 3000 and all(share > 0 for share in shares)
    assert len(set(started_pids(consumer))) == 3


def test_a_consumer_process_that_dies_is_restarted(
    dead_letter_queue: DeadLetterQueue, amqp_channel: Any, consume_dlq: Callable[..., ConsumerProcess]
) -> None:
    consumer = consume_dlq("--queues", dead_letter_queue.dlq, "--processes", "2", "--batch-seconds", "0.05")
    assert wait_until(lambda: consumer.output.count("consuming " + dead_letter_queue.dlq) == 2)
    victim = started_pids(consumer)[0]

    psutil.Process(victim).kill()

    assert wait_until(lambda: len(started_pids(consumer)) == 3)
    assert "ended with signal SIGKILL" in consumer.output
    assert wait_until(lambda: consumer.output.count("consuming " + dead_letter_queue.dlq) == 3)
    publish_dead_letters(amqp_channel, dead_letter_queue, range(500), wait=False)
    assert wait_until(lambda: counters() == (500, 500, 500))
    consumer.signal(signal.SIGTERM)
    assert consumer.wait(timeout=30) == 0
    assert queue_depth(dead_letter_queue.dlq) == 0
    assert all(gone(pid) for pid in started_pids(consumer))


def test_consumer_processes_stop_when_the_parent_is_killed(
    dead_letter_queue: DeadLetterQueue, consume_dlq: Callable[..., ConsumerProcess]
) -> None:
    consumer = consume_dlq("--queues", dead_letter_queue.dlq, "--processes", "2")
    assert wait_until(lambda: consumer.output.count("consuming " + dead_letter_queue.dlq) == 2)
    children = started_pids(consumer)
    assert len(children) == 2 and not any(gone(pid) for pid in children)

    consumer.signal(signal.SIGKILL)
    consumer.wait(timeout=30)

    # Told by the kernel (SIGTERM on the parent's death), each stops cleanly on its own.
    assert wait_until(lambda: all(gone(pid) for pid in children), timeout=30)
    assert wait_until(lambda: consumer.output.count("consume_dlq stopped:") == 2)
