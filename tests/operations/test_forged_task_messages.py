"""A stranger with publish rights on the console's Celery vhost sends a task message of their own making, straight
into the console's queue: a real worker refuses it, logs why, and writes nothing."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika
import pytest
from django.conf import settings
from pika.adapters.blocking_connection import BlockingChannel as Channel

from tests.support import Worker

pytestmark = pytest.mark.django_db(transaction=True)


def forge(channel: Channel, *, task: str, kwargs: dict[str, Any]) -> str:
    """Publish a Celery protocol 2 task message (JSON body `[args, kwargs, embed]`, the task in the headers) to the
    console's default queue through the default exchange, as any client with publish rights can."""
    task_id = str(uuid.uuid4())
    headers = {
        "lang": "py",
        "task": task,
        "id": task_id,
        "root_id": task_id,
        "parent_id": None,
        "group": None,
        "eta": None,
        "expires": None,
        "retries": 0,
        "timelimit": [None, None],
        "argsrepr": "()",
        "kwargsrepr": repr(kwargs),
        "origin": "stranger@elsewhere",
    }
    body = json.dumps([[], kwargs, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}])
    channel.basic_publish(
        exchange="",
        routing_key=settings.CELERY_TASK_DEFAULT_QUEUE,
        body=body.encode(),
        properties=pika.BasicProperties(
            content_type="application/json",
            content_encoding="utf-8",
            correlation_id=task_id,
            delivery_mode=2,
            headers=headers,
        ),
    )
    return task_id


def wait_for_line(log: Path, text: str, *, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = log.read_text(errors="replace")
        if text in found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"no {text!r} in the worker's log after {timeout}s:\n{log.read_text()[-3000:]}")


def test_a_forged_export_message_with_a_traversal_token_writes_nothing_outside(
    channel: Channel,
    celery_worker: Callable[..., Worker],
    celery_queue: str,
    tmp_path: Path,
) -> None:
    # The worker's VAR_DIR is tmp_path, its export folder tmp_path/exports: "../../" leads to tmp_path's parent.
    name = f"x-{uuid.uuid4().hex}"
    outside = tmp_path.parent
    worker = celery_worker()
    worker.wait_until_ready()

    task_id = forge(
        channel,
        task="deadletters.write_export",
        kwargs={"token": f"../../{name}", "filter": {}, "export_format": "csv"},
    )

    log = wait_for_line(worker.log, f"[{task_id}] succeeded")
    assert sorted(path.name for path in outside.glob(f"{name}*")) == []
    assert not (tmp_path / "exports").exists() or list((tmp_path / "exports").iterdir()) == []
    (refusal,) = [line for line in log.splitlines() if "refused its arguments" in line and name in line]
    assert refusal.endswith(
        "task deadletters.write_export refused its arguments, did nothing: "
        f"token: '../../{name}' is not an export token"
    )
    assert "Traceback" not in log
