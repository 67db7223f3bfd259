"""Ingest beside retention: how much `consume_dlq` slows while retention deletes finished dead letters beside it.

    .venv/bin/python bench/retention.py                                 # 100,000 dead letters a run, 600,000 to delete
    .venv/bin/python bench/retention.py --n 20000 --preload 200000      # smaller, while developing
    .venv/bin/python bench/retention.py --keep                          # keep the database afterwards

Setup: a fresh database (BENCH_RETENTION_DATABASE_URL, by default postgres://postgres@127.0.0.1:5432/
dlq_retention_bench), one work queue whose dead-letter exchange fans out to seven DLQs (bench.retention.<random>.*,
deleted afterwards), and N messages dead-lettered by RabbitMQ into each, with bench/ingest.py's realistic error
headers (a few hundred patterns). The first DLQ is drained by consume_dlq as a seed, whose rows are copied in SQL
until the table holds --preload dead letters replayed or moved 30 days ago, past DLQ_FINISHED_RETENTION_DAYS (14),
with their counters rebuilt to match; then VACUUM ANALYZE. Retention then runs alone for 15 s, to show how fast it
deletes with its pacing when nothing else runs.

Then six ingest runs, `manage.py consume_dlq --queues Q --exit-when-idle 1` with its defaults (a consumer process
per core) on a DLQ each: alone (A) and with retention beside it (B), in the order A B B A A B, so that a machine
getting busier or quieter weighs on both alike. Retention runs in a process of its own as a Celery worker runs
beat's task, `apply_retention()` with its real pacing (batches, pauses, time budget), one run after the other
without the five minutes beat leaves between them: the worst case. It starts a second before the consumer and is
stopped when the consumer exits. Each rate is N over the time from the first message leaving the DLQ to the
consumer's last commit (IngestStat.last_batch_at), as bench/ingest.py measures it. Retention's own rate (rows
deleted a second while ingest ran) is shown beside each B run.

Target: ingest beside retention slows by less than 10% (the B runs' summed time against the A runs'; each pair
of neighbouring runs is shown too, as the machine's drift shows there). The run checks that the counters hold
exactly the rows left, per status, and that the DLQs are empty.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import PYTHON, manage, project_env, queue_depth, rate, report  # noqa: E402
from bench.ingest import delete_queues, fill, one, run_consumer  # noqa: E402

DATABASE_URL = os.environ.get("BENCH_RETENTION_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/dlq_retention_bench")
ORDER = ["alone", "retention", "retention", "alone", "alone", "retention"]
TABLE = "deadletters_deadletter"
# Retention alone, before the ingest runs: how fast it deletes with its pacing when nothing else runs.
RETENTION_ALONE_SECONDS = 15.0


def server_url(url: str) -> str:
    """The maintenance database on the server of `url`."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/postgres"))


def fresh_database(url: str) -> None:
    name = urlsplit(url).path.lstrip("/")
    with psycopg.connect(server_url(url), autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        connection.execute(f'CREATE DATABASE "{name}"')
    manage(["migrate", "--no-input", "-v0"], database=url)


def drop_database(url: str) -> None:
    name = urlsplit(url).path.lstrip("/")
    with psycopg.connect(server_url(url), autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def preload(url: str, seed_queue: str, rows: int) -> int:
    """Copy the seed queue's rows until the table holds `rows` finished dead letters changed 30 to 40 days ago
    (replayed, one in five moved), rebuild the counters from the rows, and VACUUM ANALYZE. Returns the rows."""
    with psycopg.connect(url, autocommit=True) as connection:
        columns = [
            name
            for (name,) in connection.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = %s AND column_name <> 'id' "
                "ORDER BY ordinal_position",
                [TABLE],
            ).fetchall()
        ]
        (seed,) = one(connection, f"SELECT count(*) FROM {TABLE} WHERE source_queue = %s", [seed_queue])
        copies = -(-rows // seed)
        changed = {
            "dedupe_key": "left(seed.dedupe_key, 64) || ':' || copy",
            "source_queue": "'bench.retention.finished.dlq'",
            "status": "CASE WHEN (seed.id + copy) %% 5 = 0 THEN 'moved' ELSE 'replayed' END",
            "status_changed_at": "now() - interval '30 days' - (random() * interval '10 days')",
            "ingested_at": "now() - interval '41 days'",
            "identical_to_id": "NULL",
            "previous_id": "NULL",
        }
        select = ", ".join(changed.get(name, f"seed.{name}") for name in columns)
        connection.execute(
            f"INSERT INTO {TABLE} ({', '.join(columns)}) SELECT {select} FROM {TABLE} seed "
            "CROSS JOIN generate_series(1, %s) AS copy WHERE seed.source_queue = %s",
            [copies, seed_queue],
        )
        connection.execute(f"DELETE FROM {TABLE} WHERE source_queue = %s", [seed_queue])
        connection.execute("DELETE FROM deadletters_deadlettercount")
        connection.execute(
            "INSERT INTO deadletters_deadlettercount (broker_id, source_queue, pattern_id, failure_reason, status, "
            f"count) SELECT broker_id, source_queue, pattern_id, failure_reason, status, count(*) FROM {TABLE} "
            "GROUP BY 1, 2, 3, 4, 5"
        )
        connection.execute("VACUUM ANALYZE")
        (total,) = one(connection, f"SELECT count(*) FROM {TABLE}")
    return int(total)


def retention_loop() -> None:
    """Beat's retention task, run after run until SIGTERM (the bench's second process). A SIGTERM stops it in a
    pause between batches, never inside a transaction."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dlqconsole.settings")
    import django

    django.setup()
    from dlqconsole.operations.retention import Pacing, apply_retention

    stopping = threading.Event()

    class Stop(Exception):
        pass

    def rest(seconds: float) -> None:
        if stopping.wait(seconds):
            raise Stop

    signal.signal(signal.SIGTERM, lambda _signal, _frame: stopping.set())
    runs = 0
    try:
        while not stopping.is_set():
            done = apply_retention(pacing=Pacing(sleep=rest))
            runs += 1
            if done.complete:
                print("retention found nothing left to delete: preload more rows", file=sys.stderr, flush=True)
                rest(1.0)
    except Stop:
        pass
    print(json.dumps({"runs": runs}), flush=True)


def finished_rows(url: str) -> int:
    with psycopg.connect(url) as connection:
        (count,) = one(connection, f"SELECT count(*) FROM {TABLE} WHERE status IN ('replayed', 'moved')")
    return int(count)


@contextmanager
def retention_beside(env: dict[str, str], *, on: bool = True) -> Iterator[None]:
    """The retention process (retention_loop) running while the block runs; nothing when `on` is false."""
    if not on:
        yield
        return
    command = [PYTHON, str(Path(__file__)), "--retention-loop"]
    retention = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)  # Django's start-up, and the first batches under way
    try:
        yield
    finally:
        retention.send_signal(signal.SIGTERM)
        _, errors = retention.communicate(timeout=60)
        if retention.returncode != 0:
            sys.exit(f"the retention process failed ({retention.returncode}):\n{errors}")
        if "nothing left" in errors:
            sys.exit("retention ran out of rows to delete during the run: raise --preload")


def retention_alone(url: str, env: dict[str, str], seconds: float) -> tuple[int, float]:
    """Retention alone for `seconds`: (rows deleted, seconds it ran)."""
    before = finished_rows(url)
    started = time.monotonic()
    with retention_beside(env):
        time.sleep(seconds)
    return before - finished_rows(url), time.monotonic() - started


def ingest_run(url: str, env: dict[str, str], queue: str, n: int, *, beside: bool) -> tuple[float, int, float]:
    """One consume_dlq run over `queue`, with retention beside it or not: (seconds, rows retention deleted, its
    seconds)."""
    before = finished_rows(url)
    retention_started = time.monotonic()
    with retention_beside(env, on=beside):
        command = [PYTHON, str(ROOT / "manage.py"), "consume_dlq", "--queues", queue, "--exit-when-idle", "1"]
        started, _, _ = run_consumer(command, env, queue, n)
    retention_seconds = time.monotonic() - retention_started
    with psycopg.connect(url) as connection:
        (last_batch_at,) = one(
            connection, "SELECT last_batch_at FROM ingest_ingeststat WHERE source_queue = %s", [queue]
        )
    return last_batch_at.timestamp() - started, before - finished_rows(url), retention_seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=100_000, help="dead letters per ingest run")
    parser.add_argument("--preload", type=int, default=600_000, help="finished dead letters for retention to delete")
    parser.add_argument("--keep", action="store_true", help="keep the database and print its URL")
    parser.add_argument("--retention-loop", action="store_true", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.retention_loop:
        retention_loop()
        return

    n = arguments.n
    url = DATABASE_URL
    fresh_database(url)
    env = project_env(url)
    work_queue = f"bench.retention.{uuid.uuid4().hex[:8]}"
    seed_queue = f"{work_queue}.seed.dlq"
    queues = [f"{work_queue}.{index}.{kind}.dlq" for index, kind in enumerate(ORDER)]
    seconds = {"alone": 0.0, "retention": 0.0}
    lines: list[tuple[str, str]] = []
    deleted_total = 0
    took_each: list[float] = []
    try:
        fill_seconds = fill(work_queue, [seed_queue, *queues], n)
        print(f"{n:,} dead letters in each of {len(queues) + 1} DLQs ({fill_seconds:.1f} s)", flush=True)
        command = [PYTHON, str(ROOT / "manage.py"), "consume_dlq", "--queues", seed_queue, "--exit-when-idle", "1"]
        run_consumer(command, env, seed_queue, n)
        started = time.monotonic()
        rows = preload(url, seed_queue, arguments.preload)
        print(f"{rows:,} finished dead letters preloaded ({time.monotonic() - started:.1f} s)", flush=True)
        alone_deleted, alone_seconds = retention_alone(url, env, RETENTION_ALONE_SECONDS)
        deleted_total += alone_deleted
        lines.append(("retention alone", f"{rate(alone_deleted, alone_seconds):,.0f} rows/s ({alone_seconds:.0f} s)"))
        print(f"  retention alone: {lines[-1][1]}", flush=True)
        for index, (kind, queue) in enumerate(zip(ORDER, queues, strict=True), start=1):
            took, deleted, beside = ingest_run(url, env, queue, n, beside=kind == "retention")
            seconds[kind] += took
            took_each.append(took)
            deleted_total += deleted
            extra = f"; retention deleted {deleted:,} ({rate(deleted, beside):,.0f} rows/s)" if deleted else ""
            lines.append((f"run {index}: {kind}", f"{rate(n, took):,.0f} msg/s ({took:.1f} s){extra}"))
            print(f"  run {index} {kind}: {lines[-1][1]}", flush=True)
        with psycopg.connect(url) as connection:
            mismatched = connection.execute(
                f"SELECT status, rows, counted FROM (SELECT status, count(*) AS rows FROM {TABLE} GROUP BY status) r "
                "FULL JOIN (SELECT status, sum(count) AS counted FROM deadletters_deadlettercount GROUP BY status) c "
                "USING (status) WHERE coalesce(rows, 0) <> coalesce(counted, 0)"
            ).fetchall()
            (left_rows,) = one(connection, f"SELECT count(*) FROM {TABLE}")
        left = sum(queue_depth(queue) for queue in queues)
    finally:
        delete_queues(work_queue, [seed_queue, *queues])
        if not arguments.keep:
            drop_database(url)

    alone, beside = rate(3 * n, seconds["alone"]), rate(3 * n, seconds["retention"])
    slowdown = 1 - beside / alone
    report(
        f"ingest beside retention: {n:,} dead letters a run, {rows:,} finished ones preloaded",
        [
            *lines,
            ("ingest alone (3 runs)", f"{alone:,.0f} msg/s ({seconds['alone']:.1f} s)"),
            ("ingest beside retention (3 runs)", f"{beside:,.0f} msg/s ({seconds['retention']:.1f} s)"),
            ("slowdown", f"{slowdown:.1%} (target < 10%)"),
            ("slowdown of each pair (runs 1-2, 3-4, 5-6)", ", ".join(f"{pair:.1%}" for pair in pairs(took_each))),
            ("rows left / counters off", f"{left_rows:,} / {mismatched or 'none'}"),
            ("messages left in the DLQs", f"{left}"),
        ],
    )
    if arguments.keep:
        print(f"\nkept {url}")
    if mismatched or left or left_rows != rows + 6 * n - deleted_total:
        sys.exit("retention benchmark: the rows or counters do not add up")


def pairs(took: list[float]) -> list[float]:
    """The slowdown within each pair of neighbouring runs (one of each kind): on a machine whose load drifts, the
    pairs show whether the total's figure is retention or the drift."""
    slowdowns = []
    for first, second in zip(range(0, len(took), 2), range(1, len(took), 2), strict=True):
        alone, beside = (first, second) if ORDER[first] == "alone" else (second, first)
        slowdowns.append(1 - took[alone] / took[beside])
    return slowdowns


if __name__ == "__main__":
    main()
