"""consume_dlq with several consumer processes: they share the queues, report one total, a consumer process
that dies is restarted, and a killed parent does not leave consumers running on their own."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from dlqconsole.ingest import supervisor
from dlqconsole.ingest.supervisor import default_processes
from tests.ingest.conftest import ConsumerProcess, publish_dead_letters
from tests.ingest.test_consume import counters
from tests.support import ROOT, DeadLetterQueue, queue_depth, wait_until

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
    cores = len(psutil.Process().cpu_affinity() or [1])
    assert default_processes("postgresql") == min(4, cores, supervisor.cgroup_cpu_quota() or cores)


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
    assert "Traceback" not in consumer.output and "failed" not in consumer.output


def test_a_consumer_process_that_stops_unasked_is_replaced(
    dead_letter_queue: DeadLetterQueue, amqp_channel: Any, consume_dlq: Callable[..., ConsumerProcess]
) -> None:
    consumer = consume_dlq("--queues", dead_letter_queue.dlq, "--processes", "2", "--batch-seconds", "0.05")
    assert wait_until(lambda: consumer.output.count("consuming " + dead_letter_queue.dlq) == 2)

    psutil.Process(started_pids(consumer)[1]).terminate()  # someone's `kill <pid>`: a clean stop, exit code 0

    assert wait_until(lambda: len(started_pids(consumer)) == 3)
    assert "ended with exit code 0" in consumer.output
    publish_dead_letters(amqp_channel, dead_letter_queue, range(200), wait=False)
    assert wait_until(lambda: counters() == (200, 200, 200))
    consumer.signal(signal.SIGTERM)
    assert consumer.wait(timeout=30) == 0


CRASH_LOOP = """
import django, os
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dlqconsole.settings")
django.setup()
from dlqconsole.ingest import supervisor

supervisor.MAX_RESTART_DELAY = 0.05


def broken():
    raise RuntimeError("a setting the consumer cannot work with")


watcher = supervisor.Supervisor(2, broken)
watcher.run()
print("failed" if watcher.failed else "ok", watcher.stats.received)
"""


def test_a_crash_loop_gives_up_and_fails() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CRASH_LOOP], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )

    assert done.stdout.strip().splitlines()[-1] == "failed 0"
    assert "RuntimeError: a setting the consumer cannot work with" in done.stderr
    assert f"{supervisor.MAX_QUICK_FAILURES} times in a row" in done.stderr
    assert "giving up" in done.stderr


def test_cgroup_cpu_quota_caps_the_process_count(tmp_path: Path) -> None:
    quota = tmp_path / "cpu.max"
    quota.write_text("max 100000\n")
    assert supervisor.cgroup_cpu_quota(quota) is None
    quota.write_text("150000 100000\n")
    assert supervisor.cgroup_cpu_quota(quota) == 2
    quota.write_text("50000 100000\n")
    assert supervisor.cgroup_cpu_quota(quota) == 1
    assert supervisor.cgroup_cpu_quota(tmp_path / "missing") is None
