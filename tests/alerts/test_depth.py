"""Queue depth sampling against real RabbitMQ queues, and the depth-threshold rules that read the samples."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import pytest
from django.test import override_settings
from django.utils import timezone
from pika.adapters.blocking_connection import BlockingChannel

from dlqconsole.alerts.evaluation import evaluate_rules
from dlqconsole.alerts.models import Alert, AlertRule, AlertStatus
from dlqconsole.ingest.models import QueueSample, WatchedQueue
from dlqconsole.ingest.sampling import sample_queue_depths
from dlqconsole.ingest.topology import declare_queue_topology
from tests.factories import rule

pytestmark = [pytest.mark.django_db]


def publish(channel: BlockingChannel, queue: str, count: int) -> None:
    for number in range(count):
        channel.basic_publish(exchange="", routing_key=queue, body=str(number).encode())


def reject(channel: BlockingChannel, queue: str, count: int) -> None:
    """Dead-letter `count` messages of the work queue the way a failing consumer does."""
    for _ in range(count):
        method, _properties, _body = channel.basic_get(queue)
        assert method is not None
        channel.basic_reject(method.delivery_tag, requeue=False)


@pytest.fixture
def orders(queue_name: Callable[[str], str], amqp_channel: BlockingChannel) -> str:
    name = queue_name("orders")
    declare_queue_topology(name=name)
    amqp_channel.confirm_delivery()
    return name


def open_severities() -> dict[str, float]:
    return {alert.severity: alert.value for alert in Alert.objects.open().filter(rule__kind="queue_depth")}


def test_depth_thresholds_escalate_and_resolve_on_a_real_queue(orders: str, amqp_channel: BlockingChannel) -> None:
    for severity in ("warning", "critical", "emergency"):
        rule("queue_depth", severity=severity)
    watched = WatchedQueue.objects.get(name=orders)
    assert (watched.warning_depth, watched.critical_depth, watched.emergency_depth) == (50, 200, 500)

    publish(amqp_channel, orders, 49)
    sample_queue_depths()
    evaluate_rules()
    assert open_severities() == {}

    publish(amqp_channel, orders, 1)
    sample_queue_depths()
    evaluate_rules()
    assert open_severities() == {"warning": 50}

    publish(amqp_channel, orders, 160)
    sample_queue_depths()
    evaluate_rules()
    assert open_severities() == {"warning": 210, "critical": 210}

    publish(amqp_channel, orders, 300)
    sample_queue_depths()
    evaluate_rules()
    assert open_severities() == {"warning": 510, "critical": 510, "emergency": 510}
    assert "510 messages ready (emergency at 500), 0 consumers" in Alert.objects.get(severity="emergency").summary

    amqp_channel.queue_purge(orders)
    sample_queue_depths()
    evaluate_rules()
    assert open_severities() == {}
    assert set(Alert.objects.filter(rule__kind="queue_depth").values_list("status", flat=True)) == {
        AlertStatus.RESOLVED
    }


def test_per_queue_thresholds_and_a_rule_threshold_override(orders: str, amqp_channel: BlockingChannel) -> None:
    WatchedQueue.objects.filter(name=orders).update(warning_depth=5)
    rule("queue_depth", severity="warning")
    fixed = AlertRule.objects.create(name="test depth over 8", kind="queue_depth", severity="critical", threshold=8)

    publish(amqp_channel, orders, 6)
    sample_queue_depths()
    evaluate_rules()
    assert open_severities() == {"warning": 6}

    publish(amqp_channel, orders, 3)
    sample_queue_depths()
    evaluate_rules()
    assert Alert.objects.open().get(rule=fixed).value == 9


def test_dead_letter_queue_depth_is_the_consumers_lag(orders: str, amqp_channel: BlockingChannel) -> None:
    not_empty = rule("dlq_not_empty")
    publish(amqp_channel, orders, 4)
    reject(amqp_channel, orders, 3)

    result = sample_queue_depths()

    assert result.sampled == 2 and result.missing == []
    depths = dict(QueueSample.objects.values_list("queue", "messages"))
    assert depths == {orders: 1, f"{orders}.dlq": 3}
    evaluate_rules()
    alert = Alert.objects.open().get(rule=not_empty)
    assert (alert.subject, alert.value) == (f"queue:{orders}.dlq", 3)
    assert "3 not yet ingested" in alert.summary


def test_a_stale_sample_leaves_depth_alerts_as_they_are(orders: str, amqp_channel: BlockingChannel) -> None:
    rule("queue_depth", severity="warning")
    publish(amqp_channel, orders, 60)
    start = timezone.now()
    sample_queue_depths(now=start)
    evaluate_rules(now=start)
    assert open_severities() == {"warning": 60}

    # The sampler stopped: no fresh sample says the queue drained, so the alert stays.
    evaluate_rules(now=start + dt.timedelta(minutes=5))
    assert open_severities() == {"warning": 60}


def test_missing_queues_are_skipped(queue_name: Callable[[str], str]) -> None:
    name = queue_name("ghost")
    WatchedQueue.objects.create(name=name, dead_letter_queue=f"{name}.dlq", dead_letter_exchange=f"{name}.dlx")

    result = sample_queue_depths()

    assert result.sampled == 0
    assert result.missing == [("default", name), ("default", f"{name}.dlq")]
    assert result.unreachable == []


def test_old_samples_are_deleted() -> None:
    now = timezone.now()
    QueueSample.objects.create(queue="orders", messages=1, consumers=0, sampled_at=now - dt.timedelta(hours=49))
    kept = QueueSample.objects.create(queue="orders", messages=2, consumers=0, sampled_at=now - dt.timedelta(hours=47))

    result = sample_queue_depths(now=now)

    assert result.deleted == 1
    assert list(QueueSample.objects.all()) == [kept]


@override_settings(AMQP_URL="amqp://guest:guest@127.0.0.1:1/%2F")
def test_broker_down_skips_the_run(orders: str) -> None:
    result = sample_queue_depths()

    assert result.sampled == 0
    assert result.unreachable == ["default"]
    assert not QueueSample.objects.exists()
