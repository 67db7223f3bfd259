"""The demo's Celery app: tasks with late acks that fail, so that RabbitMQ dead-letters them.

`manage.py demo` starts `celery -A dlqconsole.ingest.demo.celery_app worker` with DLQ_DEMO_CELERY_QUEUE naming
the task queue, which it has declared with a dead-letter exchange through dlqconsole.ingest.topology. The worker
declares the queue again on start, with the same arguments (RabbitMQ refuses a declaration that differs).

How a failed task reaches the DLQ (checked on Celery 5.7 by tests/ingest/test_broker_deaths.py):
- `task_acks_late=True` alone is not enough: by default Celery acks a late task that *failed*, and the message
  is gone. `task_acks_on_failure=False` (the 5.7 name; `task_acks_on_failure_or_timeout` is its deprecated
  predecessor) makes the worker reject it with requeue=False instead, and RabbitMQ dead-letters it.
- A task may also raise `celery.exceptions.Reject(requeue=False)`; that works with or without the setting above.
- A task that retries (`self.retry`) publishes a new message with `retries` + 1; only the last one dies.
"""

from __future__ import annotations

import os
from typing import Any

import django
from celery import Celery
from celery.result import AsyncResult
from django.conf import settings
from kombu import Exchange, Queue

# The worker runs outside manage.py: set Django up so that the topology module (which knows the models) loads.
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dlqconsole.settings")
django.setup()

DEFAULT_QUEUE = "demo.tasks"


def task_queue(name: str) -> Queue:
    """The task queue as Celery declares it: Celery's usual direct exchange named after the queue, plus the
    dead-letter arguments of our topology."""
    # Imported here because it imports models, which need the django.setup() above.
    from dlqconsole.ingest.topology import queue_arguments

    return Queue(
        name,
        Exchange(name, type="direct", durable=True),
        routing_key=name,
        durable=True,
        queue_arguments=queue_arguments(name=name),
    )


def send(task_name: str, *, queue: str, kwargs: dict[str, Any]) -> AsyncResult:
    """Send a demo task to `queue`. A Queue object rather than a name (Celery accepts both; its type stubs only
    know names), so that Celery declares the queue with our dead-letter arguments whatever it was told before."""
    return app.send_task(task_name, kwargs=kwargs, queue=task_queue(queue))  # type: ignore[arg-type]


def use_queue(name: str) -> None:
    """Send (and consume) demo tasks through the queue `name`."""
    app.conf.update(
        task_queues=[task_queue(name)],
        task_default_queue=name,
        task_default_exchange=name,
        task_default_routing_key=name,
    )


# No Django fixup: the demo tasks use no database, and the fixup's start-up checks would import every URLconf.
# set_as_current=False: importing the demo app (tests do) must not make it the current app of this process.
app = Celery("dlqconsole_demo", include=["dlqconsole.ingest.demo.tasks"], fixups=[], set_as_current=False)
app.conf.update(
    # The demo shop is one of the users' services: its tasks live (and die) on the vhost the console watches,
    # AMQP_URL, not on the console's own Celery vhost (CELERY_BROKER_URL, a vhost of its own in `make run`).
    # Celery takes the CELERY_BROKER_URL environment variable over broker_url, but not over these two.
    broker_url=settings.AMQP_URL,
    broker_read_url=settings.AMQP_URL,
    broker_write_url=settings.AMQP_URL,
    broker_connection_retry_on_startup=True,
    task_acks_late=True,
    task_acks_on_failure=False,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    task_serializer="json",
    accept_content=["json"],
    task_ignore_result=True,
)
use_queue(os.environ.get("DLQ_DEMO_CELERY_QUEUE", DEFAULT_QUEUE))
