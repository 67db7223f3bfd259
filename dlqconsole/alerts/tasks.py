"""Celery tasks of the alerts app: thin wrappers that load nothing themselves and call services; their arguments
are checked as if a stranger sent them (core/taskargs.py)."""

from __future__ import annotations

from dlqconsole.alerts import delivery, digests, evaluation
from dlqconsole.alerts.models import Notification
from dlqconsole.celery import app
from dlqconsole.core.taskargs import CheckedTask, row_id
from dlqconsole.ingest import sampling


@app.task(name="alerts.evaluate_alerts", ignore_result=True, base=CheckedTask)
def evaluate_alerts() -> None:
    evaluation.evaluate_rules()


@app.task(
    name="alerts.send_notification",
    ignore_result=True,
    base=CheckedTask,
    argument_checks={"notification_id": row_id(Notification)},
)
def send_notification(notification_id: int) -> None:
    delivery.deliver_notification(notification_id=notification_id)


@app.task(name="alerts.retry_notifications", ignore_result=True, base=CheckedTask)
def retry_notifications() -> None:
    """The notification sweep beat runs every few seconds: due retries and lost sends, then due digests."""
    delivery.enqueue_due_notifications()
    digests.send_due_digests()


@app.task(name="alerts.sample_queues", ignore_result=True, base=CheckedTask)
def sample_queues() -> None:
    sampling.sample_queue_depths()


@app.task(name="alerts.prune_notifications", ignore_result=True, base=CheckedTask)
def prune_notifications() -> None:
    """Hourly retention: finished notifications older than DLQ_NOTIFICATION_RETENTION_DAYS."""
    delivery.prune_notifications()
