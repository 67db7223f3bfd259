"""Celery tasks of the alerts app: thin wrappers that load nothing themselves and call services."""

from __future__ import annotations

from dlqconsole.alerts import services
from dlqconsole.celery import app
from dlqconsole.ingest import sampling


@app.task(name="alerts.evaluate_alerts", ignore_result=True)
def evaluate_alerts() -> None:
    services.evaluate_rules()


@app.task(name="alerts.send_notification", ignore_result=True)
def send_notification(notification_id: int) -> None:
    services.deliver_notification(notification_id=notification_id)


@app.task(name="alerts.retry_notifications", ignore_result=True)
def retry_notifications() -> None:
    """The notification sweep beat runs every few seconds: due retries and lost sends, then due digests."""
    services.enqueue_due_notifications()
    services.send_due_digests()


@app.task(name="alerts.sample_queues", ignore_result=True)
def sample_queues() -> None:
    sampling.sample_queue_depths()


@app.task(name="alerts.prune_notifications", ignore_result=True)
def prune_notifications() -> None:
    """Hourly retention: finished notifications older than DLQ_NOTIFICATION_RETENTION_DAYS."""
    services.prune_notifications()
