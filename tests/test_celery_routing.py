"""Long work and control tasks travel on separate queues, so that a worker busy with a bulk retry for hours
never delays an alert evaluation, a notification or the operation sweeper."""

from __future__ import annotations

from django.conf import settings

from dlqconsole.celery import app


def queue_of(task_name: str) -> str:
    app.loader.import_default_modules()
    route = app.amqp.router.route({}, task_name, (), {})
    return str(route["queue"].name)


def test_every_scheduled_task_goes_to_the_control_queue() -> None:
    scheduled = {str(entry["task"]) for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert scheduled  # the beat has work
    assert {name: queue_of(name) for name in scheduled} == dict.fromkeys(scheduled, settings.DLQ_CONTROL_QUEUE)
    assert queue_of("alerts.send_notification") == settings.DLQ_CONTROL_QUEUE


def test_operations_and_exports_go_to_the_default_queue() -> None:
    assert queue_of("operations.run_operation") == settings.CELERY_TASK_DEFAULT_QUEUE
    assert queue_of("deadletters.write_export") == settings.CELERY_TASK_DEFAULT_QUEUE
    assert settings.DLQ_CONTROL_QUEUE != settings.CELERY_TASK_DEFAULT_QUEUE


def test_a_worker_without_queue_options_consumes_both() -> None:
    assert set(app.amqp.queues) == {settings.CELERY_TASK_DEFAULT_QUEUE, settings.DLQ_CONTROL_QUEUE}


def test_every_registered_control_task_exists() -> None:
    app.loader.import_default_modules()
    assert set(settings.CONTROL_TASKS) <= set(app.tasks)
