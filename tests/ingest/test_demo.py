from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator

import psutil
import pytest
from django.core.management import call_command
from django.test import override_settings
from pika.adapters.blocking_connection import BlockingChannel

from dlqconsole.core import jsonsafe
from dlqconsole.deadletters.models import DeadLetter
from dlqconsole.ingest.demo.service import CELERY_QUEUE, DEMO_QUEUES
from dlqconsole.ingest.models import WatchedQueue

# The demo and consume_dlq run in this process and commit as they go.
pytestmark = pytest.mark.django_db(transaction=True)

BASES = [queue.base for queue in DEMO_QUEUES] + [CELERY_QUEUE]


@pytest.fixture
def demo_prefix(amqp_channel: BlockingChannel) -> Iterator[str]:
    prefix = f"t{uuid.uuid4().hex[:10]}.demo."
    yield prefix
    for base in BASES:
        amqp_channel.queue_delete(queue=prefix + base)
        amqp_channel.queue_delete(queue=prefix + base + ".dlq")
        amqp_channel.exchange_delete(exchange=prefix + base + ".dlx")
    amqp_channel.exchange_delete(exchange=prefix + "shop")
    amqp_channel.exchange_delete(exchange=prefix + CELERY_QUEUE)


@override_settings(DLQ_QUEUES=[])
def test_demo_burst_dead_letters_every_kind_of_failure_through_the_broker(
    demo_prefix: str, amqp_channel: BlockingChannel
) -> None:
    call_command("demo", "--burst", "200", "--prefix", demo_prefix, "--seed", "7", "--settle-timeout", "90")

    # Without --queues the console's consumer drains the DLQ of every watched queue: the demo's included.
    call_command("consume_dlq", exit_when_idle=1.0)
    letters = list(DeadLetter.objects.all())

    assert {letter.death_reason for letter in letters} == {"rejected", "expired", "maxlen", "delivery_limit"}
    assert {letter.failure_reason for letter in letters} >= {
        "TIMEOUT",
        "NETWORK_ERROR",
        "VALIDATION_FAILED",
        "RATE_LIMITED",
        "NOT_FOUND",
        "AUTH",
        "CONFLICT",
        "INTERNAL",
        "EXPIRED",
        "MAXLEN",
        "DELIVERY_LIMIT",
        "REJECTED",
    }
    # Every demo queue's DLQ received dead letters, and consume_dlq will find each through WatchedQueue.
    assert {letter.source_queue for letter in letters} == {f"{demo_prefix}{base}.dlq" for base in BASES}
    assert set(WatchedQueue.objects.values_list("dead_letter_queue", flat=True)) >= {
        f"{demo_prefix}{base}.dlq" for base in BASES
    }
    # Application failures: rejected by the consumer after the error was written into the headers.
    failed = [
        letter
        for letter in letters
        if letter.source_queue in {f"{demo_prefix}orders.dlq", f"{demo_prefix}payments.dlq"}
    ]
    assert len(failed) > 40
    for letter in failed:
        assert letter.death_reason == "rejected"
        assert letter.original_exchange == f"{demo_prefix}shop"
        assert letter.original_routing_keys[0].split(".")[0] in {"orders", "payments"}
        assert letter.error_type and letter.error_message and letter.stack_trace
        assert letter.host and letter.app_version
        assert letter.message_id and letter.correlation_id and letter.priority is not None
        assert isinstance(json.loads(bytes(letter.body)), dict)
    assert any(letter.stack_trace.startswith("Traceback (most recent call last):") for letter in failed)
    assert any("\tat com.acme.payments" in letter.stack_trace for letter in failed)
    # Failures vary (durations, hosts, fields, ids) yet group into a readable number of patterns.
    messages = {letter.error_message for letter in failed}
    patterns = {letter.pattern_id for letter in failed}
    assert len(messages) > 30
    assert 8 <= len(patterns) < len(messages)
    # Both kinds of expiry, and Celery tasks with their names and ids.
    expired = [letter for letter in letters if letter.death_reason == "expired"]
    assert any("original-expiration" in jsonsafe.decode(letter.x_death)[0] for letter in expired)
    assert any("original-expiration" not in jsonsafe.decode(letter.x_death)[0] for letter in expired)
    tasks = [letter for letter in letters if letter.source_queue == f"{demo_prefix}tasks.dlq"]
    assert tasks and all(letter.task_name.startswith("shop.") and letter.task_id for letter in tasks)
    assert {letter.original_queue for letter in letters if letter.death_reason == "delivery_limit"} == {
        f"{demo_prefix}notifications"
    }
    # Everything the service consumes was handled; only the stalled inventory queue stays (full).
    for base in BASES:
        depth = amqp_channel.queue_declare(queue=demo_prefix + base, passive=True).method.message_count
        assert depth == (2 if base == "inventory" else 0), base


def test_demo_stops_cleanly_on_sigterm_with_its_celery_worker(demo_prefix: str) -> None:
    me = psutil.Process()
    before = {child.pid for child in me.children(recursive=True)}
    started: set[int] = set()
    finished = threading.Event()

    def terminate_once_running() -> None:
        for _ in range(300):
            started.update(child.pid for child in me.children(recursive=True))
            if started - before:
                break
            time.sleep(0.05)
        # Let it emit and fail for a while, then stop it as a process manager would; the demo's handler turns
        # the signal into a clean stop. Never signal after the command returned (that would stop pytest).
        if not finished.wait(2.0):
            os.kill(os.getpid(), signal.SIGTERM)

    killer = threading.Thread(target=terminate_once_running)
    killer.start()
    try:
        call_command("demo", "--rate", "20", "--prefix", demo_prefix)
    finally:
        finished.set()
        killer.join()

    workers = started - before
    assert workers, "the demo started its Celery worker"
    assert not any(psutil.pid_exists(pid) for pid in workers)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_the_demo_shops_tasks_live_on_the_watched_vhost_not_the_consoles_own() -> None:
    """The demo shop is one of the users' services: with the console's Celery on a vhost of its own (make run), the
    demo's tasks still die where consume_dlq looks."""
    import subprocess
    import sys

    from django.conf import settings

    env = {
        **os.environ,
        "AMQP_URL": "amqp://guest:guest@127.0.0.1:5672/%2F",
        "CELERY_BROKER_URL": "amqp://guest:guest@127.0.0.1:5672/dlqconsole",
    }
    shown = subprocess.run(
        [
            sys.executable,
            "-c",
            "from dlqconsole.ingest.demo.celery_app import app; "
            "print(app.connection_for_write().virtual_host, app.connection_for_read().virtual_host)",
        ],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )

    assert shown.stdout.split() == ["/", "/"]
