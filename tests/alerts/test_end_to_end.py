"""End to end with the real pieces: consume_dlq, a Celery worker with its embedded beat, RabbitMQ, PostgreSQL and a
local webhook receiver. With the default rules and intervals, the webhook hears about the first dead letter in an
empty DLQ within 10 s, and hears the recovery once an archive operation has dealt with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection
from pika.adapters.blocking_connection import BlockingChannel

from dlqconsole.alerts.changes import save_channel
from dlqconsole.alerts.defaults import install_default_rules
from dlqconsole.alerts.models import AlertRule, Channel, EvaluationState, Notification
from dlqconsole.deadletters.models import DeadLetter, DeadLetterStatus
from dlqconsole.ingest.topology import declare_queue_topology
from dlqconsole.operations.planning import plan_operation
from dlqconsole.operations.services import start_operation
from tests.alerts.conftest import Receiver
from tests.factories import UserFactory
from tests.support import subprocess_database_url

pytestmark = [pytest.mark.django_db(transaction=True)]

MANAGE = str(Path(settings.BASE_DIR) / "manage.py")


def wait_until(condition: Callable[[], bool], *, timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}; the processes said:\n{log.read_text()[-3000:]}")


@pytest.fixture
def celery_queue(amqp_channel: BlockingChannel) -> str:
    """The Celery queue this process enqueues to (tasks started here must reach the worker started here),
    emptied of whatever earlier tests left in it."""
    name = settings.CELERY_TASK_DEFAULT_QUEUE
    for queue in (name, settings.DLQ_CONTROL_QUEUE):
        amqp_channel.queue_declare(queue=queue, durable=True)
        amqp_channel.queue_purge(queue=queue)
    return name


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Started subprocesses, stopped afterwards: consume_dlq cleanly (SIGTERM), the Celery worker with a cold
    shutdown (SIGQUIT: it stops its pool children without waiting for a send to time out)."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.send_signal(signal.SIGQUIT if "celery" in process.args else signal.SIGTERM)  # type: ignore[operator]
    for process in started:
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


@pytest.mark.slow
@pytest.mark.skipif(connection.vendor != "postgresql", reason="subprocesses need a shared PostgreSQL test database")
def test_webhook_hears_the_first_dead_letter_within_10_seconds_and_then_the_recovery(
    receiver: Receiver,
    request: pytest.FixtureRequest,
    queue_name: Callable[[str], str],
    amqp_channel: BlockingChannel,
    celery_queue: str,
    processes: list[subprocess.Popen[bytes]],
    tmp_path: Path,
) -> None:
    # Default settings: the rules the data migration installs (a transactional test starts from a flushed
    # database, so they are installed again) and a webhook channel attached to all of them.
    install_default_rules(AlertRule)
    save_channel(
        channel=Channel(name="on-call webhook", kind="webhook", target=receiver.url),
        actor=None,
        attach_to_all_rules=True,
    )
    # A second channel that hangs (each send gives up after the HTTP timeout): it must not hold the first one up.
    hanging = Receiver(delay=30.0).start()
    request.addfinalizer(hanging.stop)
    save_channel(
        channel=Channel(name="a hanging webhook", kind="webhook", target=hanging.url),
        actor=None,
        attach_to_all_rules=True,
    )
    work_queue = queue_name("orders")
    declare_queue_topology(name=work_queue)
    dead_letter_queue = f"{work_queue}.dlq"
    operator = UserFactory.create(username="e2e-operator", role="operator")

    env = {
        **os.environ,
        "DATABASE_URL": subprocess_database_url(),
        "CELERY_TASK_DEFAULT_QUEUE": celery_queue,
        "DLQ_VAR_DIR": str(tmp_path),
        "PYTHONUNBUFFERED": "1",
    }
    for name in ("DLQ_ALERT_EVALUATION_SECONDS", "DLQ_QUEUE_SAMPLE_SECONDS", "DLQ_QUEUES"):
        env.pop(name, None)
    log_path = tmp_path / "processes.log"
    # The children keep their own copy of the log file; ours closes once they are started.
    with log_path.open("wb") as log:
        processes.append(
            subprocess.Popen(
                [sys.executable, MANAGE, "consume_dlq", "--queues", dead_letter_queue], env=env, stdout=log, stderr=log
            )
        )

        def worker(name: str, queue: str, *options: str) -> subprocess.Popen[bytes]:
            command = [sys.executable, "-m", "celery", "-A", "dlqconsole", "worker", "--loglevel", "WARNING"]
            command += ["--without-gossip", "--without-mingle", "--hostname", f"{name}-{uuid.uuid4().hex[:8]}@%h"]
            command += ["--queues", queue, *options]
            return subprocess.Popen(command, env=env, stdout=log, stderr=log, cwd=settings.BASE_DIR)

        # As deployed: the control tasks (with the beat) and the operations on workers of their own, so that long
        # operations never hold up an evaluation or a notification.
        schedule = str(tmp_path / "celerybeat-schedule")
        processes.append(
            worker("control", settings.DLQ_CONTROL_QUEUE, "--beat", "--concurrency", "2", "--schedule", schedule)
        )
        processes.append(worker("work", celery_queue, "--concurrency", "1"))
    # The beat is running and the worker evaluates: an evaluation tick has finished.
    wait_until(
        lambda: EvaluationState.objects.filter(ticks__gte=1).exists(),
        timeout=60,
        what="the first evaluation tick",
        log=log_path,
    )
    assert receiver.received == []

    amqp_channel.confirm_delivery()
    amqp_channel.basic_publish(exchange="", routing_key=work_queue, body=b'{"order": 1}')
    method, _properties, _body = amqp_channel.basic_get(work_queue)
    assert method is not None
    amqp_channel.basic_reject(method.delivery_tag, requeue=False)
    dead_at = time.monotonic()

    def about_the_dlq(event: str) -> Callable[..., bool]:
        return lambda item: (
            item.body.get("event") == event
            and item.body.get("rule") == "Dead letters waiting"
            and item.body.get("subject") == f"queue:{dead_letter_queue}"
        )

    firing = receiver.wait_for(about_the_dlq("firing"), timeout=15)
    assert firing is not None, log_path.read_text()[-3000:]
    latency = firing.at - dead_at
    assert latency < 10, f"the webhook was called {latency:.2f} s after the dead letter"
    assert firing.body["value"] == 1 and firing.body["severity"] == "warning"

    # Deal with it as an operator would: archive it through an operation, run by the operations worker.
    operation = plan_operation(kind="archive", filter={"queue": [dead_letter_queue]}, actor=operator)
    assert operation.total == 1
    start_operation(operation=operation, actor=operator)

    resolved = receiver.wait_for(about_the_dlq("resolved"), timeout=30)
    assert resolved is not None, log_path.read_text()[-3000:]
    assert DeadLetter.objects.get().status == DeadLetterStatus.ARCHIVED
    assert resolved.body["status"] == "resolved"
    # The hanging channel was tried too, and its failed sends are recorded for a retry.
    assert hanging.received
    assert Notification.objects.filter(channel__name="a hanging webhook", status="retrying").exists()
