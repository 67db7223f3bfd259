"""consume_dlq's byte budget (DLQ_CONSUMER_MAX_BYTES): what it costs on small messages and what it saves on large
ones, against the commit before it, in the same run.

    .venv/bin/python bench/budget.py                              # the full run (about 15 minutes, 9 GB of disk)
    .venv/bin/python bench/budget.py --n 5000 --large 40 --large-before 20   # smaller, while developing
    .venv/bin/python bench/budget.py --part cost                  # only part 1 (or --part memory: only part 2)
    .venv/bin/python bench/budget.py --before REF                 # another baseline commit (default 145d60a)

"budget" is this tree; "before" is REF (by default 145d60a, the parent of the commit that added the budget),
checked out by the benchmark into a temporary git worktree (removed afterwards) and run with the same Python.
Every consumer run gets a fresh database (bench_budget), migrated by its own checkout's `manage.py migrate`
(the checkouts may differ in migrations), and a DLQ of its own (bench.budget.<random>.*, deleted afterwards).

1. Cost on 1 KB messages. N dead letters with 1 KB bodies (the realistic headers of bench/ingest.py, the body
   padded to 1,024 bytes) are dead-lettered by RabbitMQ into six DLQs, then drained one after the other by
   `manage.py consume_dlq --processes 1 --queues Q --exit-when-idle 1` from before, budget, before, budget,
   before, budget (interleaved, so that a machine getting busier or quieter weighs on both alike). The rate is N
   divided by the time from the first message leaving the DLQ (its ready count drops) to the consumer's last
   commit (IngestStat.last_batch_at), as bench/ingest.py measures it: start-up is not in it. The CPU time of the
   consumer process (start-up included) is shown too. Target: the median budget rate at least 95% of the median
   before rate ("the budget costs less than 5%").

2. Memory with 8 MiB messages. --large (1,000) messages of 8 MiB of random, incompressible bytes are published
   straight to one DLQ (a lazy queue, so that RabbitMQ keeps them on disk and not in its memory) and drained by
   `manage.py consume_dlq --queues Q --exit-when-idle 10` with its defaults (on PostgreSQL one process per
   core) from this tree, while the resident memory (RSS) of the command and all its child processes is sampled
   every 50 ms with psutil, until the DLQ is empty, every row is stored and the command has exited. Target:
   every process under 1 GB (10^9 bytes) resident at its peak. RabbitMQ's resident memory is sampled too (every
   0.5 s, from the management API), as the deliveries a consumer has not read yet wait in the broker's memory;
   the drain is stopped (and the run fails) if it comes within 10% of the broker's memory alarm. Then the same
   with the before checkout and --large-before (200) messages, the measurement of the issue, as the baseline
   (before the budget a process held up to prefetch x queues messages, whatever their size). Each run checks the
   rows (count, body sizes) and that the DLQ is empty, reports the database's size and the disk space the run
   took at most (free space on the filesystem of this tree, before publishing and at its lowest; other work on
   the machine counts in it), and drops the database. The consumers' logs (LOG_LEVEL=INFO, to count the pauses
   at the budget and the deliveries per process) are kept in var/bench/.

The load average is printed at each run: the figures are only worth reporting from a machine doing nothing else.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pika
import psutil
import psycopg
import requests

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    AMQP_URL,
    PYTHON,
    amqp_channel,
    database_url,
    drop_database,
    project_env,
    queue_depth,
    rate,
    report,
    wait_until,
)
from bench.ingest import delete_queues, filled, message, one, run_consumer  # noqa: E402
from dlqconsole.core.broker_urls import api_from_urls  # noqa: E402

DATABASE = "bench_budget"
BODY_BYTES = 1024
LARGE_BYTES = 8 * 1024 * 1024
TARGET_RATIO = 0.95
TARGET_RESIDENT = 10**9
SAMPLE_SECONDS = 0.05
CHECK_SECONDS = 0.5
# A drain that neither stores a row nor takes a message for this long has hung.
STALL_SECONDS = 300.0
# A consumer process counts idle time from its start, connecting included: long enough that a process that is
# slow to get its first delivery does not exit before the DLQ is drained.
IDLE_SECONDS = 10
# The share of RabbitMQ's memory high watermark at which the drain is stopped: the broker buffers the deliveries a
# consumer has not read yet, and its memory alarm would block every publisher on the machine.
BROKER_MEMORY_GUARD = 0.9
LOGS = ROOT / "var" / "bench"
# Connect and read timeouts of the management API requests, as the console's own.
API_TIMEOUT = (2.0, 5.0)


@dataclass(frozen=True)
class Checkout:
    label: str
    path: Path
    commit: str

    def manage(self, *arguments: str) -> list[str]:
        return [PYTHON, str(self.path / "manage.py"), *arguments]

    def env(self, database: str, **extra: str) -> dict[str, str]:
        return project_env(database, PYTHONPATH=str(self.path), **extra)

    @property
    def name(self) -> str:
        return f"{self.label} {self.commit}"


def describe(path: Path) -> str:
    """The short commit of a checkout, marked when its code differs from that commit."""
    commit = git(path, "rev-parse", "--short", "HEAD").strip()
    changed = git(path, "status", "--porcelain", "--untracked-files=no", "--", "dlqconsole").strip()
    return f"{commit}+changes" if changed else commit


def git(path: Path, *arguments: str) -> str:
    return subprocess.run(["git", "-C", str(path), *arguments], check=True, text=True, capture_output=True).stdout


@contextmanager
def before_checkout(ref: str) -> Iterator[Checkout]:
    """REF in a temporary detached git worktree, removed afterwards."""
    directory = Path(tempfile.mkdtemp(prefix="dlq-bench-budget-"))
    path = directory / "before"
    git(ROOT, "worktree", "add", "--detach", str(path), ref)
    try:
        yield Checkout("before", path, describe(path))
    finally:
        git(ROOT, "worktree", "remove", "--force", str(path))
        shutil.rmtree(directory, ignore_errors=True)


def migrated_database(checkout: Checkout) -> str:
    """A fresh database migrated by the checkout's own manage.py; returns its URL."""
    drop_database(DATABASE)
    with psycopg.connect(database_url("postgres"), autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{DATABASE}"')
    url = database_url(DATABASE)
    done = subprocess.run(
        checkout.manage("migrate", "--no-input", "-v0"), env=checkout.env(url), text=True, capture_output=True
    )
    if done.returncode != 0:
        sys.exit(f"migrating {DATABASE} with {checkout.name} failed:\n{done.stderr}")
    return url


def load_average() -> str:
    return "load {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


# 1. Cost on 1 KB messages ----------------------------------------------------------------------------------------


def padded_message(index: int, randomness: random.Random) -> tuple[bytes, pika.BasicProperties]:
    """bench/ingest.py's dead letter with its JSON body padded to BODY_BYTES by a note field."""
    body, properties = message(index, randomness)
    head = body[:-1] + b', "note": "'
    filler = BODY_BYTES - len(head) - len(b'"}')
    note = (b"customer asked for delivery to the side door; " * (filler // 40 + 1))[: max(0, filler)]
    return head + note + b'"}', properties


def fill(work_queue: str, dead_letter_queues: list[str], n: int) -> float:
    """bench/ingest.py's topology (a work queue whose dead letters fan out to every DLQ) with 1 KB bodies: n
    messages published with a TTL of 0, so that RabbitMQ dead-letters each into every DLQ. Returns seconds."""
    started = time.monotonic()
    randomness = random.Random(20261127)
    with amqp_channel() as channel:
        channel.exchange_declare(exchange=work_queue + ".dlx", exchange_type="fanout", durable=True)
        for queue in dead_letter_queues:
            channel.queue_declare(queue=queue, durable=True)
            channel.queue_bind(queue=queue, exchange=work_queue + ".dlx")
        channel.queue_declare(queue=work_queue, durable=True, arguments={"x-dead-letter-exchange": work_queue + ".dlx"})
        for index in range(n):
            body, properties = padded_message(index, randomness)
            channel.basic_publish(exchange="", routing_key=work_queue, body=body, properties=properties)
    for queue in dead_letter_queues:
        if not wait_until(partial(filled, queue, n), timeout=300, interval=0.5):
            sys.exit(f"{queue} holds {queue_depth(queue)} of {n} dead letters after 300 s")
    return time.monotonic() - started


@dataclass
class CostRun:
    checkout: Checkout
    round_number: int
    seconds: float
    cpu: float
    rows: int
    inserted: int
    left: int
    load: str

    @property
    def rate(self) -> float:
        return rate(self.rows, self.seconds)


def measure_cost(checkouts: dict[str, Checkout], n: int) -> bool:
    """Part 1; returns whether every run stored exactly n rows and emptied its DLQ."""
    work_queue = f"bench.budget.{uuid.uuid4().hex[:8]}"
    order = [(label, round_number) for round_number in (1, 2, 3) for label in ("before", "budget")]
    queues = {run: f"{work_queue}.{run[0]}.{run[1]}.dlq" for run in order}
    runs: list[CostRun] = []
    try:
        fill_seconds = fill(work_queue, list(queues.values()), n)
        print(f"{n:,} dead letters of {BODY_BYTES:,} bytes in each of {len(queues)} DLQs ({fill_seconds:.1f} s)")
        for label, round_number in order:
            checkout, queue = checkouts[label], queues[(label, round_number)]
            url = migrated_database(checkout)
            load = load_average()
            command = checkout.manage("consume_dlq", "--processes", "1", "--queues", queue, "--exit-when-idle", "1")
            started, _, cpu = run_consumer(command, checkout.env(url), queue, n)
            with psycopg.connect(url) as connection:
                last_batch_at, inserted = one(
                    connection,
                    "SELECT last_batch_at, inserted FROM ingest_ingeststat WHERE source_queue = %s",
                    [queue],
                )
                (rows,) = one(connection, "SELECT count(*) FROM deadletters_deadletter")
            seconds = last_batch_at.timestamp() - started
            run = CostRun(checkout, round_number, seconds, cpu, rows, inserted, queue_depth(queue), load)
            runs.append(run)
            print(f"  {checkout.name} run {round_number}: {cost_line(run)}", flush=True)
    finally:
        delete_queues(work_queue, list(queues.values()))
        drop_database(DATABASE)

    medians = {label: statistics.median(run.rate for run in runs if run.checkout.label == label) for label in checkouts}
    ratio = medians["budget"] / medians["before"]
    verdict = "OK" if ratio >= TARGET_RATIO else "MISSED"
    correct = all(run.rows == run.inserted == n and run.left == 0 for run in runs)
    report(
        f"budget, part 1: {n:,} dead letters with {BODY_BYTES:,}-byte bodies, consume_dlq --processes 1, "
        "rate from the first message taken to the last commit",
        [
            *[(f"{run.checkout.name}, run {run.round_number}", cost_line(run)) for run in runs],
            *[(f"median {checkouts[label].name}", f"{medians[label]:,.0f} msg/s") for label in ("before", "budget")],
            (
                "ratio budget / before (medians)",
                f"{ratio:.1%} (target >= {TARGET_RATIO:.0%}: the budget costs less than 5%) {verdict}",
            ),
            (
                "rows stored / messages left, per run",
                ", ".join(f"{run.rows:,} / {run.left}" for run in runs) + f" (of {n:,} each)",
            ),
        ],
    )
    return correct


def cost_line(run: CostRun) -> str:
    return (
        f"{run.rate:,.0f} msg/s ({run.seconds:.1f} s; CPU {run.cpu:.1f} s, start-up included; {run.load} at the start)"
    )


# 2. Memory with 8 MiB messages -----------------------------------------------------------------------------------


def publish_large(queue: str, count: int) -> float:
    """count messages of LARGE_BYTES random bytes, straight into a lazy DLQ. Returns seconds."""
    started = time.monotonic()
    with amqp_channel() as channel:
        channel.queue_declare(queue=queue, durable=True, arguments={"x-queue-mode": "lazy"})
        for index in range(count):
            properties = pika.BasicProperties(
                message_id=str(uuid.uuid4()),
                content_type="application/octet-stream",
                delivery_mode=2,
                timestamp=int(time.time()),
                headers={
                    "x-exception-type": "PayloadTooLarge",
                    "x-exception-message": f"attachment {index} of the export exceeds the upload limit",
                },
            )
            channel.basic_publish(exchange="", routing_key=queue, body=os.urandom(LARGE_BYTES), properties=properties)
    if not wait_until(partial(filled, queue, count), timeout=600, interval=0.5):
        sys.exit(f"{queue} holds {queue_depth(queue)} of {count} messages after 600 s")
    return time.monotonic() - started


@dataclass
class MemoryRun:
    checkout: Checkout
    count: int
    processes: int = 0
    # Peak RSS per pid, and which pid is the command itself (the others are its consumer processes).
    peaks: dict[int, int] = field(default_factory=dict)
    command_pid: int = 0
    peak_total: int = 0
    # Deliveries each consumer process received, from its log line when it stopped.
    received: dict[int, int] = field(default_factory=dict)
    broker_before: int = 0
    broker_peak: int = 0
    broker_limit: int = 0
    publish_seconds: float = 0.0
    drain_seconds: float = 0.0
    rows: int = 0
    body_sizes: tuple[int, int] = (0, 0)
    stored_sizes: tuple[int, int] = (0, 0)
    left: int = 0
    database_bytes: int = 0
    disk_taken: int = 0
    pauses: int = 0
    exit_code: int | None = None
    failure: str = ""
    log: Path = Path()
    loads: tuple[str, str] = ("", "")

    @property
    def consumer_peaks(self) -> list[tuple[int, int]]:
        return [(pid, peak) for pid, peak in self.peaks.items() if pid != self.command_pid]

    @property
    def largest(self) -> int:
        return max(self.peaks.values(), default=0)

    @property
    def correct(self) -> bool:
        sizes_right = self.body_sizes == self.stored_sizes == (LARGE_BYTES, LARGE_BYTES)
        return not self.failure and self.rows == self.count and sizes_right and self.left == 0


def measure_memory(checkout: Checkout, count: int) -> MemoryRun:
    """Part 2 for one checkout: publish, drain with the defaults while sampling memory, check, drop."""
    run = MemoryRun(checkout, count)
    queue = f"bench.budget.{uuid.uuid4().hex[:8]}.large.dlq"
    LOGS.mkdir(parents=True, exist_ok=True)
    run.log = LOGS / f"budget-memory-{checkout.label}-{queue.split('.')[2]}.log"
    free_before = shutil.disk_usage(ROOT).free
    lowest_free = free_before
    try:
        url = migrated_database(checkout)
        run.publish_seconds = publish_large(queue, count)
        lowest_free = min(lowest_free, shutil.disk_usage(ROOT).free)
        print(f"  {count:,} messages of {LARGE_BYTES:,} random bytes in {queue} ({run.publish_seconds:.1f} s)")
        command = checkout.manage("consume_dlq", "--queues", queue, "--exit-when-idle", str(IDLE_SECONDS))
        run.broker_before, run.broker_limit = broker_memory()
        run.loads = (load_average(), "")
        with run.log.open("w") as log, psycopg.connect(url, autocommit=True) as database:
            process = subprocess.Popen(
                command, env=checkout.env(url, LOG_LEVEL="INFO"), stdout=log, stderr=subprocess.STDOUT, text=True
            )
            run.command_pid = process.pid
            lowest_free = min(lowest_free, sample(process, run, queue, database))
        run.loads = (run.loads[0], load_average())
        run.exit_code = process.returncode
        if process.returncode != 0 and not run.failure:
            run.failure = f"consume_dlq exited with {process.returncode}"
        with psycopg.connect(url) as connection:
            run.rows, smallest, largest, stored_smallest, stored_largest = one(
                connection,
                "SELECT count(*), min(body_size), max(body_size), min(octet_length(body)), max(octet_length(body)) "
                "FROM deadletters_deadletter",
            )
            run.body_sizes = (smallest or 0, largest or 0)
            run.stored_sizes = (stored_smallest or 0, stored_largest or 0)
            (run.database_bytes,) = one(connection, "SELECT pg_database_size(current_database())")
        run.left = queue_depth(queue)
        text = run.log.read_text()
        run.pauses = text.count("reading paused")
        for pid, received in re.findall(
            r"\[(\d+)\] dlqconsole\.ingest\.consumer consume_dlq stopped: (\d+) received", text
        ):
            run.received[int(pid)] = int(received)
    finally:
        with amqp_channel() as channel:
            channel.queue_delete(queue=queue)
        drop_database(DATABASE)
    run.disk_taken = free_before - lowest_free
    return run


def sample(process: subprocess.Popen[str], run: MemoryRun, queue: str, database: psycopg.Connection[Any]) -> int:
    """Sample the RSS of the command and its children every SAMPLE_SECONDS until it exits; stop it if it has
    stalled or exits before the DLQ is drained. Returns the lowest free disk space seen."""
    parent = psutil.Process(process.pid)
    started = time.monotonic()
    next_check = started
    progress = (-1, -1)
    progressed_at = started
    lowest_free = shutil.disk_usage(ROOT).free
    with amqp_channel() as channel:
        while process.poll() is None:
            total = 0
            try:
                members = [parent, *parent.children(recursive=True)]
            except psutil.NoSuchProcess:
                members = []
            for member in members:
                try:
                    resident = member.memory_info().rss
                except psutil.NoSuchProcess:
                    continue
                run.peaks[member.pid] = max(run.peaks.get(member.pid, 0), resident)
                total += resident
            run.peak_total = max(run.peak_total, total)
            run.processes = max(run.processes, len(members) - 1)
            now = time.monotonic()
            if now >= next_check:
                next_check = now + CHECK_SECONDS
                lowest_free = min(lowest_free, shutil.disk_usage(ROOT).free)
                broker, limit = broker_memory()
                run.broker_peak = max(run.broker_peak, broker)
                depth = int(channel.queue_declare(queue=queue, passive=True).method.message_count)
                (rows,) = one(database, "SELECT count(*) FROM deadletters_deadletter")
                if (depth, rows) != progress:
                    progress, progressed_at = (depth, rows), now
                if not run.drain_seconds and depth == 0 and rows >= run.count:
                    run.drain_seconds = now - started
                if now - progressed_at > STALL_SECONDS:
                    run.failure = (
                        f"no progress for {STALL_SECONDS:.0f} s: {rows} rows stored, {depth} messages ready in the DLQ"
                    )
                elif broker >= BROKER_MEMORY_GUARD * limit:
                    run.failure = (
                        f"RabbitMQ's memory reached {megabytes(broker)} of its {megabytes(limit)} high watermark "
                        f"with {rows} rows stored and {depth} messages ready in the DLQ: stopped the drain"
                    )
                if run.failure:
                    stop(process, run)
                    break
            time.sleep(SAMPLE_SECONDS)
        process.wait()
    if not run.failure and not run.drain_seconds:
        run.failure = "consume_dlq exited before the DLQ was drained and every row stored"
    return lowest_free


def stop(process: subprocess.Popen[str], run: MemoryRun) -> None:
    """SIGTERM to the command (it stops its children), then SIGKILL to whatever of ours is left after 70 s."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=70)
    except subprocess.TimeoutExpired:
        process.kill()
    for pid in run.peaks:
        if pid != process.pid and psutil.pid_exists(pid):
            try:
                psutil.Process(pid).kill()
            except psutil.NoSuchProcess:
                continue


def memory_rows(run: MemoryRun) -> list[tuple[str, str]]:
    name = f"{run.checkout.name}, {run.count:,} messages"
    rows = [(f"{name}: consume_dlq (parent, pid {run.command_pid})", megabytes(run.peaks.get(run.command_pid, 0)))]
    for number, (pid, peak) in enumerate(run.consumer_peaks, start=1):
        received = f"{run.received[pid]:,} received" if pid in run.received else "stop line not logged"
        rows.append((f"{name}: consumer process {number} (pid {pid})", f"{megabytes(peak)} ({received})"))
    verdict = "OK" if run.consumer_peaks and run.largest < TARGET_RESIDENT else "MISSED"
    seconds = run.drain_seconds or float("nan")
    rows += [
        (f"{name}: all processes at once, at most", megabytes(run.peak_total)),
        (f"{name}: every process under 1 GB resident", verdict),
        (
            f"{name}: drained in",
            f"{seconds:.1f} s ({run.count * LARGE_BYTES / seconds / 1e6:,.0f} MB/s; published in "
            f"{run.publish_seconds:.1f} s; {run.loads[0]} at the start, {run.loads[1]} at the end)",
        ),
        (
            f"{name}: rows stored, body sizes",
            f"{run.rows:,} of {run.count:,}; body_size {run.body_sizes[0]:,}..{run.body_sizes[1]:,} bytes, "
            f"stored {run.stored_sizes[0]:,}..{run.stored_sizes[1]:,} bytes",
        ),
        (f"{name}: messages left in the DLQ", f"{run.left}"),
        (
            f"{name}: RabbitMQ resident memory",
            f"{megabytes(run.broker_before)} before the drain, at most {megabytes(run.broker_peak)} during it "
            f"(high watermark {megabytes(run.broker_limit)})",
        ),
        (f"{name}: pauses at the byte budget (log)", f"{run.pauses}"),
        (
            f"{name}: disk",
            f"database {run.database_bytes / 1e9:.1f} GB; at most {run.disk_taken / 1e9:.1f} GB taken during the run "
            "(RabbitMQ's store, the table, WAL)",
        ),
        (f"{name}: log", f"{run.log.relative_to(ROOT)}" + (f"; FAILED: {run.failure}" if run.failure else "")),
    ]
    return rows


def broker_memory() -> tuple[int, int]:
    """RabbitMQ's resident memory now (the management API's live memory breakdown, not its 5-second statistics)
    and its memory high watermark, in bytes."""
    api = api_from_urls(amqp_url=AMQP_URL, configured=os.environ.get("RABBITMQ_API_URL", ""))
    if api is None:
        return 0, 1
    nodes = requests.get(f"{api.base}api/nodes", auth=api.auth, timeout=API_TIMEOUT)
    nodes.raise_for_status()
    name = quote(nodes.json()[0]["name"], safe="")
    answer = requests.get(f"{api.base}api/nodes/{name}", params={"memory": "true"}, auth=api.auth, timeout=API_TIMEOUT)
    answer.raise_for_status()
    node = answer.json()
    return int(node["memory"]["total"]["rss"]), int(node["mem_limit"])


def megabytes(count: int) -> str:
    return f"{count / 1e6:,.0f} MB"


def measure_memory_both(checkouts: dict[str, Checkout], large: int, large_before: int) -> bool:
    """Part 2: budget with `large` messages, then before with `large_before`; returns whether both runs stored
    every message intact and emptied their DLQ."""
    runs = []
    for label, count in (("budget", large), ("before", large_before)):
        print(f"memory: {checkouts[label].name}", flush=True)
        run = measure_memory(checkouts[label], count)
        runs.append(run)
        if run.failure:
            print(f"  {run.failure}; log in {run.log}", flush=True)
            break
    rows = [row for run in runs for row in memory_rows(run)]
    if len(runs) == 2:
        budget, before = runs
        rows.append(
            (
                "ratio largest process budget / before",
                f"{budget.largest / before.largest:.0%} ({megabytes(budget.largest)} with {budget.count:,} "
                f"messages / {megabytes(before.largest)} with {before.count:,})",
            )
        )
    processes = f"{runs[0].processes} consumer processes" if runs else ""
    report(
        f"budget, part 2: messages of {LARGE_BYTES:,} random bytes, consume_dlq with its defaults ({processes}), "
        f"peak resident memory sampled every {SAMPLE_SECONDS * 1000:.0f} ms",
        rows,
    )
    return len(runs) == 2 and all(run.correct for run in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=50_000, help="1 KB dead letters per consumer run (part 1)")
    parser.add_argument("--before", default="145d60a", metavar="REF", help="the baseline commit")
    parser.add_argument("--large", type=int, default=1000, help="8 MiB messages for this tree (part 2)")
    parser.add_argument("--large-before", type=int, default=200, help="8 MiB messages for the baseline (part 2)")
    parser.add_argument("--part", choices=["cost", "memory", "both"], default="both")
    arguments = parser.parse_args()

    budget = Checkout("budget", ROOT, describe(ROOT))
    correct = True
    with before_checkout(arguments.before) as before:
        checkouts = {"before": before, "budget": budget}
        print(
            f"budget = this tree ({budget.commit}), before = {arguments.before} ({before.commit}); "
            f"{os.cpu_count()} CPUs, {load_average()}; "
            f"{shutil.disk_usage(ROOT).free / 1e9:.0f} GB free",
            flush=True,
        )
        if arguments.part in ("cost", "both"):
            correct = measure_cost(checkouts, arguments.n) and correct
        if arguments.part in ("memory", "both"):
            correct = measure_memory_both(checkouts, arguments.large, arguments.large_before) and correct
    if not correct:
        sys.exit("budget benchmark: a consumer did not store every message intact, left some behind, or hung")


if __name__ == "__main__":
    main()
