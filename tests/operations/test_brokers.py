"""Operations across brokers: two vhosts of the local RabbitMQ as the brokers default and staging, the same queue
names declared on both. A retry returns each message to the broker its dead letter came from, a move may name
another broker, the plan breaks its set down by broker (and says so when it spans several), and a broker that
refuses holds back only its own messages."""

from __future__ import annotations

import uuid
from io import StringIO
from typing import Any

import pytest
import redis
from django.core.management import CommandError, call_command
from django.test import Client
from pika.adapters.blocking_connection import BlockingChannel as Channel

from dlqconsole.brokers import registry
from dlqconsole.brokers.models import Broker
from dlqconsole.core.publish import UNSENDABLE, ConfirmedPublisher, Message
from dlqconsole.core.ratelimit import DEFAULT_PREFIX
from dlqconsole.deadletters.models import DeadLetter
from dlqconsole.operations.destinations import Destination, KnownBrokers
from dlqconsole.operations.models import ItemStatus, Operation, OperationKind, OperationStatus
from dlqconsole.operations.planning import plan_operation
from dlqconsole.operations.services import OperationError, resume_operation, run_operation, start_operation
from tests.conftest import client_for
from tests.factories import EnvelopeFactory, store
from tests.operations.conftest import SecondBroker, TwoBrokers
from tests.support import drain, wait_for_depth

pytestmark = pytest.mark.django_db


def bodies(channel: Channel, queue: str) -> list[bytes]:
    return sorted(body for _, body in drain(channel, queue))


def dlq(*args: str) -> str:
    out = StringIO()
    call_command("dlq", *args, stdout=out)
    return out.getvalue()


def test_a_retry_of_one_brokers_pattern_lands_back_in_that_brokers_queue_only(
    channel: Channel, staging: SecondBroker, two_brokers: TwoBrokers, operator: Any
) -> None:
    orders = two_brokers.orders
    operation = plan_operation(
        kind=OperationKind.RETRY,
        filter={"pattern": [two_brokers.pattern_id], "broker": ["staging"]},
        actor=operator,
    )
    start_operation(operation=operation, actor=operator)
    run_operation(operation_id=operation.pk)

    operation.refresh_from_db()
    assert (operation.status, operation.total, operation.succeeded) == (OperationStatus.DONE, 3, 3)
    assert operation.breakdown["brokers"] == {"staging": 3}
    assert wait_for_depth(staging.channel, orders, 3) == 3
    assert bodies(staging.channel, orders) == [b"staging 0", b"staging 1", b"staging 2"]
    assert channel.queue_declare(queue=orders, passive=True).method.message_count == 0
    assert {letter.status for letter in DeadLetter.objects.filter(broker__name="staging")} == {"replayed"}
    assert {letter.status for letter in DeadLetter.objects.filter(broker__name="default")} == {"parked"}
    assert set(operation.items.values_list("destination", flat=True)) == {f"staging · queue {orders}"}


def test_a_retry_spanning_two_brokers_says_so_and_returns_each_message_to_its_own(
    channel: Channel, staging: SecondBroker, two_brokers: TwoBrokers, operator: Any, settings: Any
) -> None:
    orders = two_brokers.orders
    operation = plan_operation(
        kind=OperationKind.RETRY, filter={"pattern": [two_brokers.pattern_id]}, actor=operator, rate="1/1m:10"
    )

    assert operation.breakdown["brokers"] == {"staging": 3, "default": 2}
    assert operation.broker_span == "This retry spans 2 brokers: staging 3, default 2"
    assert operation.breakdown["queue"] == {f"staging · {orders}.dlq": 3, f"{orders}.dlq": 2}
    assert operation.breakdown["destination"] == {f"staging · queue {orders}": 3, f"queue {orders}": 2}
    assert operation.destination_queues == sorted([(orders, 0, 0), (f"staging · {orders}", 0, 0)])
    assert operation.unreplayable == 0
    page = client_for(operator).get(f"/operations/{operation.pk}/").content.decode()
    fragment = client_for(operator).get(f"/operations/{operation.pk}/", headers={"HX-Request": "true"})
    assert 'data-testid="broker-span"' in page
    assert "This retry spans 2 brokers: staging 3, default 2." in page
    assert f"staging · {orders}" in page and 'data-testid="by-broker"' in page
    assert "<html" not in fragment.content.decode()
    assert "This retry spans 2 brokers: staging 3, default 2." in fragment.content.decode()

    start_operation(operation=operation, actor=operator)
    run_operation(operation_id=operation.pk)

    operation.refresh_from_db()
    assert (operation.status, operation.succeeded, operation.failed) == (OperationStatus.DONE, 5, 0)
    assert wait_for_depth(channel, orders, 2) == 2
    assert wait_for_depth(staging.channel, orders, 3) == 3
    assert bodies(channel, orders) == [b"default 0", b"default 1"]
    assert bodies(staging.channel, orders) == [b"staging 0", b"staging 1", b"staging 2"]
    # The shared rate limit kept one bucket per broker for the same queue name.
    client = redis.Redis.from_url(settings.REDIS_URL)
    keys = [f"{DEFAULT_PREFIX}queue:{orders}", f"{DEFAULT_PREFIX}broker:staging:queue:{orders}"]
    try:
        assert [client.exists(key) for key in keys] == [1, 1]
    finally:
        client.delete(*keys)
        client.close()


def test_the_dry_run_of_the_dlq_command_names_the_brokers_first(two_brokers: TwoBrokers) -> None:
    output = dlq("retry", "--pattern", str(two_brokers.pattern_id), "--dry-run")

    lines = output.splitlines()
    assert lines[0] == "Plan (dry run): retry 5 dead letters"
    assert lines[1] == "  ** This retry spans 2 brokers: staging 3, default 2 **"
    assert "  by broker: staging 3; default 2" in lines
    assert not Operation.objects.exists()


def test_a_move_to_another_brokers_queue_goes_to_that_broker_only(
    channel: Channel, staging: SecondBroker, two_brokers: TwoBrokers, queue_name: Any
) -> None:
    parking = queue_name("parking")
    for on in (channel, staging.channel):
        on.queue_declare(queue=parking, durable=True)
    ids = ",".join(str(letter.pk) for letter in two_brokers.on_default)

    output = dlq("move", "--id", ids, "--target-queue", parking, "--target-broker", "staging", "--yes", "--inline")

    operation = Operation.objects.get()
    assert operation.target_broker == staging.row
    assert f"target: queue {parking} on broker staging" in output
    assert operation.status == OperationStatus.DONE and operation.succeeded == 2
    assert wait_for_depth(staging.channel, parking, 2) == 2
    assert bodies(staging.channel, parking) == [b"default 0", b"default 1"]
    assert channel.queue_declare(queue=parking, passive=True).method.message_count == 0
    assert set(operation.items.values_list("destination", flat=True)) == {f"staging · queue {parking}"}


def test_a_move_checks_its_target_on_the_target_broker(
    channel: Channel, staging: SecondBroker, two_brokers: TwoBrokers, queue_name: Any, operator: Any
) -> None:
    only_on_default = queue_name("only-default")
    channel.queue_declare(queue=only_on_default, durable=True)

    operation = plan_operation(
        kind=OperationKind.MOVE,
        filter={"ids": [two_brokers.on_default[0].pk]},
        actor=operator,
        target_queue=only_on_default,
        target_broker="staging",
    )

    assert operation.unreplayable_reasons == {f"staging · queue '{only_on_default}' does not exist": 1}


def test_an_unknown_target_broker_is_refused_naming_the_known_ones(
    staging: SecondBroker, two_brokers: TwoBrokers, operator: Any
) -> None:
    ids = str(two_brokers.on_default[0].pk)

    with pytest.raises(CommandError, match=r"no broker named 'production' \(known: default, staging\)"):
        dlq("move", "--id", ids, "--target-queue", "parking", "--target-broker", "production", "--yes")
    with pytest.raises(OperationError, match="only a move takes a target broker"):
        plan_operation(kind=OperationKind.RETRY, filter={"ids": [ids]}, actor=operator, target_broker="staging")
    Broker.objects.filter(name="staging").update(enabled=False)
    with pytest.raises(OperationError, match="broker 'staging' is disabled"):
        plan_operation(
            kind=OperationKind.MOVE, filter={"ids": [ids]}, actor=operator, target_queue="x", target_broker="staging"
        )
    assert not Operation.objects.exists()


def test_the_plan_page_offers_the_brokers_for_a_move_and_plans_on_the_one_chosen(
    staging: SecondBroker, two_brokers: TwoBrokers, operator: Any
) -> None:
    client: Client = client_for(operator)
    ids = str(two_brokers.on_default[0].pk)

    form = client.get("/operations/plan/", {"kind": "move", "ids": ids, "scope": "selected"}).content.decode()
    retry_form = client.get("/operations/plan/", {"kind": "retry", "ids": ids, "scope": "selected"}).content.decode()
    planned = client.post(
        "/operations/plan/",
        {"kind": "move", "ids": ids, "scope": "selected", "target_queue": "parking", "target_broker": "staging"},
    )
    refused = client.post(
        "/operations/plan/",
        {"kind": "move", "ids": ids, "scope": "selected", "target_queue": "parking", "target_broker": "nowhere"},
    )

    estimated = client.get(
        "/operations/plan/", {"kind": "retry", "pattern": str(two_brokers.pattern_id), "broker": "staging"}
    ).content.decode()

    assert "3 dead letters now" in estimated
    assert 'data-testid="target-broker"' in form and '<option value="staging">staging</option>' in form
    assert 'data-testid="target-broker"' not in retry_form
    operation = Operation.objects.get()
    assert planned.status_code == 302 and operation.target_broker == staging.row
    assert refused.status_code == 400 and "no broker named &#x27;nowhere&#x27;" in refused.content.decode()


def test_a_broker_that_refuses_holds_back_only_its_own_messages(
    channel: Channel, staging: SecondBroker, two_brokers: TwoBrokers, operator: Any
) -> None:
    orders = two_brokers.orders
    operation = plan_operation(kind=OperationKind.RETRY, filter={"pattern": [two_brokers.pattern_id]}, actor=operator)
    start_operation(operation=operation, actor=operator)
    staging.revoke()

    run_operation(operation_id=operation.pk)

    operation.refresh_from_db()
    assert operation.status == OperationStatus.PAUSED and operation.paused_automatically
    assert operation.pause_reason.startswith("cannot publish: broker staging: cannot connect to RabbitMQ")
    assert operation.pause_reason.endswith("3 messages wait: resume once the broker can be reached")
    assert (operation.succeeded, operation.failed) == (2, 0)
    assert wait_for_depth(channel, orders, 2) == 2
    staging_ids = [letter.pk for letter in two_brokers.on_staging]
    assert set(operation.items.filter(dead_letter_id__in=staging_ids).values_list("status", flat=True)) == {
        ItemStatus.PENDING
    }
    assert set(DeadLetter.objects.filter(pk__in=staging_ids).values_list("status", flat=True)) == {"parked"}

    staging.grant()
    resume_operation(operation=operation, actor=operator)
    run_operation(operation_id=operation.pk)

    operation.refresh_from_db()
    assert (operation.status, operation.succeeded, operation.duplicates) == (OperationStatus.DONE, 5, 0)
    assert bodies(staging.channel, orders) == [b"staging 0", b"staging 1", b"staging 2"]
    # Nothing twice: default's two went out once.
    assert bodies(channel, orders) == [b"default 0", b"default 1"]


def test_the_celery_vhost_is_refused_on_the_broker_that_is_it_and_only_there(
    channel: Channel, staging: SecondBroker, operator: Any, settings: Any
) -> None:
    settings.CELERY_BROKER_URL = staging.url
    events = f"celeryev.{uuid.uuid4().hex[:8]}"
    for on in (channel, staging.channel):
        on.queue_declare(queue=events, durable=True)
    try:
        on_default = store(EnvelopeFactory.build(queue=events, exchange="", routing_key=events, body=b"to default"))
        letter = EnvelopeFactory.build(queue=events, exchange="", routing_key=events, body=b"to staging")
        letter.broker_id = staging.row.pk
        on_staging = store(letter)
        brokers = KnownBrokers()
        assert (brokers.shares_celery_vhost(staging.row), brokers.shares_celery_vhost(registry.default_broker())) == (
            True,
            False,
        )
        refused = f"refused: {events!r} is Celery's remote control or event channel on the console's own vhost"
        assert brokers.refusal(Destination(exchange="", routing_key=events, queue=events, broker="staging")) == refused
        assert brokers.refusal(Destination(exchange="", routing_key=events, queue=events)) == ""

        operation = plan_operation(
            kind=OperationKind.RETRY, filter={"ids": [on_default[0].pk, on_staging[0].pk]}, actor=operator
        )
        assert operation.unreplayable_reasons == {f"staging · {refused}": 1}
        start_operation(operation=operation, actor=operator)
        run_operation(operation_id=operation.pk)

        failed = operation.items.get(dead_letter_id=on_staging[0].pk)
        assert (failed.status, failed.error) == (ItemStatus.FAILED, refused)
        assert operation.items.get(dead_letter_id=on_default[0].pk).status == ItemStatus.PUBLISHED
        assert wait_for_depth(channel, events, 1) == 1
        assert staging.depth(events) == 0

        # The publisher opened on that broker refuses it too, whatever asks it to publish.
        with ConfirmedPublisher(registry.connection_parameters(staging.row), key_header="dlq-replayed-from") as sent:
            (outcome,) = sent.publish([Message(key=1, exchange="", routing_key=events, body=b"forged")])
        assert (outcome.status, outcome.error) == (UNSENDABLE, refused)
        assert staging.depth(events) == 0
    finally:
        channel.queue_delete(queue=events)
