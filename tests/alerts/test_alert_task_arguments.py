"""The alerts tasks take their arguments from whoever can publish to the console's Celery vhost: hostile ones are
refused with one logged line, and no notification is sent or changed."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.utils import timezone
from pytest_django import Settings

from dlqconsole.alerts.evaluation import evaluate_rules
from dlqconsole.alerts.models import Alert, Channel, Notification, NotificationKind, NotificationStatus
from dlqconsole.alerts.tasks import (
    evaluate_alerts,
    prune_notifications,
    retry_notifications,
    sample_queues,
    send_notification,
)
from tests.alerts.conftest import Receiver
from tests.factories import parked, rule
from tests.support import NESTED, refusals

pytestmark = [pytest.mark.django_db]


def test_hostile_notification_ids_are_refused_and_send_nothing(
    webhook: Channel, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    rule("dlq_not_empty", channels=[webhook])
    parked(2, queue="orders.dlq", message="Request timed out", error_type="TimeoutError")
    evaluate_rules()
    notification = Notification.objects.get(channel=webhook, kind=NotificationKind.FIRING)
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        ((hostile,), {})
        for hostile in [
            "1; DROP",
            str(notification.pk),
            -1,
            2**70,
            True,
            None,
            NESTED,
            [notification.pk],
            notification.pk + 1000,  # no such notification
        ]
    ]
    calls += [((), {"notification_id": notification.pk, "target": "http://169.254.169.254/"}), ((), {})]

    for args, kwargs in calls:
        assert send_notification(*args, **kwargs) is None

    notification.refresh_from_db()
    assert (notification.status, notification.attempts) == (NotificationStatus.QUEUED, 0)
    assert receiver.received == []
    assert len(refusals(caplog, "alerts.send_notification")) == len(calls)

    send_notification(notification.pk)

    notification.refresh_from_db()
    assert notification.status == NotificationStatus.SENT
    assert len(receiver.received) == 1


def test_the_notification_retention_task_takes_no_arguments(
    webhook: Channel,
    settings: Settings,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings.DLQ_NOTIFICATION_RETENTION_DAYS = 7
    old = Notification.objects.create(
        channel=webhook, kind="test", status="sent", created_at=timezone.now() - dt.timedelta(days=30)
    )

    assert prune_notifications(0) is None
    assert prune_notifications(batch_size=1) is None

    assert Notification.objects.filter(pk=old.pk).exists()
    assert len(refusals(caplog, "alerts.prune_notifications")) == 2
    prune_notifications()
    assert not Notification.objects.filter(pk=old.pk).exists()


@pytest.mark.parametrize("task", [evaluate_alerts, retry_notifications, sample_queues])
@pytest.mark.parametrize(("args", "kwargs"), [(("x",), {}), ((), {"now": "2999-01-01"}), ((NESTED,), {})])
def test_the_beat_tasks_take_no_arguments(
    task: Any, args: tuple[Any, ...], kwargs: dict[str, Any], webhook: Channel, caplog: pytest.LogCaptureFixture
) -> None:
    # A rule that fires as soon as anything evaluates it.
    rule("dlq_not_empty", channels=[webhook])
    parked(2, queue="orders.dlq", message="Request timed out", error_type="TimeoutError")

    assert task(*args, **kwargs) is None

    assert len(refusals(caplog, task.name)) == 1
    assert not Alert.objects.exists()
    assert not Notification.objects.exists()
