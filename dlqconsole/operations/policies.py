"""Automatic retries: schedule new dead letters that a RetryPolicy covers, and replay them when they fall due.

Scheduling runs from beat every few seconds instead of inside ingest, so the hot ingest path stays as it is: a
cursor walks the dead letters by id. Ids are handed out before commit, so a row with a lower id can appear after
a higher one; the cursor only moves past rows older than SETTLE (ingest commits a batch well within that), and the
younger ones are looked at again on the next run (a decision is idempotent).

Due dead letters are taken with SELECT ... FOR UPDATE SKIP LOCKED (on SQLite the IMMEDIATE transaction serialises
writers instead) and replayed by an ordinary retry operation, so they go through the same limiter, publisher,
outcome records and audit log as a person's retry. Like any retry, each goes back to the broker its dead letter came
from; a policy may cover the dead letters of one broker only.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections import Counter, defaultdict
from collections.abc import Sequence

from django.db import transaction
from django.utils import timezone

from dlqconsole.accounts.services import record_audit
from dlqconsole.brokers.models import Broker
from dlqconsole.deadletters.counters import CountedRow, count_status_change
from dlqconsole.deadletters.models import DeadLetter, DeadLetterStatus
from dlqconsole.operations.models import (
    ItemStatus,
    Operation,
    OperationItem,
    OperationKind,
    OperationStatus,
    RetryPolicy,
    SchedulerCursor,
)
from dlqconsole.operations.services import enqueue_run

logger = logging.getLogger(__name__)

CURSOR_NAME = "retry-policies"
SETTLE = dt.timedelta(seconds=30)


def matching_policy(
    policies: Sequence[RetryPolicy],
    *,
    source_queue: str,
    original_queue: str,
    failure_reason: str,
    pattern_id: int,
    broker_id: int | None = None,
) -> RetryPolicy | None:
    """The most specific enabled policy covering a dead letter (pattern, then queue, then broker, then reason)."""
    matches = [
        policy
        for policy in policies
        if (policy.broker_id is None or policy.broker_id == broker_id)
        and (not policy.queue or policy.queue in (source_queue, original_queue))
        and (not policy.failure_reason or policy.failure_reason == failure_reason)
        and (policy.pattern_id is None or policy.pattern_id == pattern_id)
    ]
    return max(matches, key=lambda policy: (policy.specificity, -policy.pk), default=None)


def schedule_new_dead_letters(*, now: dt.datetime | None = None, batch_size: int = 5000) -> int:
    """Give new parked dead letters that a policy covers a retry time; mark the ones out of attempts as exhausted.

    Permanent failures (the policy's permanent reasons) stay parked. Returns how many were scheduled.
    """
    now = now or timezone.now()
    with transaction.atomic():
        SchedulerCursor.objects.get_or_create(name=CURSOR_NAME)
        cursor = SchedulerCursor.objects.select_for_update(skip_locked=True).filter(name=CURSOR_NAME).first()
        if cursor is None:
            return 0  # another worker is at it right now
        rows = list(
            DeadLetter.objects.filter(pk__gt=cursor.position)
            .order_by("pk")
            .values_list("pk", "ingested_at")[:batch_size]
        )
        if not rows:
            return 0
        settled = now - SETTLE
        position = cursor.position
        for pk, ingested_at in rows:
            if ingested_at > settled:
                break
            position = pk
        scheduled = _schedule([pk for pk, _ in rows], now=now)
        if position != cursor.position:
            SchedulerCursor.objects.filter(pk=cursor.pk).update(position=position, updated_at=now)
    return scheduled


def _schedule(ids: list[int], *, now: dt.datetime) -> int:
    policies = list(RetryPolicy.objects.enabled())
    if not policies:
        return 0
    candidates = list(
        DeadLetter.objects.select_for_update(no_key=True)
        # A body cut at ingest cannot be replayed (the message would not be the one that died).
        .filter(
            pk__in=ids,
            status=DeadLetterStatus.PARKED,
            next_retry_at__isnull=True,
            retry_exhausted=False,
            body_truncated=False,
        )
        .order_by("pk")
        .values_list(
            "pk", "broker_id", "source_queue", "original_queue", "failure_reason", "pattern_id", "replay_count"
        )
    )
    due_at: dict[dt.datetime, list[int]] = defaultdict(list)
    exhausted: list[int] = []
    counted: list[CountedRow] = []
    for pk, broker_id, source_queue, original_queue, reason, pattern_id, replay_count in candidates:
        policy = matching_policy(
            policies,
            broker_id=broker_id,
            source_queue=source_queue,
            original_queue=original_queue,
            failure_reason=reason,
            pattern_id=pattern_id,
        )
        if policy is None or reason in policy.permanent_reasons:
            continue
        # replay_count travels with the message (our replay header), so it counts the attempts across boomerangs.
        if replay_count >= policy.max_attempts:
            exhausted.append(pk)
            continue
        due_at[now + policy.delay_for(replay_count)].append(pk)
        counted.append(CountedRow(broker_id, source_queue, pattern_id, reason, DeadLetterStatus.PARKED))
    for moment, pks in due_at.items():
        DeadLetter.objects.filter(pk__in=pks).update(
            status=DeadLetterStatus.SCHEDULED, next_retry_at=moment, status_changed_at=now
        )
    count_status_change(counted, to_status=DeadLetterStatus.SCHEDULED)
    if exhausted:
        DeadLetter.objects.filter(pk__in=exhausted).update(retry_exhausted=True)
    return len(counted)


def start_due_retries(*, now: dt.datetime | None = None, limit: int = 1000) -> list[Operation]:
    """Start a retry operation (one per policy) for the scheduled dead letters whose time has come."""
    now = now or timezone.now()
    with transaction.atomic():
        due = list(
            DeadLetter.objects.select_for_update(skip_locked=True, no_key=True)
            .filter(status=DeadLetterStatus.SCHEDULED, next_retry_at__lte=now)
            .order_by("next_retry_at")
            .values_list("pk", "broker_id", "source_queue", "original_queue", "failure_reason", "pattern_id")[:limit]
        )
        if not due:
            return []
        # Taken: no longer due, so another beat run cannot take them too; the operation replays them.
        DeadLetter.objects.filter(pk__in=[row[0] for row in due]).update(next_retry_at=None)
        policies = list(RetryPolicy.objects.all())
        groups: dict[RetryPolicy | None, list[int]] = defaultdict(list)
        broker_of: dict[int, int] = {}
        for pk, broker_id, source_queue, original_queue, reason, pattern_id in due:
            broker_of[pk] = broker_id
            policy = matching_policy(
                [policy for policy in policies if policy.enabled] or policies,
                broker_id=broker_id,
                source_queue=source_queue,
                original_queue=original_queue,
                failure_reason=reason,
                pattern_id=pattern_id,
            )
            groups[policy].append(pk)
        names = dict(Broker.objects.values_list("pk", "name"))
        operations = []
        for policy, pks in groups.items():
            brokers = Counter(names.get(broker_of[pk], str(broker_of[pk])) for pk in pks)
            operation = Operation.objects.create(
                kind=OperationKind.RETRY,
                filter={"ids": pks},
                rate=policy.rate if policy is not None else "",
                automatic=True,
                # Replays of a service that is still down come back; the policy's backoff deals with that.
                max_return_share=1.0,
                status=OperationStatus.RUNNING,
                started_at=now,
                heartbeat_at=now,
                total=len(pks),
                breakdown={"destination": {}, "queue": {}, "pattern": [], "brokers": dict(brokers.most_common())},
            )
            OperationItem.objects.bulk_create(
                OperationItem(operation=operation, dead_letter_id=pk, status=ItemStatus.PENDING) for pk in pks
            )
            record_audit(
                actor=None,
                action="operation.retry.start",
                target=f"operation:{operation.pk}",
                filter=operation.filter,
                count=len(pks),
                detail=f"automatic retry by policy {policy.name if policy else '(deleted)'}",
            )
            enqueue_run(operation)
            operations.append(operation)
    return operations
