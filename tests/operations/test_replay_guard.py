"""The trust boundary of replays: a dead letter is data, never a command to the console.

Anyone with publish rights on a vhost can put a message in a DLQ whose x-death names any exchange and routing key
and whose headers are a Celery task's. On a vhost shared with the console's own Celery (its default queue
`dlqconsole`, its control queue `dlqconsole.control`, Celery's remote control exchange `celery.pidbox`), with a live
console worker that has one more task (the sentinel, which leaves a file when it runs), such dead letters are listed
as not replayable in the plan and never published, whichever way the retry is asked for: the pages, the CLI, the
Django admin or a retry policy. A dead letter of a user's own Celery task in queue `celery` still replays.

Each test runs on a vhost of its own, made for it, so the console's queues have their real default names there.
"""

from __future__ import annotations

import datetime as dt
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pika
import pytest
import requests
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from kombu import Exchange, Queue

from dlqconsole.core import replay_guard
from dlqconsole.core.amqp import connect, connection_parameters
from dlqconsole.core.publish import UNSENDABLE, ConfirmedPublisher, Message
from dlqconsole.deadletters.models import DeadLetter
from dlqconsole.operations.message_retry import edit_and_retry
from dlqconsole.operations.models import ItemStatus, Operation, OperationItem, OperationKind, RetryPolicy
from dlqconsole.operations.planning import plan_operation
from dlqconsole.operations.policies import schedule_new_dead_letters, start_due_retries
from dlqconsole.operations.services import OperationError, run_operation
from tests.conftest import client_for
from tests.support import drain, ingest_from

pytestmark = pytest.mark.django_db

API = "http://127.0.0.1:15672/api"
AUTH = ("guest", "guest")
DLQ = "orders.dlq"
CONSOLE_QUEUE = "dlqconsole"
CONTROL_QUEUE = "dlqconsole.control"
USER_CELERY_QUEUE = "celery"


@dataclass
class SharedVhost:
    name: str
    url: str
    channel: Any
    sentinel_dir: Path

    def ran(self, marker: str) -> bool:
        return (self.sentinel_dir / f"{marker}.ran").exists()

    def wait_for_run(self, marker: str, timeout: float = 20.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ran(marker):
                return True
            time.sleep(0.05)
        return False


@pytest.fixture
def shared_vhost(settings: Any, tmp_path: Path, celery_worker: Any) -> Iterator[SharedVhost]:
    """A fresh vhost that is both AMQP_URL and CELERY_BROKER_URL, the console's queues at their default names, and a
    live console worker (with the sentinel task) consuming them."""
    name = f"t{uuid.uuid4().hex[:10]}"
    requests.put(f"{API}/vhosts/{name}", auth=AUTH, timeout=10).raise_for_status()
    requests.put(
        f"{API}/permissions/{name}/guest",
        json={"configure": ".*", "write": ".*", "read": ".*"},
        auth=AUTH,
        timeout=10,
    ).raise_for_status()
    url = f"amqp://guest:guest@127.0.0.1:5672/{name}"
    original = settings.AMQP_URL, settings.CELERY_TASK_DEFAULT_QUEUE
    settings.AMQP_URL = url
    settings.CELERY_BROKER_URL = url
    settings.RABBITMQ_API_URL = ""
    settings.CELERY_TASK_DEFAULT_QUEUE = CONSOLE_QUEUE
    settings.DLQ_CONTROL_QUEUE = CONTROL_QUEUE
    settings.CELERY_TASK_QUEUES = [
        Queue(queue, Exchange(queue, type="direct"), routing_key=queue) for queue in (CONSOLE_QUEUE, CONTROL_QUEUE)
    ]
    settings.CELERY_TASK_ROUTES = {task: {"queue": CONTROL_QUEUE} for task in settings.CONTROL_TASKS}
    sentinel_dir = tmp_path / "sentinel"
    sentinel_dir.mkdir()
    worker = celery_worker(
        app="tests.operations.sentinel_celery",
        queue=f"{CONSOLE_QUEUE},{CONTROL_QUEUE}",
        AMQP_URL=url,
        CELERY_BROKER_URL=url,
        CELERY_TASK_DEFAULT_QUEUE=CONSOLE_QUEUE,
        DLQ_CONTROL_QUEUE=CONTROL_QUEUE,
        SENTINEL_DIR=str(sentinel_dir),
    )
    worker.wait_until_ready()
    connection = connect(url)
    channel = connection.channel()
    channel.queue_declare(queue=DLQ, durable=True)
    channel.queue_declare(queue=USER_CELERY_QUEUE, durable=True)
    channel.exchange_declare(exchange=FORGERY_EXCHANGE, exchange_type="fanout")
    channel.queue_bind(queue=DLQ, exchange=FORGERY_EXCHANGE)
    world = SharedVhost(name=name, url=url, channel=channel, sentinel_dir=sentinel_dir)
    # The sentinel works: a task message published straight into the console's queue runs.
    publish_task(channel, exchange="", routing_key=CONSOLE_QUEUE, marker="direct")
    assert world.wait_for_run("direct"), worker.log.read_text()[-3000:]
    yield world
    if connection.is_open:
        connection.close()
    # The vhost goes; the fixtures torn down after this one purge this run's Celery queue on the usual vhost.
    settings.AMQP_URL, settings.CELERY_TASK_DEFAULT_QUEUE = original
    requests.delete(f"{API}/vhosts/{name}", auth=AUTH, timeout=10)


def task_message(marker: str, *, task: str = "sentinel.touch") -> tuple[pika.BasicProperties, bytes]:
    """A Celery protocol 2 task message, as any client of that vhost could write it."""
    task_id = str(uuid.uuid4())
    headers = {"lang": "py", "task": task, "id": task_id, "root_id": task_id, "retries": 0, "argsrepr": repr(marker)}
    body = json.dumps([[marker], {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]).encode()
    properties = pika.BasicProperties(
        content_type="application/json", content_encoding="utf-8", correlation_id=task_id, headers=headers
    )
    return properties, body


def publish_task(channel: Any, *, exchange: str, routing_key: str, marker: str) -> None:
    properties, body = task_message(marker)
    channel.basic_publish(exchange=exchange, routing_key=routing_key, body=body, properties=properties)


def forge(
    channel: Any, *, exchange: str, routing_key: str, queue: str, properties: Any, body: bytes, via: str = ""
) -> None:
    """Publish straight into the DLQ a message whose x-death says it died on its way to `exchange`/`routing_key`."""
    headers = dict(properties.headers or {})
    headers["x-death"] = [
        {
            "count": 1,
            "reason": "rejected",
            "queue": queue,
            "time": dt.datetime.now(dt.UTC).replace(microsecond=0),
            "exchange": exchange,
            "routing-keys": [routing_key],
        }
    ]
    properties.headers = headers
    channel.basic_publish(exchange=via, routing_key=DLQ, body=body, properties=properties)


# What the forged dead letters name, with the marker their sentinel task carries.
FORGED = {
    "to-default-queue": ("", CONSOLE_QUEUE, CONSOLE_QUEUE),
    "to-control-queue": ("", CONTROL_QUEUE, CONTROL_QUEUE),
    "to-console-exchange": (CONSOLE_QUEUE, CONSOLE_QUEUE, CONSOLE_QUEUE),
    "to-amq-default": ("amq.default", CONSOLE_QUEUE, CONSOLE_QUEUE),
}
# A forged dead letter of the user's queue whose CC header (sender-selected distribution) adds the console's queue.
# It is forged through a fanout exchange, which ignores routing keys: the forgery itself reaches only the DLQ.
# (RabbitMQ removes BCC from what it delivers, so only an edit can put one on a dead letter: see the edit test.)
CARBON_COPIES = {"cc": ("CC", CONSOLE_QUEUE)}
FORGERY_EXCHANGE = "forgery"


def forge_world(world: SharedVhost) -> tuple[list[int], int]:
    """Ingest the forged dead letters, a forged broadcast to celery.pidbox and a user's Celery task dead-lettered
    from queue `celery`; returns (ids of the forged ones, id of the user's)."""
    for marker, (exchange, routing_key, queue) in FORGED.items():
        properties, body = task_message(marker)
        forge(world.channel, exchange=exchange, routing_key=routing_key, queue=queue, properties=properties, body=body)
    # A remote control broadcast to every console worker of the vhost: were it delivered, the worker would stop.
    shutdown = json.dumps({"method": "shutdown", "arguments": {}, "destination": None, "pattern": None}).encode()
    forge(
        world.channel,
        exchange="celery.pidbox",
        routing_key="",
        queue="",
        properties=pika.BasicProperties(content_type="application/json", headers={"clock": 1, "expires": 0}),
        body=shutdown,
    )
    for marker, (header, queue) in CARBON_COPIES.items():
        properties, body = task_message(marker)
        properties.headers[header] = [queue]
        forge(
            world.channel,
            exchange="",
            routing_key=USER_CELERY_QUEUE,
            queue=USER_CELERY_QUEUE,
            properties=properties,
            body=body,
            via=FORGERY_EXCHANGE,
        )
    properties, body = task_message("users-own", task="shop.invoices.generate_invoice")
    forge(
        world.channel,
        exchange="",
        routing_key=USER_CELERY_QUEUE,
        queue=USER_CELERY_QUEUE,
        properties=properties,
        body=body,
    )
    letters = ingest_from(world.channel, DLQ)
    assert len(letters) == len(FORGED) + len(CARBON_COPIES) + 2
    (users,) = [letter for letter in letters if letter.task_name == "shop.invoices.generate_invoice"]
    return [letter.pk for letter in letters if letter != users], users.pk


def assert_planned_as_not_replayable(operation: Operation) -> None:
    operation.refresh_from_db()
    reasons = operation.unreplayable_reasons
    assert operation.unreplayable == len(FORGED) + 1 + len(CARBON_COPIES), reasons
    text = " ".join(reasons)
    assert f"queue '{CONSOLE_QUEUE}' is one of the console's own Celery queues" in text
    assert f"queue '{CONTROL_QUEUE}' is one of the console's own Celery queues" in text
    assert "'celery.pidbox' is Celery's remote control or event channel on the console's own vhost" in text
    assert f"its CC/BCC header routes it further: queue '{CONSOLE_QUEUE}' is one of the console's own" in text


def assert_nothing_reached_the_console(world: SharedVhost, forged: list[int], users: int) -> None:
    """The forged ones failed, refused, and their tasks never ran; the user's task is in its queue; the console's
    worker is alive and still runs what reaches it (so nothing ran because nothing arrived)."""
    items = {item.dead_letter_id: item for item in OperationItem.objects.filter(dead_letter_id__in=[*forged, users])}
    for pk in forged:
        assert items[pk].status == ItemStatus.FAILED, items[pk].error
        assert items[pk].error.startswith("refused: "), items[pk].error
        assert DeadLetter.objects.get(pk=pk).status == "failed"
    assert items[users].status == ItemStatus.PUBLISHED, items[users].error
    delivered = drain(world.channel, USER_CELERY_QUEUE)
    assert [properties.headers["task"] for properties, _ in delivered] == ["shop.invoices.generate_invoice"]
    publish_task(world.channel, exchange="", routing_key=CONSOLE_QUEUE, marker="after")
    assert world.wait_for_run("after"), "the console's worker stopped: a forged broadcast reached it"
    assert not [marker for marker in [*FORGED, *CARBON_COPIES] if world.ran(marker)]


def test_forged_destinations_are_refused_on_the_pages(shared_vhost: SharedVhost, operator: User) -> None:
    forged, users = forge_world(shared_vhost)
    client = client_for(operator)

    planned = client.post(reverse("operations:plan"), {"kind": "retry", "scope": "all", "queue": DLQ, "rate": ""})
    operation = Operation.objects.get()
    page = client.get(reverse("operations:detail", args=[operation.pk])).content.decode()
    started = client.post(reverse("operations:start", args=[operation.pk]))
    run_operation(operation_id=operation.pk)

    assert planned.status_code == 302
    assert_planned_as_not_replayable(operation)
    assert "is one of the console&#x27;s own Celery queues" in page
    assert started.status_code == 302
    assert_nothing_reached_the_console(shared_vhost, forged, users)


def test_forged_destinations_are_refused_by_the_cli(shared_vhost: SharedVhost, operator: User, capsys: Any) -> None:
    forged, users = forge_world(shared_vhost)

    call_command("dlq", "retry", "--queue", DLQ, "--yes", "--inline", "--user", operator.username)

    output = capsys.readouterr().out
    assert "is one of the console's own Celery queues" in output
    assert_planned_as_not_replayable(Operation.objects.get())
    assert_nothing_reached_the_console(shared_vhost, forged, users)


def test_forged_destinations_are_refused_by_the_admin_action(shared_vhost: SharedVhost, client: Client) -> None:
    forged, users = forge_world(shared_vhost)
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw-root"))
    selected = {"action": "retry_selected", "_selected_action": [str(pk) for pk in [*forged, users]]}
    changelist = reverse("admin:deadletters_deadletter_changelist")

    page = client.post(changelist, {**selected, "index": "0"}).content.decode()
    started = client.post(changelist, {**selected, "step": "start", "rate": "", "canary_size": "0"})
    operation = Operation.objects.get()
    run_operation(operation_id=operation.pk)

    assert "is one of the console&#x27;s own Celery queues" in page
    assert started.status_code == 302
    assert_planned_as_not_replayable(operation)
    assert_nothing_reached_the_console(shared_vhost, forged, users)


def test_forged_destinations_are_refused_by_a_retry_policy(shared_vhost: SharedVhost) -> None:
    forged, users = forge_world(shared_vhost)
    RetryPolicy.objects.create(name="everything", queue=DLQ, delays=[60], permanent_reasons=[])
    later = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5)

    schedule_new_dead_letters(now=later)
    operations = start_due_retries(now=later + dt.timedelta(minutes=2))
    for operation in operations:
        run_operation(operation_id=operation.pk)

    assert [operation.kind for operation in operations] == [OperationKind.RETRY]
    assert_nothing_reached_the_console(shared_vhost, forged, users)


def test_a_move_to_the_consoles_own_queues_is_refused_when_planned(shared_vhost: SharedVhost, operator: User) -> None:
    forged, users = forge_world(shared_vhost)

    for target in (CONSOLE_QUEUE, CONTROL_QUEUE):
        with pytest.raises(OperationError, match="is one of the console's own Celery queues"):
            plan_operation(kind=OperationKind.MOVE, filter={"ids": [users]}, actor=operator, target_queue=target)
    with pytest.raises(OperationError, match="is one of the console's own Celery exchanges"):
        plan_operation(
            kind=OperationKind.MOVE,
            filter={"ids": [users]},
            actor=operator,
            target_exchange=CONSOLE_QUEUE,
            target_routing_key=CONSOLE_QUEUE,
        )
    assert not Operation.objects.exists()
    assert forged


def test_the_console_names_are_refused_on_every_vhost_and_celery_control_only_on_its_own(settings: Any) -> None:
    settings.CELERY_BROKER_URL = "amqp://guest:guest@127.0.0.1:5672/dlqconsole"
    default, control = settings.CELERY_TASK_DEFAULT_QUEUE, settings.DLQ_CONTROL_QUEUE
    elsewhere: dict[str, Any] = {"shared_vhost": False}

    assert not replay_guard.shares_celery_vhost("amqp://guest:guest@rabbit.example:5672/%2F")
    assert not replay_guard.shares_celery_vhost("amqp://guest:guest@127.0.0.1:5673/dlqconsole")
    assert replay_guard.refusal("", default, **elsewhere)
    assert replay_guard.refusal("", control, **elsewhere)
    assert replay_guard.refusal(default, "anything", **elsewhere)
    # On another vhost, Celery's control names belong to the users' own Celery: a valid (if odd) target.
    assert replay_guard.refusal("celery.pidbox", "", **elsewhere) == ""
    assert replay_guard.refusal("", "celery", **elsewhere) == ""
    assert replay_guard.refusal("", "orders", **elsewhere) == ""

    # Another host name for the same vhost and port is taken for the same broker.
    assert replay_guard.shares_celery_vhost("amqp://other:secret@localhost/dlqconsole")
    for exchange, routing_key in [
        ("celery.pidbox", ""),
        ("reply.celery.pidbox", "abc"),
        ("celeryev", "worker.heartbeat"),
        ("", "work.dlqconsole@host.celery.pidbox"),
        ("", "0f3c.reply.celery.pidbox"),
        ("", "celeryev.5d1e"),
    ]:
        assert replay_guard.refusal(exchange, routing_key, shared_vhost=True), (exchange, routing_key)
    # A user's own Celery queues stay replayable even on the console's vhost.
    assert replay_guard.refusal("", "celery", shared_vhost=True) == ""
    assert replay_guard.refusal("celery", "celery", shared_vhost=True) == ""


def test_the_publisher_itself_refuses_the_consoles_own_queues(
    settings: Any, amqp_channel: Any, queue_name: Any
) -> None:
    """The last line of defence: whatever calls the publisher, a message for the console's queue is not sent."""
    queue = settings.CELERY_TASK_DEFAULT_QUEUE
    amqp_channel.queue_declare(queue=queue, durable=True)
    amqp_channel.queue_purge(queue=queue)
    users = queue_name("users")
    amqp_channel.queue_declare(queue=users, durable=True)
    properties, body = task_message("publisher")
    carbon_copy, _ = task_message("carbon-copy")
    carbon_copy.headers["BCC"] = [queue.encode()]
    with ConfirmedPublisher(connection_parameters(), key_header="dlq-replayed-from") as publisher:
        outcomes = publisher.publish(
            [
                Message(key=1, exchange="", routing_key=queue, body=body, properties=properties),
                Message(key=2, exchange="", routing_key=users, body=body, properties=carbon_copy),
            ]
        )

    assert [(outcome.status, outcome.error) for outcome in outcomes] == [
        (UNSENDABLE, f"refused: queue {queue!r} is one of the console's own Celery queues"),
        (
            UNSENDABLE,
            f"refused: its CC/BCC header routes it further: queue {queue!r} is one of the console's own Celery queues",
        ),
    ]
    assert amqp_channel.queue_declare(queue=queue, passive=True).method.message_count == 0
    assert amqp_channel.queue_declare(queue=users, passive=True).method.message_count == 0


def test_an_edit_that_adds_a_bcc_to_the_consoles_queue_is_refused(shared_vhost: SharedVhost, operator: User) -> None:
    forged, users = forge_world(shared_vhost)
    original = DeadLetter.objects.get(pk=users)

    operation = edit_and_retry(
        dead_letter=original,
        body=bytes(original.body),
        headers={"task": "sentinel.touch", "id": "edited", "BCC": [CONTROL_QUEUE]},
        actor=operator,
    )
    run_operation(operation_id=operation.pk)

    operation.refresh_from_db()
    assert f"its CC/BCC header routes it further: queue '{CONTROL_QUEUE}'" in " ".join(operation.unreplayable_reasons)
    (item,) = operation.items.all()
    assert (item.status, item.error.startswith("refused: its CC/BCC header")) == (ItemStatus.FAILED, True)
    assert drain(shared_vhost.channel, USER_CELERY_QUEUE) == []
    publish_task(shared_vhost.channel, exchange="", routing_key=CONSOLE_QUEUE, marker="after")
    assert shared_vhost.wait_for_run("after")
    assert not shared_vhost.ran("users-own")  # the edited copy names the sentinel task, with the original body
    assert forged
