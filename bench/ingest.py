"""Ingest throughput: `consume_dlq` into PostgreSQL against a bare pika + psycopg consumer, in the same run.

    .venv/bin/python bench/ingest.py                 # 100,000 dead letters each
    .venv/bin/python bench/ingest.py --n 10000       # smaller, while developing
    .venv/bin/python bench/ingest.py --keep          # keep the database dlq_bench afterwards

Setup: a fresh database (dlq_bench), one work queue whose dead-letter exchange fans out to four DLQs, and
N / 2 messages published to the work queue with a per-message TTL of 0, so that RabbitMQ itself dead-letters
each one into every DLQ (with x-death, x-first-death-*). Messages carry realistic error headers (exception
type, message with varying numbers, ids, hosts and service names, sometimes a stack trace; host, app
version), so that they fall into a few hundred patterns.

Then, one after the other, on a DLQ each: bare, consume_dlq, consume_dlq --processes 1 (twice), consume_dlq,
bare (so that a machine getting busier or quieter during the run weighs on all alike):
- bare: a hand-written consumer (pika BlockingConnection, prefetch 1000, batches of 500 or 0.2 s) that
  extracts the same columns (the newest x-death entry, the error headers, the same fingerprint and
  classification functions, the headers as JSON, a sha256 dedupe key) and COPYs them into a table with the
  same columns and indexes as DeadLetter, commits, then acks with multiple=True. No patterns, counters,
  statistics, validation or recovery.
- consume_dlq: the real command (`manage.py consume_dlq --queues ... --exit-when-idle 1`) with its defaults:
  on PostgreSQL one consumer process per core (two here), as a deployment runs it.
- consume_dlq --processes 1: the same in one process (one core for Python, plus its writer thread), to show
  what the processes add and what one consumer costs per message next to the bare one.

Each rate is N divided by the summed times from the first message leaving a DLQ (its ready count drops) to
the consumer's last commit. Process start-up (Python, Django) is not in the rates; the CPU times of the
consumer processes (start-up included) are reported too, as they vary less with the machine's load. The run
checks that each consumer stored exactly N rows, that the counters (DeadLetterCount,
FailurePattern.total_count, ArrivalCount, PatternArrivalCount, IngestStat) add up to N and that the DLQs are empty.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import random
import resource
import subprocess
import sys
import time
import uuid
from functools import partial
from pathlib import Path
from typing import Any

import pika
import psycopg

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    PYTHON,
    amqp_channel,
    drop_database,
    fresh_database,
    project_env,
    queue_depth,
    rate,
    report,
    wait_until,
)

BATCH_SIZE = 500
BATCH_SECONDS = 0.2
PREFETCH = 1000
BARE_TABLE = "bench_bare_deadletter"

SERVICES = [
    "orders",
    "payments",
    "inventory",
    "shipping",
    "billing",
    "accounts",
    "search",
    "catalog",
    "pricing",
    "notifications",
    "emails",
    "reports",
    "invoices",
    "refunds",
    "loyalty",
    "reviews",
    "checkout",
    "sessions",
    "tax",
    "fraud",
]
# (exception type, message template): {service}, {n}, {host}, {id}, {field} vary per message.
ERRORS = [
    ("requests.exceptions.ReadTimeout", "Timeout calling {service} after {n}ms"),
    ("ConnectionResetError", "Connection reset by peer while talking to {service} at {host}:5432"),
    ("ValidationError", "Field {field} of {service} request {id} is invalid: expected integer, got string"),
    ("RateLimitExceeded", "{service} API rate limit exceeded: 429 Too Many Requests, retry after {n}s"),
    ("KeyError", "{service} record {id} not found"),
    ("psycopg.errors.UniqueViolation", "duplicate key value violates unique constraint {service}_pkey"),
    ("PermissionDenied", "token for {service} expired at {when}"),
    ("RuntimeError", "{service} worker crashed with exit code {n}"),
    ("json.decoder.JSONDecodeError", "Expecting value in {service} payload: line 1 column {n} (char {n})"),
    ("TimeoutError", "Lock on {service} order {id} not acquired within {n} seconds"),
    ("smtplib.SMTPServerDisconnected", "{service} mail relay {host} closed the connection unexpectedly"),
    ("ZeroDivisionError", "division by zero in {service} totals"),
    ("OSError", "[Errno 28] No space left on device: /var/lib/{service}/spool/{id}.tmp"),
    ("botocore.exceptions.ClientError", "An error occurred (SlowDown) when calling PutObject on {service}"),
    ("ValueError", "invalid literal for int() with base 10 in {service}"),
]
FIELDS = ["amount", "currency", "email", "sku", "quantity", "postcode"]
STACK = (
    "Traceback (most recent call last):\n"
    '  File "/app/{service}/worker.py", line {n}, in handle\n'
    "    result = process(message)\n"
    '  File "/app/{service}/process.py", line 88, in process\n'
    "    raise {error_type}(text)\n"
)


def message(index: int, randomness: random.Random) -> tuple[bytes, pika.BasicProperties]:
    service = SERVICES[randomness.randrange(len(SERVICES))]
    error_type, template = ERRORS[randomness.randrange(len(ERRORS))]
    values = {
        "service": service,
        "n": randomness.randrange(1, 30000),
        "host": f"10.{randomness.randrange(256)}.{randomness.randrange(256)}.{randomness.randrange(1, 255)}",
        "id": uuid.UUID(int=randomness.getrandbits(128)),
        "field": FIELDS[randomness.randrange(len(FIELDS))],
        "when": dt.datetime(2026, 11, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=randomness.randrange(10**6)),
    }
    headers: dict[str, Any] = {
        "x-exception-type": error_type,
        "x-exception-message": template.format(**values),
        "x-host": f"{service}-worker-{randomness.randrange(8)}",
        "x-app-version": f"2.{randomness.randrange(12)}.{randomness.randrange(4)}",
    }
    if randomness.random() < 0.2:
        headers["x-exception-stacktrace"] = STACK.format(service=service, n=values["n"], error_type=error_type)
    body = json.dumps(
        {
            "id": index,
            "order_id": str(values["id"]),
            "customer": {"id": randomness.randrange(10**6), "tier": "gold"},
            "items": [{"sku": f"SKU-{randomness.randrange(10**5)}", "qty": randomness.randrange(1, 5)}] * 3,
            "amount": f"{randomness.randrange(100, 100000) / 100:.2f}",
        }
    ).encode()
    properties = pika.BasicProperties(
        message_id=str(uuid.UUID(int=randomness.getrandbits(128))),
        correlation_id=f"req-{index}",
        content_type="application/json",
        delivery_mode=2,
        timestamp=int(time.time()),
        app_id=f"{service}-service",
        expiration="0",
        headers=headers,
    )
    return body, properties


def fill(work_queue: str, dead_letter_queues: list[str], n: int) -> float:
    """Declare the topology and publish n messages that RabbitMQ dead-letters into every DLQ. Returns seconds."""
    started = time.monotonic()
    randomness = random.Random(20261125)
    with amqp_channel() as channel:
        channel.exchange_declare(exchange=work_queue + ".dlx", exchange_type="fanout", durable=True)
        for queue in dead_letter_queues:
            channel.queue_declare(queue=queue, durable=True)
            channel.queue_bind(queue=queue, exchange=work_queue + ".dlx")
        channel.queue_declare(queue=work_queue, durable=True, arguments={"x-dead-letter-exchange": work_queue + ".dlx"})
        for index in range(n):
            body, properties = message(index, randomness)
            channel.basic_publish(exchange="", routing_key=work_queue, body=body, properties=properties)
    for queue in dead_letter_queues:
        if not wait_until(partial(filled, queue, n), timeout=120, interval=0.5):
            sys.exit(f"{queue} holds {queue_depth(queue)} of {n} dead letters after 120 s")
    return time.monotonic() - started


def filled(queue: str, n: int) -> bool:
    return queue_depth(queue) >= n


def delete_queues(work_queue: str, dead_letter_queues: list[str]) -> None:
    with amqp_channel() as channel:
        for queue in [work_queue, *dead_letter_queues]:
            channel.queue_delete(queue=queue)
        channel.exchange_delete(exchange=work_queue + ".dlx")


def create_bare_table(database_url: str) -> None:
    """A table with DeadLetter's columns (those ingest writes) and indexes, without foreign keys."""
    from dlqconsole.ingest.services import COLUMNS

    columns = ", ".join(COLUMNS)
    with psycopg.connect(database_url, autocommit=True) as connection:
        connection.execute(f"DROP TABLE IF EXISTS {BARE_TABLE}")
        connection.execute(f"CREATE TABLE {BARE_TABLE} AS SELECT {columns} FROM deadletters_deadletter WITH NO DATA")
        connection.execute(
            f"ALTER TABLE {BARE_TABLE} ADD COLUMN id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY"
        )
        indexes = connection.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'deadletters_deadletter' "
            "AND indexdef NOT LIKE '%(id)'"
        ).fetchall()
        for name, definition in indexes:
            try:
                connection.execute(
                    definition.replace(f"INDEX {name} ", f"INDEX bare_{name} ").replace(
                        "ON public.deadletters_deadletter ", f"ON public.{BARE_TABLE} "
                    )
                )
            except psycopg.errors.UndefinedColumn:
                continue  # an index on a column ingest does not write (edited_from)


def bare_row(queue: str, broker_id: int, properties: Any, body: bytes, now: dt.datetime) -> dict[str, Any]:
    """The bare consumer's row: {column: value} for every column the console's ingest writes (COLUMNS)."""
    from dlqconsole.deadletters.classify import classify
    from dlqconsole.deadletters.fingerprint import fingerprint
    from dlqconsole.deadletters.search import search_text

    headers = properties.headers or {}
    deaths = headers.get("x-death") or [{}]
    newest = deaths[0]
    error_type = headers.get("x-exception-type", "")
    error_message = headers.get("x-exception-message", "")
    stack_trace = headers.get("x-exception-stacktrace", "")
    headers_json = json.dumps(headers, default=str)
    properties_json = json.dumps(
        {"message_id": properties.message_id, "content_type": properties.content_type}, default=str
    )
    key = hashlib.sha256(queue.encode() + properties_json.encode() + headers_json.encode() + body).hexdigest()
    reason = classify(error_type=error_type, message=error_message, stack_trace=stack_trace)
    found = fingerprint(error_type=error_type, message=error_message, stack_trace=stack_trace)
    failed_at = newest.get("time", now)
    return {
        "dedupe_key": key,
        "broker_id": broker_id,
        "source_queue": queue,
        "original_queue": newest.get("queue", ""),
        "original_exchange": newest.get("exchange", ""),
        "original_routing_keys": json.dumps(newest.get("routing-keys", [])),
        "death_reason": newest.get("reason", "unknown"),
        "failure_reason": reason or "UNKNOWN",
        "transient": True,
        "error_type": error_type,
        "error_message": error_message,
        "stack_trace": stack_trace,
        "attempt_count": newest.get("count", 1),
        "first_failed_at": failed_at,
        "last_failed_at": failed_at,
        "ingested_at": now,
        "host": headers.get("x-host", ""),
        "app_version": headers.get("x-app-version", ""),
        "message_id": properties.message_id or "",
        "correlation_id": properties.correlation_id or "",
        "priority": properties.priority,
        "content_type": properties.content_type or "",
        "content_encoding": properties.content_encoding or "",
        "task_name": "",
        "task_id": "",
        "task_retries": None,
        "headers": headers_json,
        "properties": properties_json,
        "x_death": json.dumps(deaths, default=str),
        "body": body,
        "body_size": len(body),
        "body_truncated": False,
        "parse_errors": "[]",
        "fingerprint": found.key,
        "search_text": search_text(error_type, error_message, body),
        "pattern_id": 0,
        "status": "parked",
        "status_changed_at": now,
        "replay_count": 0,
        "retry_exhausted": False,
        "previous_id": None,
        "identical_to_id": None,
    }


def check_bare_columns() -> None:
    """Exit unless the bare consumer writes exactly the columns the console's ingest writes: a column added to
    ingest (and its indexes) must cost the bare consumer too, or the ratio flatters nobody."""
    from dlqconsole.ingest.services import COLUMNS

    body, properties = message(0, random.Random(0))
    written = bare_row("check", 1, properties, body, dt.datetime.now(dt.UTC)).keys()
    missing, extra = sorted(set(COLUMNS) - written), sorted(written - set(COLUMNS))
    if missing or extra:
        sys.exit(f"the bare consumer's row differs from ingest's COLUMNS: missing {missing}, extra {extra}")


def bare_consume(queue: str, database_url: str, idle: float) -> None:
    """The baseline consumer. Prints {"count", "last_commit", "first_delivery"} as JSON when the queue is idle."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dlqconsole.settings")
    import django

    django.setup()
    from dlqconsole.brokers.models import default_broker_id
    from dlqconsole.ingest.services import COLUMNS

    check_bare_columns()
    broker_id = default_broker_id()
    database = psycopg.connect(database_url)
    connection = pika.BlockingConnection(pika.URLParameters(os.environ["AMQP_URL"]))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=PREFETCH)
    buffer: list[tuple[int, Any, bytes]] = []
    state = {"first": 0.0, "last_activity": time.monotonic(), "batch_started": 0.0}

    def on_message(_channel: Any, method: Any, properties: Any, body: bytes) -> None:
        if not buffer:
            state["batch_started"] = time.monotonic()
        if not state["first"]:
            state["first"] = time.time()
        buffer.append((method.delivery_tag, properties, body))
        state["last_activity"] = time.monotonic()

    channel.basic_consume(queue=queue, on_message_callback=on_message)
    count = 0
    last_commit = 0.0
    copy_sql = f"COPY {BARE_TABLE} ({', '.join(COLUMNS)}) FROM STDIN"
    while True:
        if buffer:
            remaining = state["batch_started"] + BATCH_SECONDS - time.monotonic()
            connection.process_data_events(time_limit=max(0.0, min(0.1, remaining)))
        else:
            connection.process_data_events(time_limit=0.1)
        due = buffer and (len(buffer) >= BATCH_SIZE or time.monotonic() - state["batch_started"] >= BATCH_SECONDS)
        if due:
            now = dt.datetime.now(dt.UTC)
            with database.cursor() as cursor, cursor.copy(copy_sql) as copy:
                for _, properties, body in buffer:
                    values = bare_row(queue, broker_id, properties, body, now)
                    copy.write_row(tuple(values[name] for name in COLUMNS))
            database.commit()
            channel.basic_ack(delivery_tag=buffer[-1][0], multiple=True)
            count += len(buffer)
            buffer.clear()
            last_commit = time.time()
        elif not buffer and time.monotonic() - state["last_activity"] > idle:
            break
    connection.close()
    database.close()
    print(json.dumps({"count": count, "last_commit": last_commit, "first_delivery": state["first"]}))


def wait_for_start(queue: str, n: int, process: subprocess.Popen[str], timeout: float = 60) -> float:
    """The wall-clock moment the consumer started taking messages: the DLQ's ready count drops below n."""
    with amqp_channel() as channel:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and process.poll() is None:
            if channel.queue_declare(queue=queue, passive=True).method.message_count < n:
                return time.time()
            time.sleep(0.005)
    output = process.communicate()
    sys.exit(f"the consumer of {queue} never started: {output}")


def run_consumer(command: list[str], env: dict[str, str], queue: str, n: int) -> tuple[float, str, float]:
    """Start a consumer process, wait until it exits; returns (start time, stdout, CPU seconds it used)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    started = wait_for_start(queue, n, process)
    stdout, stderr = process.communicate(timeout=3600)
    if process.returncode != 0:
        sys.exit(f"{command[1:3]} failed ({process.returncode}):\n{stderr}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return started, stdout, cpu


def one(connection: psycopg.Connection[Any], query: str, parameters: list[Any] | None = None) -> tuple[Any, ...]:
    row = connection.execute(query, parameters).fetchone()  # type: ignore[arg-type]
    if row is None:
        sys.exit(f"no result for {query}")
    return tuple(row)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=100_000, help="dead letters per consumer")
    parser.add_argument("--database", default="dlq_bench")
    parser.add_argument("--keep", action="store_true", help="keep the database and print its URL")
    parser.add_argument("--bare-consumer", metavar="QUEUE", help=argparse.SUPPRESS)
    parser.add_argument("--database-url", help=argparse.SUPPRESS)
    arguments = parser.parse_args()

    if arguments.bare_consumer:
        bare_consume(arguments.bare_consumer, arguments.database_url, idle=1.0)
        return

    half = max(1, arguments.n // 2)
    n = 2 * half
    database_url = fresh_database(arguments.database)
    env = project_env(database_url)
    os.environ.update(DATABASE_URL=database_url, DJANGO_SETTINGS_MODULE="dlqconsole.settings")
    import django

    django.setup()
    from dlqconsole.brokers.models import default_broker_id

    # consume_dlq files the DLQs under the broker `default` (AMQP_URL): the rows and counters are read there.
    broker_id = default_broker_id()
    check_bare_columns()
    create_bare_table(database_url)

    work_queue = f"bench.ingest.{uuid.uuid4().hex[:8]}"
    # Two halves each, in mirrored order: a machine that gets busier or quieter during the run weighs on all
    # consumers alike.
    order = [("bare", 1), ("consume_dlq", 1), ("single", 1), ("single", 2), ("consume_dlq", 2), ("bare", 2)]
    queues = {run: f"{work_queue}.{run[0]}.{run[1]}.dlq" for run in order}
    seconds = {"bare": 0.0, "consume_dlq": 0.0, "single": 0.0}
    cpu = {"bare": 0.0, "consume_dlq": 0.0, "single": 0.0}
    try:
        fill_seconds = fill(work_queue, list(queues.values()), half)
        print(f"{half:,} dead letters in each of {len(queues)} DLQs ({fill_seconds:.1f} s)", flush=True)
        for kind, round_number in order:
            queue = queues[(kind, round_number)]
            if kind == "bare":
                command = [PYTHON, str(Path(__file__)), "--bare-consumer", queue, "--database-url", database_url]
            else:
                command = [PYTHON, str(ROOT / "manage.py"), "consume_dlq", "--queues", queue, "--exit-when-idle", "1"]
                if kind == "single":
                    command += ["--processes", "1"]
            started, output, used = run_consumer(command, env, queue, half)
            if kind == "bare":
                finished = json.loads(output.strip().splitlines()[-1])["last_commit"]
            else:
                with psycopg.connect(database_url) as connection:
                    (last_batch_at,) = one(
                        connection,
                        "SELECT last_batch_at FROM ingest_ingeststat WHERE broker_id = %s AND source_queue = %s",
                        [broker_id, queue],
                    )
                finished = last_batch_at.timestamp()
            seconds[kind] += finished - started
            cpu[kind] += used
            print(f"  {kind} round {round_number}: {rate(half, finished - started):,.0f} msg/s", flush=True)
        ours = [queue for (kind, _), queue in queues.items() if kind != "bare"]
        with psycopg.connect(database_url) as connection:
            received, inserted = one(
                connection,
                "SELECT sum(received), sum(inserted) FROM ingest_ingeststat "
                "WHERE broker_id = %s AND source_queue = ANY(%s)",
                [broker_id, ours],
            )
            (rows,) = one(
                connection,
                "SELECT count(*) FROM deadletters_deadletter WHERE broker_id = %s AND source_queue = ANY(%s)",
                [broker_id, ours],
            )
            (cells,) = one(connection, "SELECT coalesce(sum(count), 0) FROM deadletters_deadlettercount")
            (arrivals,) = one(connection, "SELECT coalesce(sum(count), 0) FROM deadletters_arrivalcount")
            (hourly,) = one(connection, "SELECT coalesce(sum(count), 0) FROM deadletters_patternarrivalcount")
            patterns, total = one(
                connection, "SELECT count(*), coalesce(sum(total_count), 0) FROM deadletters_failurepattern"
            )
            (bare_rows,) = one(connection, f"SELECT count(*) FROM {BARE_TABLE}")
        left = sum(queue_depth(queue) for queue in queues.values())
    finally:
        delete_queues(work_queue, list(queues.values()))
        if not arguments.keep:
            drop_database(arguments.database)

    bare_rate, ours_rate = rate(n, seconds["bare"]), rate(n, seconds["consume_dlq"])
    single_rate = rate(n, seconds["single"])
    report(
        f"ingest: {n:,} broker-dead-lettered messages per consumer into PostgreSQL",
        [
            ("bare pika + psycopg COPY", line(bare_rate, seconds["bare"], cpu["bare"], n)),
            ("consume_dlq", line(ours_rate, seconds["consume_dlq"], cpu["consume_dlq"], n)),
            ("consume_dlq --processes 1", line(single_rate, seconds["single"], cpu["single"], n)),
            ("ratio consume_dlq / bare", f"{ours_rate / bare_rate:.0%} (target >= 75% and >= 3,500 msg/s)"),
            ("ratio --processes 1 / bare", f"{single_rate / bare_rate:.0%}"),
            ("patterns", f"{patterns:,}"),
            ("rows (consume_dlq, both runs / bare)", f"{rows:,} / {bare_rows:,}"),
            (
                "counters (cells / patterns / arrivals / pattern arrivals / IngestStat)",
                f"{cells:,} / {total:,} / {arrivals:,} / {hourly:,} / {inserted:,} of {received:,}",
            ),
            ("messages left in the DLQs", f"{left}"),
        ],
    )
    if arguments.keep:
        print(f"\nkept {database_url}")
    if not (rows == cells == total == arrivals == hourly == inserted == 2 * n and bare_rows == n and left == 0):
        sys.exit("ingest benchmark: the stored rows or counters do not add up to n")


def line(per_second: float, seconds: float, cpu_seconds: float, n: int) -> str:
    """Rate, wall time, and CPU time of the consumer processes (start-up included) per message."""
    return f"{per_second:,.0f} msg/s ({seconds:.1f} s; CPU {cpu_seconds:.1f} s, {cpu_seconds / n * 1e6:.0f} us/msg)"


if __name__ == "__main__":
    main()
