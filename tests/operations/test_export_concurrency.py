"""Background exports share the long-work workers with operations: with DLQ_EXPORT_CONCURRENCY=1 a second export
waits for the first without holding a worker, so an operation queued meanwhile runs at once."""

from __future__ import annotations

import csv
import io
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from pytest_django import Settings

from dlqconsole.core.leases import get_leases
from dlqconsole.deadletters import exports
from dlqconsole.deadletters.models import DeadLetter
from dlqconsole.operations.models import Operation, OperationKind, OperationStatus
from dlqconsole.operations.planning import plan_operation
from dlqconsole.operations.services import start_operation
from tests.conftest import client_for
from tests.deadletters.export_world import clear_export_leases
from tests.factories import many
from tests.support import Worker

pytestmark = pytest.mark.django_db(transaction=True)

ONE_SLOT = "tests.operations.one_slot_settings"


@pytest.fixture(autouse=True)
def _no_export_leases() -> Iterator[None]:
    clear_export_leases()
    yield
    clear_export_leases()


def wait_until(check: Callable[[], bool], *, timeout: float = 30.0, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"not {what} after {timeout}s")


def test_a_second_export_waits_without_blocking_an_operation(
    viewer: User,
    operator: User,
    celery_worker: Callable[..., Worker],
    celery_queue: str,
    tmp_path: Path,
    settings: Settings,
) -> None:
    settings.VAR_DIR = tmp_path  # the workers' VAR_DIR: the page reads the files they write
    settings.DLQ_EXPORT_CONCURRENCY = 1
    many(5, queue="orders")
    (billing,) = many(1, queue="billing")
    first = exports.start_export(filter={"queue": ["orders.dlq"]}, export_format="csv", user=viewer)
    second = exports.start_export(filter={"queue": ["orders.dlq"]}, export_format="csv", user=viewer)
    # The first export's file is a named pipe: the worker writing it waits for a reader, so the first export holds
    # its slot for exactly as long as the test does not read it.
    pipe = tmp_path / "exports" / f"{first}.csv.part"
    pipe.unlink()
    os.mkfifo(pipe)

    # One worker takes the first export (and, prefetching one message at a time, nothing else while it runs).
    busy = celery_worker(DLQ_EXPORT_CONCURRENCY="1", DJANGO_SETTINGS_MODULE=ONE_SLOT)
    busy.wait_until_ready()
    wait_until(lambda: get_leases().holders(exports.RUNNING_POOL) == {first}, what="writing the first export")
    # A second worker takes the second export, finds the slot taken, and sends it back for later.
    free = celery_worker(DLQ_EXPORT_CONCURRENCY="1", DJANGO_SETTINGS_MODULE=ONE_SLOT)
    free.wait_until_ready()
    # Its log: the second export received, done (sent back for later), and its copy received to run later.
    wait_until(lambda: free.log.read_text().count("Task deadletters.write_export[") >= 3, what="sending it back")

    operation = plan_operation(kind=OperationKind.ARCHIVE, filter={"ids": [billing.pk]}, actor=operator)
    start_operation(operation=operation, actor=operator)  # enqueued behind the two exports
    wait_until(
        lambda: Operation.objects.get(pk=operation.pk).status == OperationStatus.DONE, what="running the operation"
    )

    # The operation ran while the first export still wrote and the second still waited.
    assert DeadLetter.objects.get(pk=billing.pk).status == "archived"
    assert get_leases().holders(exports.RUNNING_POOL) == {first}
    assert sorted(path.name for path in (tmp_path / "exports").iterdir()) == sorted(
        [f"{first}.csv.part", f"{second}.csv.part"]
    )
    client = client_for(viewer)
    assert "Waiting: other exports are being written" in client.get(f"/messages/exports/{second}/").content.decode()
    assert "Writing…" in client.get(f"/messages/exports/{first}/").content.decode()

    with pipe.open(encoding="utf-8", newline="") as reader:
        first_rows = list(csv.DictReader(io.StringIO(reader.read())))

    # The first export is done and frees its slot; the second takes it on its next try and is written.
    ready = tmp_path / "exports" / f"{second}.csv"
    wait_until(ready.exists, what="writing the second export")
    second_rows = list(csv.DictReader(io.StringIO(ready.read_text(encoding="utf-8"))))
    assert len(first_rows) == len(second_rows) == 5
    assert {row["source_queue"] for row in second_rows} == {"orders.dlq"}
    assert get_leases().holders(exports.RUNNING_POOL) == set()
    assert get_leases().holders(exports.user_pool(viewer.pk)) == set()
