"""Queue depth sampling of several brokers: two vhosts of the local RabbitMQ with the same queue names, each sampled
through its own connection, one refusing us never stopping the other, and depth alerts per broker."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import pytest
from django.utils import timezone
from pika.adapters.blocking_connection import BlockingChannel

from dlqconsole.alerts.evaluation import evaluate_rules
from dlqconsole.alerts.models import Alert
from dlqconsole.brokers import registry
from dlqconsole.ingest.models import QueueSample
from dlqconsole.ingest.sampling import sample_queue_depths
from dlqconsole.ingest.topology import declare_queue_topology
from tests.factories import rule
from tests.support import Vhost

pytestmark = [pytest.mark.django_db]


@pytest.fixture
def orders(queue_name: Callable[[str], str], second_vhost: Vhost) -> str:
    """The same work queue and DLQ declared on the broker default and on the broker "second"."""
    name = queue_name("orders")
    declare_queue_topology(name=name)
    declare_queue_topology(name=name, broker=registry.get("second"))
    return name


def publish(channel: BlockingChannel, queue: str, count: int) -> None:
    for number in range(count):
        channel.basic_publish(exchange="", routing_key=queue, body=str(number).encode())


def depths(moment: dt.datetime) -> dict[tuple[str, str], int]:
    return {
        (sample.broker.name, sample.queue): sample.messages
        for sample in QueueSample.objects.filter(sampled_at=moment).select_related("broker")
    }


def test_every_broker_is_sampled_through_its_own_connection(
    orders: str, amqp_channel: BlockingChannel, second_channel: BlockingChannel
) -> None:
    publish(amqp_channel, orders, 3)
    publish(second_channel, orders, 7)
    now = timezone.now()

    result = sample_queue_depths(now=now)

    assert (result.sampled, result.missing, result.unreachable) == (4, [], [])
    assert depths(now) == {
        ("default", orders): 3,
        ("default", f"{orders}.dlq"): 0,
        ("second", orders): 7,
        ("second", f"{orders}.dlq"): 0,
    }


def test_a_broker_that_refuses_us_never_stops_the_others_and_is_sampled_again_when_it_lets_us_in(
    orders: str,
    amqp_channel: BlockingChannel,
    second_channel: BlockingChannel,
    second_vhost: Vhost,
    caplog: pytest.LogCaptureFixture,
) -> None:
    publish(amqp_channel, orders, 2)
    publish(second_channel, orders, 5)
    second_vhost.revoke()
    refused_at = timezone.now()

    refused = sample_queue_depths(now=refused_at)

    assert refused.unreachable == ["second"]
    # The log names the broker and its URL, never the password.
    assert f"broker second (amqp://guest@127.0.0.1:5672/{second_vhost.name})" in caplog.text
    assert "guest:guest" not in caplog.text
    assert depths(refused_at) == {("default", orders): 2, ("default", f"{orders}.dlq"): 0}

    second_vhost.grant()
    back_at = timezone.now()
    back = sample_queue_depths(now=back_at)

    assert back.unreachable == []
    assert depths(back_at)[("second", orders)] == 5


def test_depth_alerts_fire_for_the_broker_whose_queue_is_deep(
    orders: str, amqp_channel: BlockingChannel, second_channel: BlockingChannel
) -> None:
    depth = rule("queue_depth", severity="warning", threshold=5)
    publish(amqp_channel, orders, 2)
    publish(second_channel, orders, 6)

    sample_queue_depths()
    evaluate_rules()

    alert = Alert.objects.open().get(rule=depth)
    assert alert.subject == f"queue@second:{orders}"
    assert alert.summary.startswith(f"{orders} on second: 6 messages ready")

    publish(amqp_channel, orders, 4)
    sample_queue_depths()
    evaluate_rules()

    assert set(Alert.objects.open().filter(rule=depth).values_list("subject", flat=True)) == {
        f"queue:{orders}",
        f"queue@second:{orders}",
    }
