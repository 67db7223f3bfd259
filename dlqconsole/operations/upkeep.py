"""Upkeep run by Celery beat: hand operations whose worker went quiet to a live one; delete archives kept past
their retention at once (beat runs the whole retention, paced: operations/retention.py)."""

from __future__ import annotations

import datetime as dt
import logging
import math

from django.conf import settings
from django.utils import timezone

from dlqconsole.deadletters.models import DeadLetterStatus
from dlqconsole.operations import retention
from dlqconsole.operations.models import Operation, OperationStatus
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


def delete_expired_archives(*, now: dt.datetime | None = None, batch_size: int = retention.BATCH_SIZE) -> int:
    """Delete the dead letters archived longer than DLQ_ARCHIVE_RETENTION_DAYS, a batch per transaction with its
    audit row, without retention's pauses or time limit (operations/retention.py runs this rule and the others,
    paced); returns how many."""
    archived = next(rule for rule in retention.rules() if rule.statuses == (DeadLetterStatus.ARCHIVED,))
    pacing = retention.Pacing(batch_size=batch_size, rest=0.0, seconds=math.inf)
    return retention.delete_expired(rule=archived, now=now or timezone.now(), budget=retention.Budget(pacing))
