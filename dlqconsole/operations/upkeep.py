"""Upkeep run by Celery beat: hand operations whose worker went quiet to a live one; count what came back of the
operations no worker runs; delete archives kept past their retention at once (beat runs the whole retention, paced:
operations/retention.py)."""

from __future__ import annotations

import datetime as dt
import logging
import math

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from dlqconsole.deadletters.models import DeadLetterStatus
from dlqconsole.operations import retention
from dlqconsole.operations.canary import CAME_BACK_WATCH, refresh_came_back
from dlqconsole.operations.models import (
    ACTIVE_STATUSES,
    FINISHED_STATUSES,
    PUBLISHING_KINDS,
    Operation,
    OperationStatus,
)
from dlqconsole.operations.services import enqueue_run

logger = logging.getLogger(__name__)


def requeue_stale_operations(*, now: dt.datetime | None = None) -> list[int]:
    """Hand every active operation whose worker went quiet (killed, or its task lost) to a live worker."""
    now = now or timezone.now()
    stale = (
        Operation.objects.stale(now=now, stale_after=dt.timedelta(seconds=settings.DLQ_OPERATION_STALE_SECONDS))
        .exclude(status=OperationStatus.CANARY, canary_until__gt=now)
        # Waiting for a circuit breaker: its task comes back by itself when the breaker probes.
        .exclude(breaker_wait_until__gt=now)
        .order_by("pk")
    )
    requeued = []
    for operation in stale:
        # Take the claim away from the silent worker and start the clock again, so that one task is queued per
        # stale period (not one per sweep while it waits behind other work) and a worker that only stalled finds
        # on its next heartbeat that the operation is no longer its own.
        handed = stale.filter(pk=operation.pk).update(runner="", heartbeat_at=now)
        if handed:
            logger.info("operation %s has no live worker; requeueing it", operation.pk)
            enqueue_run(operation)
            requeued.append(operation.pk)
    return requeued


# The sweep counts what came back of operations finished this recently (their pages and the API count on for a day,
# canary.CAME_BACK_WATCH): the operations list, /metrics and the alert rules then see boomerangs that arrived after a
# pause, a cancel or the end, without anyone opening the page.
SWEEP_CAME_BACK_FOR = dt.timedelta(hours=1)


def recount_came_back(*, now: dt.datetime | None = None) -> list[int]:
    """Count again what came back of the publishing operations no worker runs: ones paused within CAME_BACK_WATCH,
    ones waiting for a worker, and ones finished within SWEEP_CAME_BACK_FOR; the ids whose figures changed."""
    now = now or timezone.now()
    stopped = (
        Operation.objects.filter(kind__in=PUBLISHING_KINDS, started_at__isnull=False, items_removed_at__isnull=True)
        .filter(
            # Paused in the last day (its worker's last heartbeat): one paused for longer has been looked at.
            Q(status=OperationStatus.PAUSED, heartbeat_at__gte=now - CAME_BACK_WATCH)
            | Q(status__in=ACTIVE_STATUSES, runner="")
            | Q(status__in=FINISHED_STATUSES, finished_at__gte=now - SWEEP_CAME_BACK_FOR)
        )
        .order_by("pk")
    )
    return [operation.pk for operation in stopped if refresh_came_back(operation=operation, now=now)]


def delete_expired_archives(*, now: dt.datetime | None = None, batch_size: int = retention.BATCH_SIZE) -> int:
    """Delete the dead letters archived longer than DLQ_ARCHIVE_RETENTION_DAYS, a batch per transaction with its
    audit row, without retention's pauses or time limit (operations/retention.py runs this rule and the others,
    paced); returns how many."""
    archived = next(rule for rule in retention.rules() if rule.statuses == (DeadLetterStatus.ARCHIVED,))
    pacing = retention.Pacing(batch_size=batch_size, rest=0.0, seconds=math.inf)
    return retention.delete_expired(rule=archived, now=now or timezone.now(), budget=retention.Budget(pacing))
