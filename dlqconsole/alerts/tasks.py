"""Celery tasks of the alerts app: thin wrappers that load nothing themselves and call one service each."""

from __future__ import annotations

from celery import shared_task

from dlqconsole.alerts import services
from dlqconsole.ingest import sampling


@shared_task(name="alerts.evaluate_alerts", ignore_result=True)
def evaluate_alerts() -> None:
    services.evaluate_rules()


@shared_task(name="alerts.send_notification", ignore_result=True)
def send_notification(notification_id: int) -> None:
    services.deliver_notification(notification_id=notification_id)


@shared_task(name="alerts.retry_notifications", ignore_result=True)
def retry_notifications() -> None:
    services.enqueue_due_notifications()


@shared_task(name="alerts.sample_queues", ignore_result=True)
def sample_queues() -> None:
    sampling.sample_queue_depths()
