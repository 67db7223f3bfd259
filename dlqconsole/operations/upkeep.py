"""Upkeep run by Celery beat: hand operations whose worker went quiet to a live one, delete archives kept past
their retention."""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from dlqconsole.accounts.services import record_audit
from dlqconsole.brokers.models import DEFAULT, Broker
from dlqconsole.deadletters.counters import COUNTED_FIELDS, CountedRow, count_status_change
from dlqconsole.deadletters.models import DeadLetter, DeadLetterStatus
from dlqconsole.operations.item_sql import delete_dead_letters
from dlqconsole.operations.models import Operation, OperationStatus
from dlqconsole.operations.services import enqueue_run

logger = logging.getLogger(__name__)


def requeue_stale_operations(*, now: dt.datetime | None = None) -> list[int]:
    """Hand every active operation whose worker went quiet (killed, or its task lost) to a live worker."""
    now = now or timezone.now()
    stale = (
        Operation.objects.stale(now=now, stale_after=dt.timedelta(seconds=settings.DLQ_OPERATION_STALE_SECONDS))
        .exclude(status=OperationStatus.CANARY, canary_until__gt=now)
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


def delete_expired_archives(*, now: dt.datetime | None = None, batch_size: int = 1000) -> int:
    """Delete dead letters archived longer than DLQ_ARCHIVE_RETENTION_DAYS, a batch per transaction. Each batch
    writes its audit row (its count and queues) in its own transaction, so a run killed midway leaves a record of
    every deletion it committed, and a batch that rolled back leaves neither."""
    now = now or timezone.now()
    days = settings.DLQ_ARCHIVE_RETENTION_DAYS
    cutoff = now - dt.timedelta(days=days)
    deleted = 0
    while True:
        with transaction.atomic():
            rows = list(
                DeadLetter.objects.select_for_update(skip_locked=True)
                .filter(status=DeadLetterStatus.ARCHIVED, status_changed_at__lt=cutoff)
                .order_by("pk")
                .values_list("pk", *COUNTED_FIELDS)[:batch_size]
            )
            if not rows:
                break
            delete_dead_letters(ids=[row[0] for row in rows])
            counted = [CountedRow(*row[1:]) for row in rows]
            count_status_change(counted, to_status=None)
            found: dict[str, Any] = {"status": [DeadLetterStatus.ARCHIVED]}
            brokers = sorted(
                Broker.objects.filter(pk__in={row.broker_id for row in counted}).values_list("name", flat=True)
            )
            if brokers != [DEFAULT]:
                found["broker"] = brokers
            found["queue"] = sorted({row.source_queue for row in counted})
            found["until"] = cutoff.isoformat()
            record_audit(
                actor=None,
                action="archive.retention",
                filter=found,
                count=len(rows),
                detail=f"deleted dead letters archived more than {days} days ago (ids {rows[0][0]} to {rows[-1][0]})",
            )
        deleted += len(rows)
    return deleted
