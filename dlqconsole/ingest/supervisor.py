"""consume_dlq over several processes: one DeadLetterConsumer per process, all on the same queues, under a parent
that restarts a child that dies and stops them all on SIGTERM or SIGINT.

Why processes: a consumer is CPU-bound in Python (AMQP frame decoding, envelope parsing, grouping, COPY rows)
and one process runs Python on one core whatever its threads do. RabbitMQ spreads a queue's deliveries over its
consumers, and ingest is idempotent and safe with concurrent writers (dedupe keys, patterns filed under row
locks), so N processes drain up to N times as fast. Each child keeps every guarantee of a single consumer: it
acks only what it committed, and whatever it holds unacked when it dies goes back to the queue.

The parent only forks, waits and forwards signals: it holds no database or AMQP connection. Each child asks the
kernel for SIGTERM when the parent dies (Linux), so a parent killed with SIGKILL does not leave consumers
running on their own; they finish their batch and stop. Children report their counts to the parent through a
pipe when they stop; the parent adds them up.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from types import FrameType
from typing import NoReturn

from django.db import connections

from dlqconsole.ingest.consumer import ConsumerStats, DeadLetterConsumer

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
# A child that dies sooner than this after its start is restarted with a growing delay (a crash loop, such as
# one on a bad setting, must not spin); one that ran longer is restarted at once.
HEALTHY_SECONDS = 10.0
MAX_RESTART_DELAY = 30.0


def default_processes(vendor: str) -> int:
    """One consumer per core the process may use, at most four; one on SQLite, where there is one writer."""
    if vendor != "postgresql":
        return 1
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(4, cores))


@dataclass
class Child:
    index: int
    pid: int
    stats_fd: int
    started_at: float
    failures: int = 0


class Supervisor:
    def __init__(self, count: int, make_consumer: Callable[[], DeadLetterConsumer]) -> None:
        self.count = count
        self.make_consumer = make_consumer
        self.children: dict[int, Child] = {}
        self.stats = ConsumerStats()
        self.stopping = False
        self.parent_pid = os.getpid()
        self.crashes = 0

    def run(self) -> ConsumerStats:
        # Connections opened before the fork would be shared by every child: close them; each child opens its own.
        connections.close_all()
        for index in range(self.count):
            self.spawn(index)
        previous = {number: signal.signal(number, self.on_signal) for number in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.wait_for_children()
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)
        return self.stats

    def on_signal(self, number: int, frame: FrameType | None) -> None:
        log.info("%s received; stopping %d consumer processes", signal.Signals(number).name, len(self.children))
        self.stopping = True
        for pid in list(self.children):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue

    def spawn(self, index: int, failures: int = 0) -> None:
        read_fd, write_fd = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            self.run_child(write_fd)
        os.close(write_fd)
        self.children[pid] = Child(index, pid, read_fd, time.monotonic(), failures)
        log.info("consumer process %d started (pid %d)", index + 1, pid)

    def run_child(self, stats_fd: int) -> NoReturn:
        """The child's whole life: consume until stopped or idle, send the counts, exit. Never returns."""
        code = 1
        consumer: DeadLetterConsumer | None = None
        stop_requested = False

        def stop(number: int, frame: FrameType | None) -> None:
            nonlocal stop_requested
            stop_requested = True
            if consumer is not None:
                consumer.stop()

        try:
            signal.signal(signal.SIGTERM, stop)
            signal.signal(signal.SIGINT, stop)
            for child in self.children.values():
                os.close(child.stats_fd)
            self.children = {}
            _die_with_parent(self.parent_pid)
            consumer = self.make_consumer()
            if stop_requested:
                consumer.stop()
            consumer.run()
            payload = asdict(consumer.stats)
            payload["per_queue"] = dict(consumer.stats.per_queue)
            os.write(stats_fd, json.dumps(payload).encode())
            code = 0
        except BaseException:  # noqa: BLE001  (reported; the parent restarts the child)
            log.exception("consumer process %d failed", os.getpid())
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    def wait_for_children(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                return
            child = self.children.pop(pid, None)
            if child is None:
                continue
            self.add_stats(child.stats_fd)
            code = os.waitstatus_to_exitcode(status)
            if code == 0:
                log.info("consumer process %d (pid %d) stopped", child.index + 1, pid)
                continue
            self.crashes += 1
            lived = time.monotonic() - child.started_at
            failures = 0 if lived >= HEALTHY_SECONDS else child.failures + 1
            how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
            if self.stopping:
                log.warning("consumer process %d (pid %d) ended with %s while stopping", child.index + 1, pid, how)
                continue
            delay = min(MAX_RESTART_DELAY, 0.5 * 2**failures) if failures else 0.0
            log.error(
                "consumer process %d (pid %d) ended with %s after %.1f s; its unacked deliveries go back to the "
                "queue; restarting it in %.1f s",
                child.index + 1,
                pid,
                how,
                lived,
                delay,
            )
            self.sleep(delay)
            if not self.stopping:
                self.spawn(child.index, failures)

    def add_stats(self, stats_fd: int) -> None:
        chunks = []
        while chunk := os.read(stats_fd, 65536):
            chunks.append(chunk)
        os.close(stats_fd)
        if not chunks:
            return  # the child died before it could report (killed): its batches were counted in IngestStat
        try:
            payload = json.loads(b"".join(chunks))
        except ValueError:
            log.warning("a consumer process sent unreadable counts")
            return
        for item in fields(ConsumerStats):
            if item.name == "per_queue":
                self.stats.per_queue.update(Counter(payload.get("per_queue", {})))
            else:
                setattr(self.stats, item.name, getattr(self.stats, item.name) + int(payload.get(item.name, 0)))

    def sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.stopping and time.monotonic() < deadline:
            time.sleep(min(0.1, deadline - time.monotonic()))


def _die_with_parent(parent_pid: int) -> None:
    """Ask for SIGTERM when the parent dies (Linux); stop at once if it is already gone."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        log.debug("prctl is not available; a consumer process outlives a killed parent")
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), signal.SIGTERM)
