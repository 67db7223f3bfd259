"""What an active operation's page says of its worker: that none has taken it yet, since when, or how long ago its
worker last sent a heartbeat, and whether that is so long that the sweeper hands the operation to another worker
(operations/upkeep.py, after DLQ_OPERATION_STALE_SECONDS)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.conf import settings
from django.utils import timezone

from dlqconsole.operations.models import ACTIVE_STATUSES, Operation


@dataclass(frozen=True)
class WorkerWatch:
    # Waiting for a worker: since when (its start, its resume, or the sweeper's last re-send) and for how long.
    waiting_since: dt.datetime | None
    waiting_seconds: int | None
    # Held by a worker (or between two stints of one, as a canary's wait is): how long ago it last wrote.
    heartbeat_age_seconds: int | None
    # Longer than DLQ_OPERATION_STALE_SECONDS: no worker took it, or its worker went quiet.
    stale: bool
    stale_after: int

    @property
    def text(self) -> str:
        """The page's line: "Waiting for a worker since 09:30:05 (12 s)", "last heartbeat 3 s ago"..."""
        if self.waiting_since is not None:
            since = f"{timezone.localtime(self.waiting_since):%H:%M:%S}"
            text = f"Waiting for a worker since {since} ({self.waiting_seconds:,} s)"
            if self.stale:
                text += (
                    f": no worker has taken it for over {self.stale_after:,} s. Are the Celery workers running and "
                    "reading their queue? The sweeper sends it again while none does."
                )
            return text
        text = f"last heartbeat {self.heartbeat_age_seconds:,} s ago"
        if self.stale:
            text += (
                f": its worker has gone quiet (stopped or stuck) for over {self.stale_after:,} s; the sweeper hands "
                "the operation to another worker"
            )
        return text


def watch_worker(operation: Operation, *, now: dt.datetime | None = None) -> WorkerWatch | None:
    """What its page says of its worker, for an operation a worker should be running (canary or running); None
    for the others."""
    if operation.status not in ACTIVE_STATUSES or operation.started_at is None or operation.waiting_for_breaker:
        # Waiting for a circuit breaker, no worker holds it by design: its page says what it waits for instead.
        return None
    now = now or timezone.now()
    stale_after = int(settings.DLQ_OPERATION_STALE_SECONDS)
    since = operation.waiting_for_worker_since
    if since is not None:
        waited = max(0, int((now - since).total_seconds()))
        return WorkerWatch(
            waiting_since=since,
            waiting_seconds=waited,
            heartbeat_age_seconds=None,
            stale=waited > stale_after,
            stale_after=stale_after,
        )
    if operation.heartbeat_at is None:
        return None
    age = max(0, int((now - operation.heartbeat_at).total_seconds()))
    return WorkerWatch(
        waiting_since=None,
        waiting_seconds=None,
        heartbeat_age_seconds=age,
        stale=age > stale_after,
        stale_after=stale_after,
    )
