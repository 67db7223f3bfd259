"""A service's own Celery app (not the console's): its task fails while the service is "down" and records its
runs otherwise. The acceptance test replays a dead-lettered task of it and watches a real worker run it again."""

from __future__ import annotations

import os
from pathlib import Path

from celery import Celery, Task
from celery.exceptions import Reject
from kombu import Exchange, Queue


def make_app(*, queue: str, broker: str) -> Celery:
    app = Celery("probe", broker=broker, set_as_current=False)
    app.conf.update(
        # The test declares the queue with its dead-letter exchange; the worker must not declare it differently.
        task_queues=[Queue(queue, Exchange(""), routing_key=queue, no_declare=True)],
        task_default_queue=queue,
        task_acks_late=True,
        worker_prefetch_multiplier=1,
        worker_enable_remote_control=False,
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        broker_connection_retry_on_startup=True,
    )
    return app


app = make_app(
    queue=os.environ.get("PROBE_QUEUE", "probe"),
    broker=os.environ.get("AMQP_URL", "amqp://guest:guest@localhost:5672/%2F"),
)
OUTPUT = Path(os.environ.get("PROBE_DIR", "."))


@app.task(name="probe.record", bind=True, shared=False)
def record(self: Task, marker: str) -> None:  # type: ignore[type-arg]
    if (OUTPUT / "broken").exists():
        # What a failing task does when it gives up: the broker dead-letters the message.
        raise Reject("the service is down", requeue=False)
    with (OUTPUT / "ran.txt").open("a") as output:
        output.write(f"{marker} id={self.request.id} retries={self.request.retries}\n")
