"""Server time of the console's pages with 1,000,000 dead letters in PostgreSQL over 200 patterns.

    .venv/bin/python bench/pages.py                 # builds dlq_pages_bench once (a few minutes), then measures
    .venv/bin/python bench/pages.py --rows 100000   # a smaller world while developing
    .venv/bin/python bench/pages.py --rebuild       # throw the world away and build it again
    .venv/bin/python bench/pages.py --rows 10000000 --rebuild   # ten million: builds in under an hour on 2 cores

The world lives in its own database (BENCH_DATABASE_URL, default postgres://postgres@127.0.0.1:5432/dlq_pages_bench),
migrated like the real one. Dead letters are written with one INSERT ... SELECT over generate_series: 95% spread
over 30 days, 5% in the last day (half of them in the last hour: an incident in progress), ids rising with
arrival time as ingest makes them; patterns skewed so a few hold most letters; statuses parked (most), replayed,
archived, scheduled, failed. Each row's search_text is computed as ingest computes it (deadletters/search.py), and a
few bodies, spread over the 30 days and one in the last day, hold RARE_TERM, which a rare-term search finds. The
table's secondary indexes are dropped for the bulk insert and built again after it (much faster than keeping them
up to date row by row), and its foreign-key checks are skipped (the rows name patterns and a broker that exist).
Counters (DeadLetterCount, FailurePattern totals and first/last seen, ArrivalCount and PatternArrivalCount for the
days they keep) are filled from the rows with one GROUP BY each, so they are exact.

Each page is requested through Django's test Client in this process (middleware, session, templates: the server's
whole work, without a socket), logged in as an admin (so every control renders). Reported: median and p95 over the
runs, and a baseline: the same SQL statements the page ran, replayed bare through the driver, with the ratio.
Target: p95 under 100 ms for every page.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/dlq_pages_bench"

PATTERNS = 200
QUEUES = 8
FAMILIES = [
    ("TimeoutError", "TIMEOUT", "Request to inventory-{p} timed out after {n}ms"),
    ("ConnectionRefusedError", "NETWORK_ERROR", "connect ECONNREFUSED 10.0.{p}.{n}:5432"),
    ("HTTPError", "RATE_LIMITED", "429 Too Many Requests from partner-{p} (retry after {n}s)"),
    ("ValidationError", "VALIDATION_FAILED", "field 'sku_{p}' is invalid: value {n} out of range"),
    ("PermissionDenied", "AUTH", "token for tenant {p} expired {n} seconds ago"),
    ("KeyError", "NOT_FOUND", "order {n} not found in shard {p}"),
    ("IntegrityError", "CONFLICT", 'duplicate key value violates unique constraint "uniq_{p}" (id={n})'),
    ("RuntimeError", "INTERNAL", "worker {p} crashed while handling job {n}"),
]
STATUSES = [("parked", 85), ("replayed", 5), ("archived", 5), ("scheduled", 3), ("failed", 2)]
# In the bodies of a handful of dead letters only (RARE_ROWS spread over the whole range of ids, and one near the
# newest): what an engineer pastes from a log line, an order number or a trace id.
RARE_TERM = "Quokka-7731"
RARE_ROWS = 8


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=40, help="measured requests per page")
    parser.add_argument("--rebuild", action="store_true")
    return parser.parse_args()


def ensure_database(url: str) -> None:
    import psycopg

    name = url.rsplit("/", 1)[1]
    admin_url = url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        if not admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            admin.execute(f'CREATE DATABASE "{name}"')


def build_world(rows: int, *, rebuild: bool) -> None:
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection
    from django.utils import timezone

    from bench.bulk import bulk_loading
    from dlqconsole.brokers.models import default_broker_id
    from dlqconsole.deadletters.models import ARRIVAL_COUNT_RETENTION, DeadLetter, FailurePattern

    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM deadletters_failurepattern")
        patterns = cursor.fetchone()[0]
        cursor.execute("SELECT coalesce(max(id), 0) FROM deadletters_deadletter")
        existing = cursor.fetchone()[0]
    if not rebuild and patterns == PATTERNS and existing == rows:
        print(f"world: reusing {rows:,} dead letters over {PATTERNS} patterns")
        return
    started = time.perf_counter()
    tables = [
        "operations_operationitem",
        "operations_operation",
        "deadletters_deadlettercount",
        "deadletters_deadletter",
        "deadletters_patternevent",
    ]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename LIKE 'deadletters_%%'"
        )
        present = {row[0] for row in cursor.fetchall()}
        extra = sorted(present - set(tables) - {"deadletters_failurepattern"})
        cursor.execute(
            f"TRUNCATE {', '.join(tables + extra + ['deadletters_failurepattern'])} RESTART IDENTITY CASCADE"
        )
    FailurePattern.objects.bulk_create(
        FailurePattern(
            key=f"bench-{number:04d}",
            template=FAMILIES[number % len(FAMILIES)][2].format(p=number, n="<NUM>"),
            error_type=FAMILIES[number % len(FAMILIES)][0],
            failure_reason=FAMILIES[number % len(FAMILIES)][1],
            transient=FAMILIES[number % len(FAMILIES)][1] not in ("VALIDATION_FAILED", "AUTH", "NOT_FOUND", "CONFLICT"),
        )
        for number in range(1, PATTERNS + 1)
    )
    pattern_ids = list(FailurePattern.objects.order_by("key").values_list("id", flat=True))
    status_case = []
    cumulative = 0
    for status, share in STATUSES:
        cumulative += share
        status_case.append(f"WHEN (g.i * 7) % 100 < {cumulative} THEN '{status}'")
    columns = [str(field.column) for field in DeadLetter._meta.concrete_fields if field.column != "id"]
    values = {
        "dedupe_key": "md5('bench-' || g.i)",
        # Every dead letter on the broker `default`, as ingest from AMQP_URL alone files them.
        "broker_id": str(default_broker_id()),
        "source_queue": "'svc' || (g.p % %(queues)s) || '.dlq'",
        "original_queue": "'svc' || (g.p % %(queues)s)",
        "original_exchange": "'shop'",
        "original_routing_keys": "jsonb_build_array('svc' || (g.p % %(queues)s) || '.work')",
        "death_reason": "'rejected'",
        "failure_reason": "{reason}",
        "transient": "{reason} NOT IN ('VALIDATION_FAILED', 'AUTH', 'NOT_FOUND', 'CONFLICT')",
        "error_type": "{type}",
        "error_message": "replace(replace({message}, '{p}', g.p::text), '{n}', (g.i % 5000)::text)",
        "stack_trace": "''",
        "attempt_count": "1 + g.i % 5",
        "first_failed_at": "g.at - interval '2 minutes'",
        "last_failed_at": "g.at - interval '1 second'",
        "ingested_at": "g.at",
        "host": "'web-' || (g.i % 12)",
        "app_version": "'1.' || (g.i % 4) || '.0'",
        "message_id": "'m-' || g.i",
        "correlation_id": "'c-' || (g.i / 3)",
        "priority": "CASE WHEN g.i % 10 = 0 THEN g.i % 10 ELSE NULL END",
        "content_type": "'application/json'",
        "content_encoding": "''",
        "task_name": "''",
        "task_id": "''",
        "task_retries": "NULL",
        "headers": "jsonb_build_object('x-exception-type', {type}, 'x-host', 'web-' || (g.i % 12), "
        "'x-app-version', '1.' || (g.i % 4) || '.0', 'tenant', 't' || (g.i % 50))",
        "properties": "jsonb_build_object('message_id', 'm-' || g.i, 'content_type', 'application/json', "
        "'delivery_mode', 2)",
        "x_death": "jsonb_build_array(jsonb_build_object('count', 1, 'reason', 'rejected', 'queue', "
        "'svc' || (g.p % %(queues)s), 'exchange', 'shop', 'routing-keys', "
        "jsonb_build_array('svc' || (g.p % %(queues)s) || '.work'), "
        "'time', jsonb_build_object('$ts', extract(epoch from g.at)::bigint)))",
        "body": "g.body",
        "body_size": "length(g.body)",
        "body_truncated": "false",
        "parse_errors": "'[]'::jsonb",
        "fingerprint": "'bench-' || lpad(g.p::text, 4, '0')",
        # As deadletters/search.py computes it; the bodies are valid UTF-8 and hold no NUL.
        "search_text": "lower({type} || E'\\n' || replace(replace({message}, '{p}', g.p::text), '{n}', "
        "(g.i % 5000)::text) || E'\\n' || convert_from(substring(g.body from 1 for %(search_bytes)s), 'UTF8'))",
        "pattern_id": "(%(pattern_ids)s)[g.p]",
        "status": f"CASE {' '.join(status_case)} ELSE 'parked' END",
        "status_changed_at": "g.at",
        "replay_count": "CASE WHEN (g.i * 7) % 100 BETWEEN 85 AND 89 THEN 1 ELSE 0 END",
        "next_retry_at": "CASE WHEN (g.i * 7) % 100 BETWEEN 95 AND 97 THEN now() + interval '5 minutes' END",
        "retry_exhausted": "false",
        "previous_id": "NULL",
        "edited_from_id": "NULL",
        "identical_to_id": "NULL",
    }
    missing = [column for column in columns if column not in values]
    if missing:
        raise SystemExit(f"bench/pages.py does not know how to fill {missing}; teach it")
    spread = int(rows * 0.95)
    recent = rows - spread
    rare = f"g.i % {max(rows // RARE_ROWS, 1)} = 777 OR g.i = {max(rows - 1000, 1)}"
    sql = f"""
        INSERT INTO deadletters_deadletter ({", ".join(columns)})
        SELECT {", ".join(values[column] for column in columns)}
        FROM (
          SELECT g.*, convert_to(json_build_object('order', g.i, 'sku', 'SKU-' || (g.i % 977), 'lines',
                 json_build_array(g.i % 7, g.i % 11, g.i % 13),
                 'note', CASE WHEN {rare} THEN 'seen with {RARE_TERM} upstream' ELSE repeat('x', 60 + g.i % 120) END
                 )::text, 'UTF8') AS body
          FROM (
            SELECT s.i, q.p, q.p % {len(FAMILIES)} + 1 AS f,
                   CASE WHEN s.i <= {spread}
                        THEN now() - interval '30 days' + interval '29 days' * s.i / {max(spread, 1)}
                        WHEN s.i <= {spread + recent // 2}
                        THEN now() - interval '1 day' + interval '23 hours' * (s.i - {spread}) / {max(recent // 2, 1)}
                        ELSE now() - interval '1 hour'
                             + interval '59 minutes' * (s.i - {spread + recent // 2}) / {max(recent - recent // 2, 1)}
                   END AS at
            FROM generate_series(1, {rows}) AS s(i)
            -- Patterns skewed: the square of a uniform spread puts most letters in the first patterns.
            CROSS JOIN LATERAL (
                SELECT 1 + floor({PATTERNS} * power(((s.i::bigint * 7919) % 1000003) / 1000003.0, 2))::int AS p
            ) AS q
          ) AS g
        ) AS g
    """
    sql = (
        sql.replace("%(queues)s", str(QUEUES))
        .replace("%(search_bytes)s", str(settings.DLQ_SEARCH_BODY_BYTES))
        .replace("%(pattern_ids)s", "ARRAY[" + ",".join(map(str, pattern_ids)) + "]")
        .replace("{type}", "(ARRAY[" + ", ".join(_sql(t) for t, _, _ in FAMILIES) + "])[g.f]")
        .replace("{reason}", "(ARRAY[" + ", ".join(_sql(r) for _, r, _ in FAMILIES) + "])[g.f]")
        .replace("{message}", "(ARRAY[" + ", ".join(_sql(m) for _, _, m in FAMILIES) + "])[g.f]")
    )
    with bulk_loading("deadletters_deadletter"), connection.cursor() as cursor:
        cursor.execute(sql)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO deadletters_deadlettercount (broker_id, source_queue, pattern_id, failure_reason, status, "
            "count) SELECT broker_id, source_queue, pattern_id, failure_reason, status, count(*) "
            "FROM deadletters_deadletter GROUP BY 1, 2, 3, 4, 5"
        )
        # Arrival counts as ingest would have kept them (the dashboard's charts read them), for the days they are
        # kept.
        cursor.execute(
            "INSERT INTO deadletters_arrivalcount (minute, broker_id, source_queue, count) "
            "SELECT date_trunc('minute', ingested_at), broker_id, source_queue, count(*) FROM deadletters_deadletter "
            "WHERE ingested_at >= %s GROUP BY 1, 2, 3",
            [timezone.now() - ARRIVAL_COUNT_RETENTION],
        )
        cursor.execute(
            "INSERT INTO deadletters_patternarrivalcount (pattern_id, hour, count) "
            "SELECT pattern_id, date_trunc('hour', ingested_at), count(*) FROM deadletters_deadletter "
            "WHERE ingested_at >= %s GROUP BY 1, 2",
            [timezone.now() - ARRIVAL_COUNT_RETENTION],
        )
        cursor.execute(
            "UPDATE deadletters_failurepattern p SET total_count = s.n, first_seen_at = s.first, last_seen_at = s.last "
            "FROM (SELECT pattern_id, count(*) n, min(ingested_at) first, max(ingested_at) last "
            "FROM deadletters_deadletter GROUP BY 1) s WHERE s.pattern_id = p.id"
        )
    _side_records()
    with connection.cursor() as cursor:
        cursor.execute("VACUUM (ANALYZE) deadletters_deadletter")
        cursor.execute("ANALYZE")
    print(f"world: built {rows:,} dead letters over {PATTERNS} patterns in {time.perf_counter() - started:.0f} s")


def _side_records() -> None:
    """Watched queues with depth samples, and a short operations history, as a running console has."""
    import datetime as dt

    from django.utils import timezone

    from dlqconsole.ingest.models import QueueSample, WatchedQueue
    from dlqconsole.operations.models import Operation

    now = timezone.now()
    WatchedQueue.objects.all().delete()
    QueueSample.objects.all().delete()
    for number in range(QUEUES):
        WatchedQueue.objects.create(
            name=f"svc{number}", dead_letter_queue=f"svc{number}.dlq", dead_letter_exchange=f"svc{number}.dlx"
        )
        QueueSample.objects.bulk_create(
            QueueSample(
                queue=f"svc{number}",
                messages=(minute * 7 + number * 60) % 600,
                consumers=number % 3,
                sampled_at=now - dt.timedelta(minutes=minute),
            )
            for minute in range(0, 24 * 60, 1)
        )
    Operation.objects.bulk_create(
        Operation(kind="retry", filter={"pattern": [number]}, status="done", total=100, succeeded=100)
        for number in range(1, 30)
    )


def _sql(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def measure(name: str, request: Callable[[], Any], *, runs: int) -> dict[str, Any]:
    from django.db import OperationalError, connection
    from django.test.utils import CaptureQueriesContext

    for _ in range(3):
        response = request()
        assert response.status_code == 200, (name, response.status_code)
    timings = []
    cpu = []
    for _ in range(runs):
        started, started_cpu = time.perf_counter(), time.process_time()
        request()
        timings.append((time.perf_counter() - started) * 1000)
        cpu.append((time.process_time() - started_cpu) * 1000)
    with CaptureQueriesContext(connection) as captured:
        request()
    statements = [query["sql"] for query in captured.captured_queries]
    sql_timings = []
    with connection.cursor() as cursor:
        for _ in range(runs):
            started = time.perf_counter()
            try:
                for statement in statements:
                    cursor.execute(statement)
                    if cursor.description is not None:
                        cursor.fetchall()
            except OperationalError:
                # The page's own time limit (set_config in its transaction) stopped the statement, as it stopped
                # the page's: the bare SQL took as long.
                cursor.execute("ROLLBACK")
            sql_timings.append((time.perf_counter() - started) * 1000)
    return {
        "page": name,
        "median": statistics.median(timings),
        "p95": percentile(timings, 95),
        "cpu": statistics.median(cpu),
        "sql_median": statistics.median(sql_timings),
        "sql_p95": percentile(sql_timings, 95),
        "queries": len(statements),
    }


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    index = max(0, min(len(ordered) - 1, round(share / 100 * len(ordered)) - 1))
    return ordered[index]


def main() -> None:
    options = parse_args()
    url = os.environ.get("BENCH_DATABASE_URL", DEFAULT_URL)
    ensure_database(url)
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dlqconsole.settings")
    os.environ.setdefault("ALLOWED_HOSTS", "testserver")
    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client

    build_world(options.rows, rebuild=options.rebuild)
    user, _ = User.objects.get_or_create(username="bench-admin", defaults={"is_superuser": True, "is_staff": True})
    client = Client()
    client.force_login(user)
    with connection.cursor() as cursor:
        # The cursor of page 500: the 25,000th visible dead letter, newest first (OFFSET only to find it here).
        cursor.execute(
            "SELECT id FROM deadletters_deadletter WHERE status <> 'archived' ORDER BY id DESC OFFSET %s LIMIT 1",
            [min(499 * 50 - 1, int(options.rows * 0.9))],
        )
        page_500 = cursor.fetchone()[0]
        cursor.execute("SELECT id FROM deadletters_deadletter ORDER BY id DESC LIMIT 1 OFFSET 1234")
        detail = cursor.fetchone()[0]
        cursor.execute("SELECT pattern_id FROM deadletters_deadlettercount ORDER BY count DESC LIMIT 1")
        top_pattern = cursor.fetchone()[0]
    # The reason of svc3's dead letters (the world ties a queue to its patterns' family).
    reason = FAMILIES[3][1]
    hx = {"HX-Request": "true"}
    pages: list[tuple[str, Callable[[], Any]]] = [
        ("dashboard", lambda: client.get("/")),
        ("dashboard (htmx refresh)", lambda: client.get("/", headers=hx)),
        ("patterns", lambda: client.get("/patterns/")),
        ("pattern detail", lambda: client.get(f"/patterns/{top_pattern}/")),
        ("messages, first page", lambda: client.get("/messages/")),
        ("messages, queue + reason", lambda: client.get(f"/messages/?queue=svc3.dlq&reason={reason}", headers=hx)),
        # A combination that never occurs: the counters say so, and no scan is made.
        ("messages, queue + no reason", lambda: client.get("/messages/?queue=svc3.dlq&reason=TIMEOUT", headers=hx)),
        # A common term (one dead letter in eight), a rare one (in a handful of bodies), with time windows.
        ("messages, text in the error", lambda: client.get("/messages/?text=timed%20out", headers=hx)),
        ("messages, rare text", lambda: client.get(f"/messages/?text={RARE_TERM}", headers=hx)),
        ("messages, rare text + 1d", lambda: client.get(f"/messages/?text={RARE_TERM}&since=1d", headers=hx)),
        ("messages, rare text + until", lambda: client.get(f"/messages/?text={RARE_TERM}&until=25d", headers=hx)),
        ("messages, since 1h", lambda: client.get("/messages/?since=1h", headers=hx)),
        ("messages, since 1d", lambda: client.get("/messages/?since=1d", headers=hx)),
        # Far from the newest rows: PostgreSQL walks the primary key back from the newest row, filtering on the
        # time, through every dead letter newer than the window (most of them). Past 5 s the page stops it and says
        # so (the API answers 400), hence few runs and no API request of it.
        ("messages, until 25d", lambda: client.get("/messages/?until=25d", headers=hx)),
        ("messages, 26d to 25d ago", lambda: client.get("/messages/?since=26d&until=25d", headers=hx)),
        ("api, rare text", lambda: client.get(f"/api/v1/dead-letters/?text={RARE_TERM}")),
        ("api, until 25d", lambda: client.get("/api/v1/dead-letters/?until=25d")),
        ("messages, pattern", lambda: client.get(f"/messages/?pattern={top_pattern}", headers=hx)),
        ("messages, page 500 (keyset)", lambda: client.get(f"/messages/?before={page_500}", headers=hx)),
        ("message detail", lambda: client.get(f"/messages/{detail}/")),
        ("operations", lambda: client.get("/operations/")),
    ]
    load_before = os.getloadavg()[0]
    results = [measure(name, request, runs=options.runs) for name, request in pages]
    load_after = os.getloadavg()[0]
    print(f"\n{options.rows:,} dead letters, {PATTERNS} patterns, {options.runs} runs per page (ms)")
    # The machine is shared: a busy one stretches every number, so say how busy it was.
    print(f"load average {load_before:.1f} before, {load_after:.1f} after, on {os.cpu_count()} CPUs")
    # median and p95: wall time of the request; cpu: this process's own CPU time (Python, templates), the part
    # that does not wait for PostgreSQL or for a CPU another process holds; sql: the same statements, bare.
    print(f"{'page':<30}{'median':>9}{'p95':>9}{'cpu':>8}{'sql med':>10}{'sql p95':>10}{'ratio':>8}{'queries':>9}")
    for row in results:
        ratio = row["median"] / row["sql_median"] if row["sql_median"] else float("inf")
        print(
            f"{row['page']:<30}{row['median']:>9.1f}{row['p95']:>9.1f}{row['cpu']:>8.1f}{row['sql_median']:>10.1f}"
            f"{row['sql_p95']:>10.1f}{ratio:>8.1f}{row['queries']:>9}"
        )
    worst = max(row["p95"] for row in results)
    print(f"\nworst p95 {worst:.1f} ms; target under 100 ms: {'met' if worst < 100 else 'NOT met'}")


if __name__ == "__main__":
    main()
