"""The demo's faulty shop: it publishes realistic traffic and fails on part of it through the real broker.

Queues (names start with a prefix, `demo.` by default), each with `<queue>.dlx` and `<queue>.dlq` declared by
dlqconsole.ingest.topology and therefore watched by consume_dlq:

- `orders` (a Python service) and `payments` (a Java one) are consumed. A message that fails is handled the way
  many consumer frameworks do: the error is written into its headers (x-exception-type, x-exception-message,
  x-exception-stacktrace, x-host, x-app-version) and it goes back to its exchange for one more attempt; when
  that attempt fails too, the consumer rejects it without requeue, and RabbitMQ dead-letters it (reason
  `rejected`) with x-death naming the queue, the `shop` exchange and the routing key. Nothing is published into
  a DLQ directly.
- `emails` has a 3 s message TTL and no consumer (the mailer is down); some mails also carry a shorter
  per-message expiration. They die with reason `expired`.
- `inventory` holds at most 2 messages (drop-head) and no consumer (the sync is stalled); stock adjustments
  come in batches of 3, so the oldest overflow with reason `maxlen`.
- `notifications` is a quorum queue with a delivery limit of 3; the push sender crashes on some messages
  (nack with requeue), and after the fourth delivery the broker dead-letters them with reason `delivery_limit`.
- `tasks` is a Celery queue worked by the demo Celery app (see celery_app), in a worker subprocess; tasks that
  fail are rejected (late acks) and dead-lettered.
"""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pika
from django.conf import settings
from pika.adapters.blocking_connection import BlockingChannel
from pika.spec import Basic, BasicProperties

from dlqconsole.core.amqp import connect
from dlqconsole.ingest.demo import celery_app
from dlqconsole.ingest.demo.faults import ROUND, Failure, Scenario, make_scenario, service_headers
from dlqconsole.ingest.topology import QueueTopology, declare_queue_topology

# A failed message is tried this many times in all before it is rejected to the DLQ.
ATTEMPTS = 2
ATTEMPT_HEADER = "x-retry-count"
# Stock adjustments come in batches larger than the inventory queue's max length, so each batch overflows.
OVERFLOW_BATCH = 3
REPORT_SECONDS = 30.0
# Plans of messages in flight, by message id; bounded so that a long run does not grow without end.
MAX_PLANS = 50_000


@dataclass(frozen=True)
class DemoQueue:
    base: str
    binding: str
    consumed: bool = True
    quorum: bool = False
    delivery_limit: int | None = None
    message_ttl: int | None = None
    max_length: int | None = None


DEMO_QUEUES = (
    DemoQueue("orders", "orders.#"),
    DemoQueue("payments", "payments.#"),
    DemoQueue("emails", "emails.#", consumed=False, message_ttl=3000),
    DemoQueue("inventory", "inventory.#", consumed=False, max_length=2),
    DemoQueue("notifications", "notifications.#", quorum=True, delivery_limit=3),
)
CELERY_QUEUE = "tasks"


class CeleryWorker:
    """The demo Celery worker as a subprocess in its own session, so Ctrl-C reaches the demo, which stops it."""

    def __init__(self, *, queue: str, log_file: Path) -> None:
        self.queue = queue
        self.node = f"demo-{os.getpid()}-{uuid.uuid4().hex[:6]}@localhost"
        self.log_file = log_file
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        command = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "dlqconsole.ingest.demo.celery_app",
            "worker",
            "--queues",
            self.queue,
            "--pool",
            "solo",
            "--hostname",
            self.node,
            "--without-gossip",
            "--without-mingle",
            "--loglevel",
            "WARNING",
        ]
        environment = {**os.environ, "DLQ_DEMO_CELERY_QUEUE": self.queue}
        # The worker logs a traceback for every task that fails, which is the point of the demo: keep them in a
        # file rather than in the demo's output.
        with open(self.log_file, "ab") as log:
            self.process = subprocess.Popen(
                command,
                cwd=settings.BASE_DIR,
                env=environment,
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def idle(self) -> bool:
        """True when the worker answers and holds no task (running, prefetched or waiting for a retry ETA)."""
        if self.process is None or self.process.poll() is not None:
            return True
        inspector = celery_app.app.control.inspect(destination=[self.node], timeout=1.0)
        for ask in (inspector.active, inspector.reserved, inspector.scheduled):
            replies = ask()
            if not replies or any(replies.values()):
                return False
        return True

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        # Warm shutdown: the running task finishes, prefetched ones go back to the queue.
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


class FaultyShop:
    """Publishes the demo traffic and consumes the work queues, failing where the plan says so.

    Drive it with `setup()`, then `emit(n)` and `pump(seconds)` (or `run()`), and always `close()`.
    """

    def __init__(
        self,
        *,
        prefix: str = "demo.",
        seed: int | None = None,
        celery: bool = True,
        log: Callable[[str], None] = lambda line: None,
    ) -> None:
        self.prefix = prefix
        self.rng = random.Random(seed)
        self.celery = celery
        self.log = log
        self.exchange = prefix + "shop"
        self.plans: collections.OrderedDict[str, Scenario] = collections.OrderedDict()
        self.deck: list[str] = []
        self.emitted: collections.Counter[str] = collections.Counter()
        self.outcomes: collections.Counter[str] = collections.Counter()
        self.topologies: list[QueueTopology] = []
        self.connection: pika.BlockingConnection | None = None
        self.consumer: BlockingChannel | None = None
        self.publisher: BlockingChannel | None = None
        self.worker: CeleryWorker | None = None
        self.stopping = False

    def name(self, base: str) -> str:
        return self.prefix + base

    def queue_names(self) -> list[str]:
        names = [self.name(queue.base) for queue in DEMO_QUEUES]
        return [*names, self.name(CELERY_QUEUE)] if self.celery else names

    # Set-up and tear-down.

    def setup(self) -> None:
        self.connection = connect(settings.AMQP_URL)
        for queue in DEMO_QUEUES:
            self.topologies.append(
                declare_queue_topology(
                    name=self.name(queue.base),
                    quorum=queue.quorum,
                    delivery_limit=queue.delivery_limit,
                    message_ttl=queue.message_ttl,
                    max_length=queue.max_length,
                    connection=self.connection,
                )
            )
        self.publisher = self.connection.channel()
        self.publisher.confirm_delivery()
        self.publisher.exchange_declare(exchange=self.exchange, exchange_type="topic", durable=True)
        for queue in DEMO_QUEUES:
            self.publisher.queue_bind(queue=self.name(queue.base), exchange=self.exchange, routing_key=queue.binding)
        self.consumer = self.connection.channel()
        self.consumer.basic_qos(prefetch_count=20)
        for queue in DEMO_QUEUES:
            if queue.consumed:
                self.consumer.basic_consume(queue=self.name(queue.base), on_message_callback=self._on_message)
        if self.celery:
            self.topologies.append(declare_queue_topology(name=self.name(CELERY_QUEUE), connection=self.connection))
            celery_app.use_queue(self.name(CELERY_QUEUE))
            self.worker = CeleryWorker(queue=self.name(CELERY_QUEUE), log_file=settings.VAR_DIR / "demo-worker.log")
            self.worker.start()

    def close(self) -> None:
        if self.worker is not None:
            self.worker.stop()
        if self.connection is not None and self.connection.is_open:
            self.connection.close()
        if self.celery:
            celery_app.app.close()

    # Driving.

    def run(self, *, rate: float) -> None:
        """Emit `rate` messages per second until stop() (a signal handler calls it)."""
        interval = 1.0 / rate
        next_at = report_at = time.monotonic()
        while not self.stopping:
            now = time.monotonic()
            if now >= next_at:
                self.emit(1)
                next_at = max(next_at + interval, now - 1.0)
            if now >= report_at:
                self.log(self.summary())
                report_at = now + REPORT_SECONDS
            self.pump(min(0.2, max(0.0, next_at - time.monotonic())))

    def stop(self) -> None:
        self.stopping = True

    def summary(self) -> str:
        outcomes = ", ".join(f"{name} {n}" for name, n in sorted(self.outcomes.items())) or "none yet"
        return f"{sum(self.emitted.values()):,} sent (messages and Celery tasks); consumer outcomes: {outcomes}"

    def emit(self, count: int) -> None:
        for _ in range(count):
            if not self.deck:
                self.deck = list(ROUND)
                self.rng.shuffle(self.deck)
            kind = self.deck.pop()
            if kind.startswith("celery") and not self.celery:
                continue
            for _ in range(OVERFLOW_BATCH if kind == "overflow" else 1):
                self._send(make_scenario(kind, self.rng))
                self.emitted[kind] += 1

    def pump(self, seconds: float) -> None:
        """Deliver to our consumers for up to `seconds`."""
        assert self.connection is not None
        self.connection.process_data_events(time_limit=seconds)

    def settle(self, *, timeout: float) -> bool:
        """Work until every queue the shop (or its Celery worker) consumes, and the e-mail queue whose messages
        expire, is empty and nothing is in flight; False if that takes longer than `timeout` seconds."""
        deadline = time.monotonic() + timeout
        quiet = 0
        while time.monotonic() < deadline and not self.stopping:
            self.pump(0.3)
            quiet = quiet + 1 if self._quiet() else 0
            if quiet >= 2:
                return True
        return False

    # Publishing.

    def _send(self, scenario: Scenario) -> None:
        if scenario.task_name:
            celery_app.send(scenario.task_name, queue=self.name(CELERY_QUEUE), kwargs=scenario.task_kwargs)
            return
        message_id = str(uuid.uuid4())
        if scenario.failure is not None or scenario.kind == "delivery_limit":
            self.plans[message_id] = scenario
            while len(self.plans) > MAX_PLANS:
                self.plans.popitem(last=False)
        properties = BasicProperties(
            content_type="application/json",
            content_encoding="utf-8",
            delivery_mode=2,
            priority=self.rng.choice([0, 0, 0, 0, 0, 1, 5, 9]),
            message_id=message_id,
            correlation_id=str(uuid.uuid4()),
            timestamp=int(time.time()),
            app_id="shop-api",
            type=scenario.routing_key,
            expiration=scenario.expiration,
            headers={"x-request-id": uuid.uuid4().hex, "tenant": self.rng.choice(["acme-eu", "acme-us", "globex"])},
        )
        self._publish(scenario.routing_key, json.dumps(scenario.body).encode(), properties)

    def _publish(self, routing_key: str, body: bytes, properties: BasicProperties) -> None:
        assert self.publisher is not None
        self.publisher.basic_publish(exchange=self.exchange, routing_key=routing_key, body=body, properties=properties)

    # Consuming.

    def _on_message(
        self, channel: BlockingChannel, method: Basic.Deliver, properties: BasicProperties, body: bytes
    ) -> None:
        scenario = self.plans.get(properties.message_id or "")
        if scenario is None:
            channel.basic_ack(method.delivery_tag)
            self.outcomes["processed"] += 1
            return
        if scenario.kind == "delivery_limit":
            # The push sender "crashes" before acking: the quorum queue counts the return, and after the
            # delivery limit RabbitMQ dead-letters the message.
            channel.basic_nack(method.delivery_tag, requeue=True)
            self.outcomes["crashed"] += 1
            deliveries = (properties.headers or {}).get("x-delivery-count", 0)
            if isinstance(deliveries, int) and deliveries >= (scenario_limit(scenario) or 0):
                self.plans.pop(properties.message_id or "", None)
            return
        headers = dict(properties.headers or {})
        attempt = headers.get(ATTEMPT_HEADER, 0)
        attempt = attempt if isinstance(attempt, int) else 0
        if attempt + 1 >= ATTEMPTS:
            channel.basic_reject(method.delivery_tag, requeue=False)
            self.plans.pop(properties.message_id or "", None)
            self.outcomes["rejected"] += 1
            return
        assert scenario.failure is not None
        headers.update(self._error_headers(scenario.failure, method.routing_key or "", attempt + 1))
        properties.headers = headers
        self._publish(method.routing_key or "", body, properties)
        channel.basic_ack(method.delivery_tag)
        self.outcomes["retried"] += 1

    def _error_headers(self, failure: Failure, routing_key: str, attempt: int) -> dict[str, Any]:
        service = routing_key.partition(".")[0]
        return {
            "x-exception-type": failure.error_type,
            "x-exception-message": failure.message,
            "x-exception-stacktrace": failure.stack_trace,
            **service_headers(service if service in {"orders", "payments"} else "orders", self.rng),
            ATTEMPT_HEADER: attempt,
        }

    def _quiet(self) -> bool:
        assert self.connection is not None
        channel = self.connection.channel()
        try:
            # The inventory queue stays full by design; every other queue empties once all is handled.
            watched = [self.name(queue.base) for queue in DEMO_QUEUES if queue.max_length is None]
            if self.celery:
                watched.append(self.name(CELERY_QUEUE))
            for queue_name in watched:
                if channel.queue_declare(queue=queue_name, passive=True).method.message_count:
                    return False
        finally:
            channel.close()
        return self.worker is None or self.worker.idle()


def scenario_limit(scenario: Scenario) -> int | None:
    """The delivery limit of the queue a scenario's message goes to."""
    return next((queue.delivery_limit for queue in DEMO_QUEUES if queue.base == scenario.queue), None)
