"""Nothing lost, nothing doubled: consume_dlq killed with SIGKILL, cut off from RabbitMQ, and losing its
PostgreSQL server in the middle of ingest, while the broker keeps dead-lettering messages into the DLQ.

After each ordeal the DLQ is empty and the database holds exactly one row per dead letter, with the counters
(DeadLetterCount, FailurePattern.total_count, IngestStat) adding up to the same number.

The PostgreSQL test restarts a private server (initdb in a temporary directory, its own port): the machine's
shared server is never touched.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connection
from django.db.models import Sum

from dlqconsole.core.amqp import connect
from dlqconsole.deadletters.models import DeadLetter, DeadLetterCount, FailurePattern
from dlqconsole.ingest.models import IngestStat
from tests.factories import dead_letter_properties
from tests.ingest.conftest import ConsumerProcess
from tests.support import ROOT, DeadLetterQueue, queue_depth, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

log = logging.getLogger(__name__)


def postgres_bin() -> Path | None:
    """The directory of the PostgreSQL server programs (initdb, pg_ctl): pg_config's, else the newest
    /usr/lib/postgresql/*/bin (Debian's layout)."""
    candidates: list[Path] = []
    if pg_config := shutil.which("pg_config"):
        with contextlib.suppress(OSError, subprocess.CalledProcessError):
            found = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=True)
            candidates.append(Path(found.stdout.strip()))
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda path: int(path.parent.name) if path.parent.name.isdigit() else -1,
        reverse=True,
    )
    candidates += versions
    return next(
        (path for path in candidates if (path / "initdb").is_file() and (path / "pg_ctl").is_file()),
        None,
    )


class Publisher(threading.Thread):
    """Publishes messages to the work queue (the broker dead-letters each into the DLQ) in the background, at most
    `rate` a second when given (so that the flow lasts long enough for the kills the test must land in it)."""

    def __init__(self, queue: DeadLetterQueue, count: int, rate: float | None = None) -> None:
        super().__init__(daemon=True)
        self.queue, self.count, self.rate, self.published = queue, count, rate, 0
        self.error: Exception | None = None

    def run(self) -> None:
        amqp = connect()
        started = time.monotonic()
        try:
            channel = amqp.channel()
            for index in range(self.count):
                if self.rate and index % 100 == 0:
                    time.sleep(max(0.0, started + index / self.rate - time.monotonic()))
                channel.basic_publish(
                    exchange="",
                    routing_key=self.queue.work,
                    body=f'{{"order": {index}}}'.encode(),
                    properties=dead_letter_properties(index),
                )
                self.published += 1
        except Exception as error:  # noqa: BLE001  (reported by the test)
            self.error = error
        finally:
            amqp.close()


def logged(consumer: ConsumerProcess, text: str, times: int) -> bool:
    return consumer.output.count(text) >= times


def stored_at_least(count: int) -> bool:
    return DeadLetter.objects.count() >= count


def no_other_sessions() -> bool:
    """No connection but the test's own is open on the test database."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        (others,) = cursor.fetchone()
    return bool(others == 0)


def assert_exactly_once(queue: str, count: int) -> None:
    assert DeadLetter.objects.filter(source_queue=queue).count() == count
    assert DeadLetter.objects.values("dedupe_key").distinct().count() == count
    assert DeadLetter.objects.values("message_id").distinct().count() == count
    assert DeadLetterCount.objects.aggregate(total=Sum("count"))["total"] == count
    assert FailurePattern.objects.aggregate(total=Sum("total_count"))["total"] == count
    stat = IngestStat.objects.get(source_queue=queue)
    assert (stat.inserted, stat.received - stat.duplicates) == (count, count)
    assert queue_depth(queue) == 0


@pytest.mark.parametrize("processes", ["1", "2"])
def test_sigkill_at_random_moments_loses_and_doubles_nothing(
    dead_letter_queue: DeadLetterQueue, consume_dlq: Callable[..., ConsumerProcess], processes: str
) -> None:
    """With two processes, SIGKILL hits the parent and both consumer processes at once (as the OOM killer or
    a stopped container would), so batches are cut in the middle in every process.

    The dead letters flow in over about 40 s (500 a second: slower than either consumer drains them, so that the
    flow outlasts many restarts), and consume_dlq is started, left running for a random 0.1 to 1.5 s once every
    process consumes, and killed, again and again for as long as they flow and until at least 5 kills have
    landed in the middle of ingest: rows stored by that run before the kill, and not all of them after it."""
    total, wanted = 20_000, 5
    randomness = random.Random()
    publisher = Publisher(dead_letter_queue, total, rate=500)
    publisher.start()
    kills: list[tuple[int, int, int]] = []  # rows stored when the run began consuming, just before, just after
    mid_ingest = 0
    while mid_ingest < wanted or publisher.is_alive():
        assert len(kills) < 60, f"only {mid_ingest} of {len(kills)} kills landed mid-ingest: {kills}"
        consumer = consume_dlq("--queues", dead_letter_queue.dlq, "--batch-size", "200", "--processes", processes)
        assert wait_until(partial(logged, consumer, "consuming ", int(processes)), timeout=60), consumer.output
        began = DeadLetter.objects.count()
        time.sleep(randomness.uniform(0.1, 1.5))
        before = DeadLetter.objects.count()
        consumer.kill_tree()
        consumer.wait(timeout=30)
        # A commit the killed processes sent is still carried out by their server processes: count once these
        # are gone, so `after` is what the kill left.
        assert wait_until(no_other_sessions, timeout=30)
        after = DeadLetter.objects.count()
        kills.append((began, before, after))
        if began < before and after < total:
            mid_ingest += 1
        elif not publisher.is_alive() and after >= total:
            break  # everything is stored: no later kill can land mid-ingest (the assertion below says so)
    publisher.join()
    log.info("%d SIGKILLs, %d of them mid-ingest: %s", len(kills), mid_ingest, kills)
    assert publisher.error is None and publisher.published == total
    # Kills fell while ingest was under way, at least five of them, not only before or after it.
    assert mid_ingest >= wanted, kills
    assert wait_until(lambda: queue_depth(dead_letter_queue.dlq) + DeadLetter.objects.count() >= total)

    last = consume_dlq("--queues", dead_letter_queue.dlq, "--exit-when-idle", "3")

    assert last.wait(timeout=300) == 0
    assert_exactly_once(dead_letter_queue.dlq, total)


class Proxy:
    """A TCP proxy in front of RabbitMQ whose connections the test can cut."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        self.cuts = 0
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            with self.lock:
                self.sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self.pipe, args=(source, sink), daemon=True).start()

    def pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                self.close_quietly(end)

    def cut(self) -> None:
        with self.lock:
            cut, self.sockets = self.sockets, []
        for end in cut:
            self.close_quietly(end)
        self.cuts += 1

    def close(self) -> None:
        self.listener.close()
        self.cut()

    @staticmethod
    def close_quietly(end: socket.socket) -> None:
        with contextlib.suppress(OSError):
            end.shutdown(socket.SHUT_RDWR)
        end.close()


@pytest.fixture
def proxy() -> Iterator[Proxy]:
    from django.conf import settings
    from pika import URLParameters

    parameters = URLParameters(settings.AMQP_URL)
    running = Proxy((parameters.host, parameters.port))
    yield running
    running.close()


def test_cut_rabbitmq_connection_loses_and_doubles_nothing(
    dead_letter_queue: DeadLetterQueue, consume_dlq: Callable[..., ConsumerProcess], proxy: Proxy
) -> None:
    total = 20_000
    publisher = Publisher(dead_letter_queue, total)
    publisher.start()
    consumer = consume_dlq(
        "--queues",
        dead_letter_queue.dlq,
        "--batch-size",
        "200",
        "--exit-when-idle",
        "4",
        AMQP_URL=f"amqp://guest:guest@127.0.0.1:{proxy.port}/%2F",
    )
    at_cuts = []
    for cut in range(1, 4):
        assert wait_until(partial(stored_at_least, cut * total // 5), timeout=120)
        before = DeadLetter.objects.count()
        proxy.cut()
        after = DeadLetter.objects.count()
        at_cuts.append((before, after))
        assert wait_until(partial(logged, consumer, "connected to broker default again", cut), timeout=60)
    publisher.join()
    log.info("rows stored just before and after each cut: %s", at_cuts)
    # Each cut fell while ingest was under way: rows stored before it, and not all of them after it.
    assert all(before > 0 and after < total for before, after in at_cuts), at_cuts

    assert consumer.wait(timeout=300) == 0
    assert publisher.error is None and publisher.published == total
    assert consumer.output.count("broker default: connection lost") >= 3
    assert_exactly_once(dead_letter_queue.dlq, total)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PrivatePostgres:
    """A PostgreSQL server of our own in a temporary directory, run as the postgres OS user."""

    def __init__(self, binaries: Path) -> None:
        self.binaries = binaries
        self.directory = Path(tempfile.mkdtemp(prefix="dlqconsole-pg-"))
        shutil.chown(self.directory, "postgres", "postgres")
        self.data = self.directory / "data"
        self.port = free_port()
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/dlqconsole"
        self.run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        self.pg_ctl("start")
        with psycopg.connect(f"postgres://postgres@127.0.0.1:{self.port}/postgres", autocommit=True) as admin:
            admin.execute("CREATE DATABASE dlqconsole")
        subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), "migrate", "--no-input", "-v0"],
            cwd=ROOT,
            env=dict(os.environ, DATABASE_URL=self.url),
            check=True,
        )

    def run(self, program: str, *arguments: str) -> None:
        subprocess.run(
            ["runuser", "-u", "postgres", "--", str(self.binaries / program), *arguments],
            check=True,
            capture_output=True,
        )

    def pg_ctl(self, action: str, *arguments: str) -> None:
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.directory}"
        self.run(
            "pg_ctl", action, "-D", str(self.data), "-w", "-o", options, "-l", str(self.directory / "log"), *arguments
        )

    def query(self, sql: str, parameters: list[Any] | None = None) -> Any:
        with psycopg.connect(self.url) as database:
            row = database.execute(sql, parameters).fetchone()  # type: ignore[arg-type]
            return row[0] if row else None

    def at_least(self, sql: str, count: int) -> bool:
        return bool(self.query(sql) >= count)

    def destroy(self) -> None:
        try:
            self.pg_ctl("stop", "-m", "immediate")
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)


@pytest.fixture(scope="module")
def private_postgres() -> Iterator[PrivatePostgres]:
    binaries = postgres_bin()
    if binaries is None or shutil.which("runuser") is None:
        missing = "PostgreSQL server programs (initdb, pg_ctl; pg_config --bindir or /usr/lib/postgresql/*/bin)"
        problem = f"needs {missing if binaries is None else 'runuser'} to run a private PostgreSQL server"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{problem}; CI must run this test, not skip it")
        pytest.skip(problem)
    server = PrivatePostgres(binaries)
    yield server
    server.destroy()


def test_postgresql_restart_during_ingest_loses_and_doubles_nothing(
    dead_letter_queue: DeadLetterQueue,
    consume_dlq: Callable[..., ConsumerProcess],
    private_postgres: PrivatePostgres,
) -> None:
    total = 20_000
    publisher = Publisher(dead_letter_queue, total)
    publisher.start()
    consumer = consume_dlq(
        "--queues",
        dead_letter_queue.dlq,
        "--batch-size",
        "200",
        "--exit-when-idle",
        "6",
        database_url=private_postgres.url,
    )
    rows = "SELECT count(*) FROM deadletters_deadletter"
    at_restarts = []
    for restart, mode in enumerate(["fast", "immediate"], start=1):
        assert wait_until(partial(private_postgres.at_least, rows, restart * total // 3), timeout=120)
        before = private_postgres.query(rows)
        private_postgres.pg_ctl("restart", "-m", mode)
        # Read as soon as the server is back: at least what was committed before the restart.
        after = private_postgres.query(rows)
        at_restarts.append((before, after))
        assert wait_until(partial(logged, consumer, "database error", restart), timeout=60)
    publisher.join()
    log.info("rows stored just before and after each restart: %s", at_restarts)
    # Each restart fell while ingest was under way: rows stored before it, and not all of them after it.
    assert all(before > 0 and after < total for before, after in at_restarts), at_restarts

    assert consumer.wait(timeout=300) == 0
    assert publisher.error is None and publisher.published == total
    query = private_postgres.query
    assert query(rows) == total
    assert query("SELECT count(DISTINCT dedupe_key) FROM deadletters_deadletter") == total
    assert query("SELECT sum(count) FROM deadletters_deadlettercount") == total
    assert query("SELECT sum(total_count) FROM deadletters_failurepattern") == total
    assert query("SELECT inserted FROM ingest_ingeststat WHERE source_queue = %s", [dead_letter_queue.dlq]) == total
    assert queue_depth(dead_letter_queue.dlq) == 0
