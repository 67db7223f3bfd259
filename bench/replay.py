"""Replay throughput: the console's retry against a bare pika mover and a RabbitMQ shovel, in the same run.

    .venv/bin/python bench/replay.py [--count 100000] [--no-rate-check]

1. dlqconsole: `count` dead letters in PostgreSQL (ingested first, not timed), replayed by a retry operation
   without a rate limit, run in this process by the code a Celery worker runs (batches, in-flight marking,
   windowed confirms, outcome rows, counters, the database lanes). Timed from the start of the run to its end.
2. bare pika mover: the same messages in a queue; consume, publish to another queue with publisher confirms
   (mandatory, a window of unconfirmed messages), ack the source after the confirm. Nothing else.
3. shovel: the same messages moved by a dynamic RabbitMQ shovel (ack-mode on-confirm), timed from its first
   moved message until the destination holds them all.
Then (unless --no-rate-check) a 200/1s retry of 2,000 dead letters, which should take 10 s.

Targets: the console at least 80% of the bare mover and at least 3,300 messages/s.
It uses its own database (bench_replay, created afresh and dropped) and queues (bench.replay.*, deleted after).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.common import database_url, drop_database, fresh_database, queue_depth, report  # noqa: E402

DATABASE = "bench_replay"
os.environ["DATABASE_URL"] = database_url(DATABASE)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dlqconsole.settings")
os.environ.setdefault("LOG_LEVEL", "WARNING")

import django  # noqa: E402
import pika  # noqa: E402

PREFIX = "bench.replay"
WINDOW = 1000


def message(n: int, queue: str) -> tuple[bytes, dict[str, Any]]:
    """A realistic dead letter: a JSON order of ~300 bytes, application error headers and an x-death history."""
    body = json.dumps(
        {"order_id": n, "customer": f"c-{n % 977}", "items": [{"sku": f"SKU-{n % 91}", "qty": 1 + n % 3}] * 3}
    ).encode()
    headers = {
        "x-death": [
            {
                "count": 1,
                "reason": "rejected",
                "queue": queue,
                "time": dt.datetime(2026, 11, 20, 10, 0, tzinfo=dt.UTC),
                "exchange": "",
                "routing-keys": [queue],
            }
        ],
        "x-first-death-queue": queue,
        "x-first-death-reason": "rejected",
        "x-first-death-exchange": "",
        "x-exception-type": "TimeoutError",
        "x-exception-message": f"Request to payments timed out after {3000 + n % 7}ms",
        "tenant": "acme",
    }
    return body, headers


def properties(n: int, headers: dict[str, Any]) -> pika.BasicProperties:
    return pika.BasicProperties(
        message_id=f"order-{n}", content_type="application/json", delivery_mode=2, headers=headers
    )


def amqp() -> pika.BlockingConnection:
    from dlqconsole.core.amqp import connect

    return connect()


def declare(*queues: str) -> None:
    connection = amqp()
    channel = connection.channel()
    for queue in queues:
        channel.queue_delete(queue=queue)
        channel.queue_declare(queue=queue, durable=True)
    connection.close()


def delete(*queues: str) -> None:
    connection = amqp()
    channel = connection.channel()
    for queue in queues:
        channel.queue_delete(queue=queue)
    connection.close()


def fill(queue: str, count: int, *, original: str) -> None:
    """Publish the benchmark's messages into `queue` (as they would sit in a DLQ) and wait until they are in."""
    connection = amqp()
    channel = connection.channel()
    for n in range(count):
        body, headers = message(n, original)
        channel.basic_publish(exchange="", routing_key=queue, body=body, properties=properties(n, headers))
    connection.close()
    deadline = time.monotonic() + 120
    while queue_depth(queue) < count and time.monotonic() < deadline:
        time.sleep(0.1)


def ingest(count: int, *, original: str) -> float:
    from django.utils import timezone

    from dlqconsole.ingest.envelope import parse_envelope
    from dlqconsole.ingest.services import ingest_batch

    started = time.monotonic()
    for first in range(0, count, 5000):
        letters = []
        for n in range(first, min(count, first + 5000)):
            body, headers = message(n, original)
            letters.append(
                parse_envelope(
                    source_queue=original + ".dlq", body=body, properties=properties(n, headers), now=timezone.now()
                )
            )
        ingest_batch(letters=letters)
    return time.monotonic() - started


def run_console(count: int, *, destination: str, rate: str = "") -> tuple[float, Any]:
    from django.utils import timezone

    from dlqconsole.operations.models import Operation
    from dlqconsole.operations.planning import plan_operation
    from dlqconsole.operations.services import run_operation

    operation = plan_operation(kind="retry", filter={"queue": [destination + ".dlq"]}, actor=None, rate=rate)
    assert operation.total == count, (operation.total, count)
    # start_operation would hand the run to a Celery worker; here the worker's code runs in this process.
    Operation.objects.filter(pk=operation.pk).update(status="running", started_at=timezone.now(), heartbeat_at=None)
    started = time.monotonic()
    run_operation(operation_id=operation.pk)
    elapsed = time.monotonic() - started
    operation.refresh_from_db()
    assert (operation.status, operation.succeeded) == ("done", count), (operation.status, operation.succeeded)
    return elapsed, operation


class BareMover:
    """Consume from `source`, publish each message to `destination` with confirms, ack the source once confirmed."""

    def __init__(self, *, source: str, destination: str, expected: int, window: int = WINDOW) -> None:
        from dlqconsole.core.amqp import connection_parameters

        self.parameters = connection_parameters()
        self.source, self.destination, self.expected, self.window = source, destination, expected, window
        self.pending: dict[int, int] = {}
        self.next_tag = 0
        self.moved = 0
        self.started = 0.0
        self.finished = 0.0
        self.consume_channel: Any = None
        self.publish_channel: Any = None

    def run(self) -> float:
        self.connection = pika.SelectConnection(self.parameters, on_open_callback=self.on_open)
        self.connection.ioloop.start()
        return self.finished - self.started

    def on_open(self, connection: pika.SelectConnection) -> None:
        connection.channel(on_open_callback=self.on_publish_channel)

    def on_publish_channel(self, channel: Any) -> None:
        self.publish_channel = channel
        channel.confirm_delivery(ack_nack_callback=self.on_confirm, callback=lambda _: self.open_consumer())

    def open_consumer(self) -> None:
        self.connection.channel(on_open_callback=self.on_consume_channel)

    def on_consume_channel(self, channel: Any) -> None:
        self.consume_channel = channel
        channel.basic_qos(prefetch_count=self.window, callback=lambda _: self.start())

    def start(self) -> None:
        self.started = time.monotonic()
        self.consume_channel.basic_consume(queue=self.source, on_message_callback=self.on_message)

    def on_message(self, channel: Any, method: Any, properties: Any, body: bytes) -> None:
        self.publish_channel.basic_publish(
            exchange="", routing_key=self.destination, body=body, properties=properties, mandatory=True
        )
        self.next_tag += 1
        self.pending[self.next_tag] = method.delivery_tag

    def on_confirm(self, frame: Any) -> None:
        method = frame.method
        tags = [tag for tag in self.pending if tag <= method.delivery_tag] if method.multiple else [method.delivery_tag]
        source_tag = max(self.pending.pop(tag) for tag in tags)
        self.consume_channel.basic_ack(delivery_tag=source_tag, multiple=True)
        self.moved += len(tags)
        if self.moved >= self.expected:
            self.finished = time.monotonic()
            self.connection.close()
            self.connection.ioloop.stop()


def run_shovel(*, source: str, destination: str, expected: int) -> float:
    name = f"{PREFIX}.shovel-{uuid.uuid4().hex[:8]}"
    definition = {
        "src-protocol": "amqp091",
        "src-uri": "amqp://",
        "src-queue": source,
        "dest-protocol": "amqp091",
        "dest-uri": "amqp://",
        "dest-queue": destination,
        "ack-mode": "on-confirm",
        "src-delete-after": "never",
    }
    subprocess.run(["rabbitmqctl", "-q", "set_parameter", "shovel", name, json.dumps(definition)], check=True)
    try:
        first_at, first_depth, current = 0.0, 0, 0
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            current = queue_depth(destination)
            now = time.monotonic()
            if current and not first_at:
                first_at, first_depth = now, current
            if current >= expected:
                # From the first moved message seen: the shovel starts while rabbitmqctl is still returning.
                return (now - first_at) * expected / max(1, expected - first_depth)
            time.sleep(0.02)
        raise RuntimeError(f"the shovel moved {current} of {expected}")
    finally:
        subprocess.run(["rabbitmqctl", "-q", "clear_parameter", "shovel", name], check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description="Replay throughput against a bare pika mover and a shovel.")
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--no-rate-check", action="store_true")
    options = parser.parse_args()
    count = options.count

    fresh_database(DATABASE)
    django.setup()
    from django.core.management import call_command

    from dlqconsole.brokers.registry import forget as forget_brokers

    original = f"{PREFIX}.orders"
    bare_source, bare_destination = f"{PREFIX}.bare-src", f"{PREFIX}.bare-dst"
    shovel_source, shovel_destination = f"{PREFIX}.shovel-src", f"{PREFIX}.shovel-dst"
    queues = [original, bare_source, bare_destination, shovel_source, shovel_destination]
    declare(*queues)
    try:
        load_before = os.getloadavg()[0]
        ingest_seconds = ingest(count, original=original)
        fill(bare_source, count, original=original)
        fill(shovel_source, count, original=original)

        console_seconds, _ = run_console(count, destination=original)
        assert queue_depth(original) == count
        bare_seconds = BareMover(source=bare_source, destination=bare_destination, expected=count).run()
        shovel_seconds = run_shovel(source=shovel_source, destination=shovel_destination, expected=count)

        console_rate, bare_rate, shovel_rate = count / console_seconds, count / bare_seconds, count / shovel_seconds
        share = console_rate / bare_rate
        verdict = "meets" if share >= 0.8 and console_rate >= 3300 else "misses"
        report(
            f"replay of {count:,} messages, no rate limit ({os.cpu_count()} cores)",
            [
                ("ingest into PostgreSQL (setup)", f"{ingest_seconds:7.2f} s  {count / ingest_seconds:8,.0f} msg/s"),
                ("dlqconsole retry", f"{console_seconds:7.2f} s  {console_rate:8,.0f} msg/s"),
                ("bare pika mover", f"{bare_seconds:7.2f} s  {bare_rate:8,.0f} msg/s"),
                ("RabbitMQ shovel", f"{shovel_seconds:7.2f} s  {shovel_rate:8,.0f} msg/s"),
                ("dlqconsole / bare mover", f"{share:7.0%}    ({verdict} the target: >= 80% and >= 3,300 msg/s)"),
                # Other work on the machine skews the comparison (the three run one after the other).
                ("load average before / after", f"{load_before:.2f} / {os.getloadavg()[0]:.2f}"),
            ],
        )

        if not options.no_rate_check:
            delete(original)
            declare(original)
            call_command("flush", interactive=False, verbosity=0)
            # flush empties brokers_broker too: the broker `default` is made again, under a new id, when next asked.
            forget_brokers()
            ingest(2000, original=original)
            seconds, operation = run_console(2000, destination=original, rate="200/1s")
            moments = sorted(operation.items.values_list("published_at", flat=True))
            spread = (moments[-1] - moments[0]).total_seconds()
            report(
                "rate limit: 2,000 dead letters at 200/1s (expected 10 s)",
                [
                    ("run", f"{seconds:.2f} s ({seconds / 10 - 1:+.1%})"),
                    ("first to last publish", f"{spread:.2f} s ({spread / 9.995 - 1:+.1%})"),
                    ("target", f"10 s within 5% -> {'OK' if abs(seconds / 10 - 1) <= 0.05 else 'MISSED'}"),
                ],
            )
    finally:
        delete(*queues)
        from django.db import connections

        connections.close_all()
        drop_database(DATABASE)


if __name__ == "__main__":
    main()
