"""An operation no worker has taken says so, since when, instead of "Running 0%"; a running one shows its worker's
heartbeat age, and a stale heartbeat says so plainly. The rows are set directly, the clock pinned."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest
import time_machine
from django.contrib.auth.models import User

from dlqconsole.operations.models import Operation, OperationKind, OperationStatus
from dlqconsole.operations.worker_watch import watch_worker
from tests.api.conftest import api_client, token_for
from tests.conftest import client_for

pytestmark = pytest.mark.django_db

QUEUED = dt.datetime(2026, 11, 26, 9, 30, 5, tzinfo=dt.UTC)
HX = {"HX-Request": "true"}
HOUR = dt.timedelta(hours=1)


@pytest.fixture(autouse=True)
def _stale_after_a_minute(settings: Any) -> None:
    settings.DLQ_OPERATION_STALE_SECONDS = 60


def shown(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", html))


def started(*, runner: str = "", heartbeat_at: dt.datetime = QUEUED, **fields: Any) -> Operation:
    """A retry of 10 started at QUEUED (and queued for a worker then), as start_operation leaves it."""
    values: dict[str, Any] = {
        "kind": OperationKind.RETRY,
        "status": OperationStatus.RUNNING,
        "total": 10,
        "started_at": QUEUED,
        "created_at": QUEUED - dt.timedelta(minutes=1),
        "heartbeat_at": heartbeat_at,
        "runner": runner,
        **fields,
    }
    return Operation.objects.create(**values)


def test_an_operation_no_worker_took_says_since_when_instead_of_running(operator: User) -> None:
    operation = started()

    with time_machine.travel(QUEUED + dt.timedelta(seconds=12), tick=False):
        page = client_for(operator).get(f"/operations/{operation.pk}/")
        fragment = client_for(operator).get(f"/operations/{operation.pk}/", headers=HX)
        listed = client_for(operator).get("/operations/")

    for response in (page, fragment):
        text = shown(response.content.decode())
        assert "Waiting for a worker since 09:30:05 (12 s)" in text
        assert "Running" not in text and "0% replayed" not in text
    assert 'data-testid="status">Waiting for a worker<' in page.content.decode()
    assert "Waiting for a worker" in shown(listed.content.decode())


def test_a_fresh_operation_sent_again_by_the_sweeper_still_waits_since_its_start() -> None:
    # The sweeper moves the heartbeat when it sends the task again; nothing was done yet.
    fresh = started(heartbeat_at=QUEUED + dt.timedelta(seconds=65))
    # One that made progress, resumed (or re-sent) later: since then.
    resumed = started(heartbeat_at=QUEUED + dt.timedelta(seconds=65), succeeded=4)

    assert fresh.waiting_for_worker_since == QUEUED
    assert resumed.waiting_for_worker_since == QUEUED + dt.timedelta(seconds=65)
    watch = watch_worker(fresh, now=QUEUED + dt.timedelta(seconds=70))
    assert watch is not None and watch.stale and watch.text.startswith("Waiting for a worker since 09:30:05 (70 s)")


def test_an_operation_waiting_past_the_stale_time_asks_whether_workers_run() -> None:
    operation = started(status=OperationStatus.CANARY, canary_size=2)

    watch = watch_worker(operation, now=QUEUED + dt.timedelta(seconds=75))

    assert watch is not None and watch.stale
    assert watch.text.startswith(
        "Waiting for a worker since 09:30:05 (75 s): no worker has taken it for over 60 s. Are the Celery workers"
    )


def test_a_running_operation_shows_its_heartbeat_age(operator: User) -> None:
    operation = started(runner="worker-1", heartbeat_at=QUEUED + dt.timedelta(seconds=30))

    with time_machine.travel(QUEUED + dt.timedelta(seconds=33), tick=False):
        page = client_for(operator).get(f"/operations/{operation.pk}/", headers=HX)

    text = shown(page.content.decode())
    assert "last heartbeat 3 s ago" in text
    assert "Waiting for a worker" not in text and "gone quiet" not in text
    assert 'data-testid="status">Running<' in page.content.decode()


def test_a_stale_heartbeat_says_the_worker_went_quiet(operator: User) -> None:
    operation = started(runner="worker-1", heartbeat_at=QUEUED)

    with time_machine.travel(QUEUED + dt.timedelta(seconds=95), tick=False):
        page = client_for(operator).get(f"/operations/{operation.pk}/")

    html = page.content.decode()
    assert re.search(r'class="warn-box worker"\s+role="alert"', html)
    assert "last heartbeat 95 s ago: its worker has gone quiet (stopped or stuck) for over 60 s" in shown(html)


def test_a_canary_between_two_looks_is_watching_not_waiting_for_a_worker() -> None:
    # The runner gives its worker back during the canary's wait and comes back in a couple of seconds.
    operation = started(
        status=OperationStatus.CANARY,
        canary_size=2,
        canary_until=QUEUED + dt.timedelta(seconds=60),
        heartbeat_at=QUEUED + dt.timedelta(seconds=20),
    )

    watch = watch_worker(operation, now=QUEUED + dt.timedelta(seconds=22))

    assert operation.waiting_for_worker_since is None
    assert operation.outcome == ("Canary", OperationStatus.CANARY)
    assert watch is not None and watch.text == "last heartbeat 2 s ago"


@pytest.mark.parametrize(
    "status", [OperationStatus.PLANNED, OperationStatus.PAUSED, OperationStatus.DONE, OperationStatus.CANCELLED]
)
def test_an_operation_no_worker_should_run_has_no_worker_line(status: str) -> None:
    operation = started(status=status)

    assert watch_worker(operation, now=QUEUED + dt.timedelta(seconds=5)) is None
    assert operation.waiting_for_worker_since is None


def test_the_api_says_since_when_it_waits_and_the_heartbeat_age(operator: User) -> None:
    waiting = started()
    held = started(runner="worker-1", heartbeat_at=QUEUED + dt.timedelta(seconds=7))
    client = api_client(token_for(operator))

    with time_machine.travel(QUEUED + dt.timedelta(seconds=12), tick=False):
        waiting_body = client.get(f"/api/v1/operations/{waiting.pk}/").json()
        held_body = client.get(f"/api/v1/operations/{held.pk}/").json()
        listed = {row["id"]: row for row in client.get("/api/v1/operations/").json()["results"]}

    assert dt.datetime.fromisoformat(waiting_body["waiting_for_worker_since"]) == QUEUED
    assert (waiting_body["heartbeat_age_seconds"], waiting_body["outcome"]) == (None, "Waiting for a worker")
    assert waiting_body["worker_note"] == "Waiting for a worker since 09:30:05 (12 s)"
    assert (held_body["waiting_for_worker_since"], held_body["heartbeat_age_seconds"]) == (None, 5)
    assert (held_body["worker_note"], held_body["outcome"]) == ("last heartbeat 5 s ago", "Running")
    assert listed[waiting.pk]["outcome"] == "Waiting for a worker"
    assert listed[held.pk]["heartbeat_age_seconds"] == 5


def test_an_operation_waiting_for_a_circuit_breaker_is_not_waiting_for_a_worker(operator: User) -> None:
    """Its task comes back by itself when the breaker probes: until then no worker is meant to hold it, and its page
    says what it waits for; once that time has passed and no worker took it, it waits for a worker since then."""
    probe_at = QUEUED + dt.timedelta(minutes=2)
    operation = started(
        succeeded=3,
        heartbeat_at=QUEUED + dt.timedelta(seconds=30),
        breaker_wait="circuit open for queue orders, probing at 09:32:05 UTC",
        breaker_wait_until=probe_at,
    )

    with time_machine.travel(QUEUED + dt.timedelta(seconds=100), tick=False):
        operation.refresh_from_db()
        assert operation.waiting_for_breaker
        assert operation.waiting_for_worker_since is None
        assert watch_worker(operation) is None
        assert operation.outcome[0] == "Waiting for a circuit breaker"
        text = shown(client_for(operator).get(f"/operations/{operation.pk}/").content.decode())
    assert "Waiting: circuit open for queue orders, probing at 09:32:05 UTC" in text
    assert "Waiting for a worker" not in text and "gone quiet" not in text

    with time_machine.travel(probe_at + dt.timedelta(seconds=90), tick=False):
        operation.refresh_from_db()
        assert not operation.waiting_for_breaker
        assert operation.waiting_for_worker_since == probe_at
        watch = watch_worker(operation)
        assert watch is not None and watch.stale
        assert watch.text.startswith("Waiting for a worker since 09:32:05 (90 s)")


def test_waiting_shows_no_time_left_and_what_was_done_so_far(operator: User) -> None:
    """Waiting for a worker or a breaker, how long is left cannot be told; a resumed operation that did some of its
    work shows how much, not "not started"."""
    operation = started(succeeded=4, rate="10/1s")
    with time_machine.travel(QUEUED + dt.timedelta(seconds=5), tick=False):
        text = shown(client_for(operator).get(f"/operations/{operation.pk}/").content.decode())
    assert "40% replayed" in text and "not started" not in text and "Time left" not in text

    waiting = started(succeeded=4, rate="10/1s", breaker_wait="circuit open", breaker_wait_until=QUEUED + HOUR)
    with time_machine.travel(QUEUED + dt.timedelta(seconds=5), tick=False):
        waiting.refresh_from_db()
        assert waiting.eta is None
