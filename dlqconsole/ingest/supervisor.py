"""consume_dlq over several processes: one DeadLetterConsumer per process, all on the same queues, under a parent
that restarts a child that dies and stops them all on SIGTERM or SIGINT.

Why processes: a consumer is CPU-bound in Python (AMQP frame decoding, envelope parsing, grouping, COPY rows)
and one process runs Python on one core whatever its threads do. RabbitMQ spreads a queue's deliveries over its
consumers, and ingest is idempotent and safe with concurrent writers (dedupe keys, patterns filed under row
locks), so N processes drain up to N times as fast. Each child keeps every guarantee of a single consumer: it
acks only what it committed, and whatever it holds unacked when it dies goes back to the queue.

The parent only forks, reaps, restarts and forwards signals, in a loop that polls every 0.1 s: it holds no
database or AMQP connection. Signal handlers only set a flag and signal the children; SIGTERM and SIGINT are
blocked around each fork, so a stop request that arrives while a child is being started reaches that child too.
Each child asks the kernel for SIGTERM when the parent dies (Linux), so a parent killed with SIGKILL does not
leave consumers running on their own; they finish their batch and stop. Children report their counts through a
pipe when they stop (a few hundred bytes: never enough to block); the parent adds them up.

Failures: a child that dies is restarted, at once if it had run for HEALTHY_SECONDS, else after a growing delay;
after MAX_QUICK_FAILURES quick deaths in a row the parent gives up, stops the others and exits non-zero (a
crash loop, such as one on a bad setting, must reach systemd, Docker or honcho). A child that does not stop
within STOP_GRACE_SECONDS of a stop request is killed (its unacked deliveries are redelivered).
"""

from __future__ import annotations

import ctypes
import json
import logging
import math
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from types import FrameType
from typing import NoReturn

from django.db import connections

from dlqconsole.ingest.broker_consumers import BrokerConsumers
from dlqconsole.ingest.consumer import ConsumerStats

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}
HEALTHY_SECONDS = 10.0
MAX_RESTART_DELAY = 30.0
MAX_QUICK_FAILURES = 5
STOP_GRACE_SECONDS = 60.0
POLL_SECONDS = 0.1
# Counts a child reports: the totals the command prints (per-queue counts stay in the child's log line).
REPORTED = [item.name for item in fields(ConsumerStats) if item.name != "per_queue"]


def default_processes(vendor: str) -> int:
    """One consumer per core the process may use (CPU affinity and a cgroup CPU quota), at most four; one on
    SQLite, where there is one writer."""
    if vendor != "postgresql":
        return 1
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    if quota is not None:
        cores = min(cores, quota)
    return max(1, min(4, cores))


def cgroup_cpu_quota(path: Path = Path("/sys/fs/cgroup/cpu.max")) -> int | None:
    """Whole CPUs a cgroup v2 quota allows (`docker run --cpus 1.5` gives 2), or None without a quota."""
    try:
        quota, _, period = path.read_text().strip().partition(" ")
        if quota == "max":
            return None
        return max(1, math.ceil(int(quota) / int(period or 100000)))
    except (OSError, ValueError, ZeroDivisionError):
        return None


@dataclass
class Child:
    index: int
    pid: int
    stats_fd: int
    started_at: float
    failures: int = 0


class Supervisor:
    def __init__(
        self, count: int, make_consumer: Callable[[], BrokerConsumers], *, exit_when_idle: bool = False
    ) -> None:
        self.count = count
        self.make_consumer = make_consumer
        # With --exit-when-idle a child that finishes is done; otherwise any child that ends is replaced.
        self.exit_when_idle = exit_when_idle
        self.children: dict[int, Child] = {}
        # index -> (when to start it again, quick failures so far)
        self.restarts: dict[int, tuple[float, int]] = {}
        self.stats = ConsumerStats()
        self.stopping = False
        self.stop_deadline = math.inf
        self.failed = False
        self.parent_pid = os.getpid()

    def run(self) -> ConsumerStats:
        """Start the children and supervise them until all have stopped. `failed` says whether one ended badly."""
        # Connections opened before the fork would be shared by every child: close them; each child opens its own.
        connections.close_all()
        previous = {number: signal.signal(number, self.on_signal) for number in STOP_SIGNALS}
        try:
            for index in range(self.count):
                if not self.stopping:
                    self.spawn(index)
            self.loop()
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)
        return self.stats

    def on_signal(self, number: int, frame: FrameType | None) -> None:
        if not self.stopping:
            log.info("%s received; stopping %d consumer processes", signal.Signals(number).name, len(self.children))
        self.stop()

    def stop(self) -> None:
        if not self.stopping:
            self.stopping = True
            self.stop_deadline = time.monotonic() + STOP_GRACE_SECONDS
            self.restarts.clear()
        self.signal_children(signal.SIGTERM)

    def signal_children(self, number: int) -> None:
        for pid in list(self.children):
            try:
                os.kill(pid, number)
            except ProcessLookupError:
                continue

    def spawn(self, index: int, failures: int = 0) -> None:
        read_fd, write_fd = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        # A stop request during the fork stays pending until the child is registered (parent) or has its own
        # handler (child), so neither misses it.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            self.run_child(write_fd, mask)
        try:
            os.close(write_fd)
            self.children[pid] = Child(index, pid, read_fd, time.monotonic(), failures)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        log.info("consumer process %d started (pid %d)", index + 1, pid)
        if self.stopping:
            os.kill(pid, signal.SIGTERM)

    def run_child(self, stats_fd: int, mask: set[int | signal.Signals]) -> NoReturn:
        """The child's whole life: consume until stopped or idle, send the counts, exit. Never returns."""
        code = 1
        consumer: BrokerConsumers | None = None
        stop_requested = False

        def stop(number: int, frame: FrameType | None) -> None:
            nonlocal stop_requested
            stop_requested = True
            if consumer is not None:
                consumer.stop()

        try:
            for number in STOP_SIGNALS:
                signal.signal(number, stop)
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            for child in self.children.values():
                os.close(child.stats_fd)
            self.children = {}
            _die_with_parent(self.parent_pid)
            consumer = self.make_consumer()
            if stop_requested:
                consumer.stop()
            consumer.run()
            code = 0
            self.report(stats_fd, consumer.stats)
        except BaseException:  # noqa: BLE001  (reported; the parent restarts the child)
            log.exception("consumer process %d failed", os.getpid())
        finally:
            connections.close_all()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    def report(self, stats_fd: int, stats: ConsumerStats) -> None:
        if os.getppid() != self.parent_pid:
            return  # the parent is gone (killed): nobody to tell
        payload = {name: value for name, value in asdict(stats).items() if name in REPORTED}
        try:
            os.write(stats_fd, json.dumps(payload).encode())
        except BrokenPipeError:
            log.debug("the parent stopped listening before the counts were sent")

    def loop(self) -> None:
        while self.children or self.restarts:
            self.reap()
            now = time.monotonic()
            for index, (at, failures) in list(self.restarts.items()):
                if now >= at:
                    del self.restarts[index]
                    self.spawn(index, failures)
            if self.stopping and now >= self.stop_deadline and self.children:
                log.warning(
                    "%d consumer processes did not stop within %.0f s; killing them (their unacked deliveries are "
                    "redelivered)",
                    len(self.children),
                    STOP_GRACE_SECONDS,
                )
                self.failed = True
                self.signal_children(signal.SIGKILL)
                self.stop_deadline = math.inf
            if self.children or self.restarts:
                time.sleep(POLL_SECONDS)

    def reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                self.children.clear()
                return
            if pid == 0:
                return
            child = self.children.pop(pid, None)
            if child is not None:
                self.add_stats(child.stats_fd)
                self.ended(child, os.waitstatus_to_exitcode(status))

    def ended(self, child: Child, code: int) -> None:
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        if self.stopping:
            if code == 0:
                log.info("consumer process %d (pid %d) stopped", child.index + 1, child.pid)
            else:
                self.failed = True
                log.warning(
                    "consumer process %d (pid %d) ended with %s while stopping", child.index + 1, child.pid, how
                )
            return
        if code == 0 and self.exit_when_idle:
            log.info("consumer process %d (pid %d) stopped", child.index + 1, child.pid)
            return
        lived = time.monotonic() - child.started_at
        failures = 0 if lived >= HEALTHY_SECONDS else child.failures + 1
        if failures >= MAX_QUICK_FAILURES:
            log.error(
                "consumer process %d ended with %s %d times in a row within %.0f s of starting; giving up",
                child.index + 1,
                how,
                failures,
                HEALTHY_SECONDS,
            )
            self.failed = True
            self.stop()
            return
        delay = min(MAX_RESTART_DELAY, 0.5 * 2**failures) if failures else 0.0
        log.error(
            "consumer process %d (pid %d) ended with %s after %.1f s; its unacked deliveries go back to the queue; "
            "restarting it in %.1f s",
            child.index + 1,
            child.pid,
            how,
            lived,
            delay,
        )
        self.restarts[child.index] = (time.monotonic() + delay, failures)

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
        for name in REPORTED:
            setattr(self.stats, name, getattr(self.stats, name) + int(payload.get(name, 0)))


def _die_with_parent(parent_pid: int) -> None:
    """Ask for SIGTERM when the parent dies (Linux); stop at once if it is already gone."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            log.warning("prctl(PR_SET_PDEATHSIG) failed (errno %d)", ctypes.get_errno())
    except (OSError, AttributeError):
        log.debug("prctl is not available; a consumer process outlives a killed parent")
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), signal.SIGTERM)
