"""Long work and control tasks travel on separate queues, so that a worker busy with a bulk retry for hours
never delays an alert evaluation, a notification or the operation sweeper."""

from __future__ import annotations

import os
import subprocess
import sys

from django.conf import settings

from dlqconsole.celery import app


def queue_of(task_name: str) -> str:
    app.loader.import_default_modules()
    route = app.amqp.router.route({}, task_name, (), {})
    return str(route["queue"].name)


def test_every_scheduled_task_but_bulk_deletion_goes_to_the_control_queue() -> None:
    scheduled = {str(entry["task"]) for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    bulk = {"operations.apply_retention"}
    # Filling in search text for rows stored before it existed: a few seconds of writes a minute.
    bulk |= {"deadletters.fill_search_text"}
    assert bulk < scheduled
    control = scheduled - bulk
    assert {name: queue_of(name) for name in control} == dict.fromkeys(control, settings.DLQ_CONTROL_QUEUE)
    assert queue_of("operations.apply_retention") == settings.CELERY_TASK_DEFAULT_QUEUE
    assert queue_of("operations.delete_expired_archives") == settings.CELERY_TASK_DEFAULT_QUEUE
    assert queue_of("deadletters.fill_search_text") == settings.CELERY_TASK_DEFAULT_QUEUE
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


def test_an_empty_or_clashing_control_queue_setting() -> None:
    """Empty means the default name; the same name as the default queue would undo the separation."""
    script = "import django; django.setup(); from django.conf import settings; print(settings.DLQ_CONTROL_QUEUE)"
    base = dict(os.environ, DJANGO_SETTINGS_MODULE="dlqconsole.settings", CELERY_TASK_DEFAULT_QUEUE="work")
    empty = subprocess.run(
        [sys.executable, "-c", script], env={**base, "DLQ_CONTROL_QUEUE": ""}, capture_output=True, text=True
    )
    assert empty.returncode == 0 and empty.stdout.strip() == "work.control"
    clash = subprocess.run(
        [sys.executable, "-c", script], env={**base, "DLQ_CONTROL_QUEUE": "work"}, capture_output=True, text=True
    )
    assert clash.returncode != 0 and "DLQ_CONTROL_QUEUE must differ" in clash.stderr
