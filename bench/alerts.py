"""Time of one alert evaluation tick (and of one /metrics scrape) with 1,000,000 stored dead letters and 50 rules.

    .venv/bin/python bench/alerts.py                  # builds dlq_alerts_bench once (about a minute), then measures
    .venv/bin/python bench/alerts.py --rows 100000    # a smaller world while developing
    .venv/bin/python bench/alerts.py --rebuild        # throw the world away and build it again
    .venv/bin/python bench/alerts.py --rows 10000000  # the issue's ten million

The world lives in its own database (BENCH_ALERTS_DATABASE_URL, default
postgres://postgres@127.0.0.1:5432/dlq_alerts_bench), migrated like the real one and filled with SQL
(INSERT ... SELECT over generate_series): dead letters over 20 DLQs and 200 patterns spread over 30 days (90%
parked), the counters (DeadLetterCount, FailurePattern totals, IngestStat) computed from those rows with one
GROUP BY so they are exact, 20 watched queues with 48 hours of depth samples every 5 s (1.4 M QueueSample rows),
an hour of growth samples, 10 patterns first seen within the hour, 5 reopened patterns, 20,000 resolved alerts,
operations (two paused by their safeguards), and 50 rules of every kind and scope. Every row that names a queue is
on the broker `default`, as a console watching AMQP_URL alone has them.

Measured: `evaluate_rules` (the whole tick: reads, alert updates, growth samples, in its transaction) over
--ticks ticks two seconds apart, after warm-up ticks that raise the alerts; and, as the baseline in the same run,
the SQL statements one tick executed, replayed bare through the driver in a transaction. The same for one scrape
of the /metrics collector. Reported: median and p95 of each, and the ratio, with the load average. Target: p95
under 100 ms for a tick and for a scrape.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/dlq_alerts_bench"

QUEUES = 20
PATTERNS = 200
REASONS = ["TIMEOUT", "NETWORK_ERROR", "VALIDATION_FAILED", "INTERNAL", "RATE_LIMITED"]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--ticks", type=int, default=60, help="measured evaluation ticks")
    parser.add_argument("--scrapes", type=int, default=30, help="measured /metrics collections")
    parser.add_argument("--rebuild", action="store_true")
    return parser.parse_args()


def ensure_database(url: str) -> None:
    import psycopg

    name = url.rsplit("/", 1)[1]
    with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as admin:
        if not admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            admin.execute(f'CREATE DATABASE "{name}"')


def insert_select(model: Any, expressions: dict[str, str], source: str) -> None:
    """INSERT INTO model's table SELECT ... FROM source. Columns without an expression get the field's default,
    so a field another part of the project adds later does not break the benchmark."""
    from django.db import connection

    columns, values, defaults = [], [], []
    for field in model._meta.concrete_fields:
        if field.primary_key:
            continue
        columns.append(field.column)
        if field.column in expressions:
            # The statement has parameters (the defaults), so a literal % must be doubled.
            values.append(expressions[field.column].replace("%", "%%"))
        else:
            values.append("%s")
            defaults.append(field.get_db_prep_save(field.get_default(), connection))
    sql = (
        f"INSERT INTO {model._meta.db_table} ({', '.join(columns)}) "
        f"SELECT {', '.join(values)} FROM {source.replace('%', '%%')}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, defaults)


def build_world(rows: int, *, rebuild: bool) -> None:
    from django.core.management import call_command
    from django.db import connection
    from django.utils import timezone

    from bench.bulk import bulk_loading
    from dlqconsole.alerts.models import Alert, AlertRule, GrowthSample
    from dlqconsole.brokers.models import default_broker_id
    from dlqconsole.deadletters.models import DeadLetter, FailurePattern, PatternEvent
    from dlqconsole.ingest.models import QueueSample

    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute("SELECT coalesce(max(id), 0) FROM deadletters_deadletter")
        existing = cursor.fetchone()[0]
    if not rebuild and existing == rows and AlertRule.objects.count() == 50:
        print(f"world: reusing {rows:,} dead letters")
        return
    started = time.perf_counter()
    now = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND (tablename LIKE 'deadletters_%%' "
            "OR tablename LIKE 'alerts_%%' OR tablename LIKE 'operations_%%' OR tablename LIKE 'ingest_%%')"
        )
        tables = [row[0] for row in cursor.fetchall()]
        cursor.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE")

    # Patterns: the first 10 are new (first seen within the hour), the rest months old.
    insert_select(
        FailurePattern,
        {
            "key": "'bench-' || lpad(g::text, 4, '0')",
            "template": "'Request to service-' || g || ' failed after <NUM>ms'",
            "error_type": "'Error' || (g % 7)",
            "failure_reason": f"(ARRAY{REASONS!r})[1 + g % {len(REASONS)}]",
            "status": "CASE WHEN g % 40 = 0 THEN 'ignored' WHEN g % 9 = 0 THEN 'acknowledged' ELSE 'open' END",
            "first_seen_at": "CASE WHEN g <= 10 THEN now() - interval '20 minutes' ELSE now() - interval '90 days' END",
            "last_seen_at": "now()",
            "status_changed_at": "now() - interval '1 day'",
            "created_at": "CASE WHEN g <= 10 THEN now() - interval '20 minutes' ELSE now() - interval '90 days' END",
        },
        f"generate_series(1, {PATTERNS}) AS g",
    )
    first_pattern = FailurePattern.objects.order_by("id").values_list("id", flat=True)[0]
    # Dead letters: ids rise with ingest time over 30 days; the 10 new patterns only in the last 20 minutes.
    with bulk_loading(DeadLetter._meta.db_table):
        insert_select(
            DeadLetter,
            {
                "dedupe_key": "md5('bench-' || g)",
                "source_queue": f"'q' || (g % {QUEUES}) || '.dlq'",
                "original_queue": f"'q' || (g % {QUEUES})",
                "original_exchange": "'shop'",
                "original_routing_keys": "'[]'::jsonb",
                "death_reason": "'rejected'",
                "failure_reason": f"(ARRAY{REASONS!r})[1 + p % {len(REASONS)}]",
                "error_type": "'Error' || (p % 7)",
                "error_message": "'Request to service-' || p || ' failed after ' || (g % 5000) || 'ms'",
                "ingested_at": f"now() - interval '30 days' + interval '30 days' * g / {rows}",
                "first_failed_at": f"now() - interval '30 days' + interval '30 days' * g / {rows}",
                "last_failed_at": f"now() - interval '30 days' + interval '30 days' * g / {rows}",
                "message_id": "'m-' || g",
                "headers": "'{}'::jsonb",
                "properties": "'{}'::jsonb",
                "x_death": "'[]'::jsonb",
                "body": "convert_to('{\"order\": ' || g || '}', 'UTF8')",
                # As deadletters/search.py computes it: else every row would wait in the index of rows to fill in.
                "search_text": "lower('Error' || (p % 7) || E'\\n' || 'Request to service-' || p || ' failed after ' "
                "|| (g % 5000) || 'ms' || E'\\n' || '{\"order\": ' || g || '}')",
                "body_size": "12",
                "parse_errors": "'[]'::jsonb",
                "fingerprint": "'bench-' || lpad(p::text, 4, '0')",
                "pattern_id": f"{first_pattern} - 1 + p",
                "status": "CASE WHEN g % 20 = 0 THEN 'replayed' WHEN g % 20 = 1 THEN 'archived' ELSE 'parked' END",
                "status_changed_at": "now()",
            },
            f"(SELECT g, CASE WHEN g > {rows} - 2000 THEN 1 + g % 10 ELSE 11 + g % {PATTERNS - 10} END AS p "
            f"FROM generate_series(1, {rows}) AS g) AS s",
        )
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO deadletters_deadlettercount (broker_id, source_queue, pattern_id, failure_reason, status, "
            "count) SELECT broker_id, source_queue, pattern_id, failure_reason, status, count(*) "
            "FROM deadletters_deadletter GROUP BY 1, 2, 3, 4, 5"
        )
        cursor.execute(
            "UPDATE deadletters_failurepattern p SET total_count = s.n FROM (SELECT pattern_id, count(*) n "
            "FROM deadletters_deadletter GROUP BY 1) s WHERE s.pattern_id = p.id"
        )
        cursor.execute(
            "INSERT INTO ingest_ingeststat (broker_id, source_queue, received, inserted, duplicates, malformed, "
            "batches, last_batch_at) SELECT broker_id, source_queue, count(*), count(*), 0, 0, count(*) / 200, "
            "max(ingested_at) FROM deadletters_deadletter GROUP BY 1, 2"
        )
        cursor.execute(
            "INSERT INTO ingest_watchedqueue (broker_id, name, dead_letter_queue, dead_letter_exchange, kind, "
            "arguments, warning_depth, critical_depth, emergency_depth, enabled, declared_at) "
            "SELECT %s, 'q' || g, 'q' || g || '.dlq', 'q' || g || '.dlx', 'classic', '{}', 50, 200, 500, true, now() "
            f"FROM generate_series(0, {QUEUES - 1}) AS g",
            [default_broker_id()],
        )
    # 48 hours of samples every 5 s for every work queue and DLQ; a few work queues are deep right now.
    insert_select(
        QueueSample,
        {
            "queue": "name",
            "messages": "CASE WHEN name IN ('q1', 'q2', 'q3') THEN 100 * length(name) + (t % 50) ELSE t % 40 END",
            "consumers": "1 + t % 3",
            "sampled_at": "now() - interval '5 seconds' * t",
        },
        f"(SELECT 'q' || q AS name FROM generate_series(0, {QUEUES - 1}) q UNION ALL "
        f"SELECT 'q' || q || '.dlq' FROM generate_series(0, {QUEUES - 1}) q) AS queues "
        "CROSS JOIN generate_series(0, 34559) t",
    )
    # An hour of growth totals every 2 s for each DLQ (queue scope, current ignore basis) and a few patterns.
    from dlqconsole.alerts.conditions import Facts

    basis = Facts(now=now).ignored_basis
    insert_select(
        GrowthSample,
        {
            "subject": "subject",
            "total": "total - t",
            "basis": f"'{basis}'",
            "sampled_at": "now() - interval '2 seconds' * t",
        },
        "(SELECT 'queue:' || source_queue AS subject, sum(count) AS total FROM deadletters_deadlettercount c "
        "JOIN deadletters_failurepattern p ON p.id = c.pattern_id WHERE p.status <> 'ignored' GROUP BY 1) AS totals "
        "CROSS JOIN generate_series(0, 1799) t",
    )
    PatternEvent.objects.bulk_create(
        PatternEvent(
            pattern_id=first_pattern + 20 + number,
            kind=PatternEvent.Kind.REOPENED,
            from_status="resolved",
            to_status="open",
            created_at=now - dt.timedelta(minutes=10 + number),
        )
        for number in range(5)
    )
    _operations()
    rules = _rules(first_pattern)
    Alert.objects.bulk_create(
        Alert(
            rule=rules[number % len(rules)],
            subject=f"queue:q{number % QUEUES}.dlq",
            subject_label=f"q{number % QUEUES}.dlq",
            severity="warning",
            status="resolved",
            value=1,
            summary="old alert",
            started_at=now - dt.timedelta(minutes=number + 10),
            fired_at=now - dt.timedelta(minutes=number + 10),
            resolved_at=now - dt.timedelta(minutes=number + 5),
            last_notified_at=now - dt.timedelta(minutes=number + 5),
        )
        for number in range(20_000)
    )
    with connection.cursor() as cursor:
        cursor.execute("VACUUM (ANALYZE)")
    print(f"world: built {rows:,} dead letters in {time.perf_counter() - started:.0f} s")


def _operations() -> None:
    from dlqconsole.operations.models import Operation

    Operation.objects.bulk_create(
        [
            *(
                Operation(kind="retry", status="done", total=100, succeeded=98, failed=2, filter={"queue": ["q1.dlq"]})
                for _ in range(100)
            ),
            Operation(
                kind="retry",
                status="paused",
                total=500,
                succeeded=120,
                returned=40,
                pause_reason="40 of 120 replayed messages came back to a dead-letter queue (more than 20%)",
                filter={"queue": ["q2.dlq"]},
            ),
            Operation(kind="move", status="paused", total=50, succeeded=5, pause_reason="canary of 5: 2 came back"),
            Operation(kind="retry", status="paused", total=10, pause_reason="paused by ada"),
        ]
    )


def _rules(first_pattern: int) -> list[Any]:
    """50 rules of every kind and scope (the defaults go: the benchmark sets its own)."""
    from dlqconsole.alerts.models import AlertRule

    AlertRule.objects.all().delete()
    specs: list[dict[str, Any]] = []
    for number in range(10):
        scope: dict[str, Any] = {"queue": f"q{number}.dlq"} if number % 3 == 1 else {}
        if number % 3 == 2:
            scope = {"pattern_id": first_pattern + 11 + number}
        specs.append({"kind": "dlq_not_empty", "threshold": number * 1000, **scope})
    for number in range(10):
        scope = {"queue": f"q{number}"} if number % 3 == 1 else {}
        if number % 3 == 2:
            scope = {"pattern_id": first_pattern + 11 + number}
        specs.append(
            {"kind": "dlq_growth", "threshold": 100 + number, "window_seconds": 60 * (1 + number % 2), **scope}
        )
    for number in range(9):
        specs.append(
            {
                "kind": "queue_depth",
                "severity": ["warning", "critical", "emergency"][number % 3],
                "for_seconds": 30,
                **({"queue": f"q{number}"} if number >= 3 else {}),
            }
        )
    for number in range(5):
        specs.append({"kind": "new_pattern", "window_seconds": 3600, **({"queue": f"q{number}.dlq"} if number else {})})
    for number in range(5):
        specs.append(
            {"kind": "pattern_reopened", "window_seconds": 3600, **({"queue": f"q{number}"} if number else {})}
        )
    for number in range(8):
        scope = {"queue": f"q{number}.dlq"} if number % 2 else {}
        specs.append({"kind": "oldest_age", "threshold": 3600 * (1 + number), **scope})
    for number in range(3):
        specs.append({"kind": "operation_paused", **({"queue": f"q{number}.dlq"} if number else {})})
    assert len(specs) == 50, len(specs)
    return [
        AlertRule.objects.create(
            name=f"bench {number:02d} {spec['kind']}", severity=spec.pop("severity", "warning"), **spec
        )
        for number, spec in enumerate(specs)
    ]


def timed(function: Callable[[], Any], runs: int) -> list[float]:
    timings = []
    for _ in range(runs):
        started = time.perf_counter()
        function()
        timings.append((time.perf_counter() - started) * 1000)
    return timings


def bare_replay(statements: list[str], runs: int) -> list[float]:
    """The captured statements sent straight through psycopg (no ORM), in a transaction rolled back each time."""
    from django.db import connection

    raw = connection.connection
    timings = []
    for _ in range(runs):
        started = time.perf_counter()
        with raw.cursor() as cursor:
            for sql in statements:
                cursor.execute(sql)
                if cursor.description is not None:
                    cursor.fetchall()
        raw.rollback()
        timings.append((time.perf_counter() - started) * 1000)
    return timings


def captured(function: Callable[[], Any]) -> list[str]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as capture:
        function()
    skip = ("SAVEPOINT", "RELEASE SAVEPOINT", "ROLLBACK TO SAVEPOINT")
    return [query["sql"] for query in capture.captured_queries if not query["sql"].startswith(skip)]


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def main() -> None:
    args = parse_args()
    url = os.environ.get("BENCH_ALERTS_DATABASE_URL", DEFAULT_URL)
    ensure_database(url)
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dlqconsole.settings")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    import django

    django.setup()
    from django.db import connection
    from django.utils import timezone
    from prometheus_client.core import REGISTRY

    from dlqconsole.alerts.evaluation import evaluate_rules
    from dlqconsole.alerts.models import Alert
    from dlqconsole.metrics import DeadLetterCollector, register_collector

    build_world(args.rows, rebuild=args.rebuild)
    connection.ensure_connection()

    clock = [timezone.now()]

    def tick() -> None:
        clock[0] += dt.timedelta(seconds=2)
        evaluate_rules(now=clock[0])

    for _ in range(3):
        tick()
    open_alerts = Alert.objects.open().count()
    tick_times = timed(tick, args.ticks)
    tick_sql = captured(tick)
    tick_bare = bare_replay(tick_sql, args.ticks)

    register_collector()
    collector = next(c for c in REGISTRY._collector_to_names if isinstance(c, DeadLetterCollector))

    def scrape() -> None:
        list(collector.collect())

    scrape()
    scrape_times = timed(scrape, args.scrapes)
    scrape_sql = captured(scrape)
    scrape_bare = bare_replay(scrape_sql, args.scrapes)

    print(f"\n== alert evaluation: {args.rows:,} dead letters, 50 rules, {open_alerts} open alerts")
    for label, timings, bare, statements in (
        ("evaluation tick", tick_times, tick_bare, tick_sql),
        ("/metrics collection", scrape_times, scrape_bare, scrape_sql),
    ):
        print(
            f"  {label:<20} median {statistics.median(timings):6.1f} ms   p95 {p95(timings):6.1f} ms   "
            f"({len(statements)} statements)"
        )
        print(
            f"  {'bare SQL':<20} median {statistics.median(bare):6.1f} ms   p95 {p95(bare):6.1f} ms   "
            f"ratio {statistics.median(timings) / statistics.median(bare):.2f}x"
        )
    for label, timings in (("tick", tick_times), ("scrape", scrape_times)):
        verdict = "OK" if p95(timings) < 100 else "OVER TARGET"
        print(f"  target: {label} p95 under 100 ms -> {verdict} (p95 {p95(timings):.1f} ms)")
    # The machine may be shared: a busy one stretches every number, so say how busy it was.
    print(f"  load average {os.getloadavg()[0]:.1f} at the end, on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
