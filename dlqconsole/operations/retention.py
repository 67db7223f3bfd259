"""Retention: beat deletes what finished long ago (`operations.apply_retention`, every five minutes).

- Dead letters archived more than DLQ_ARCHIVE_RETENTION_DAYS ago, and replayed or moved more than
  DLQ_FINISHED_RETENTION_DAYS ago, counted from their status change. Parked, scheduled and failed ones are never
  touched, nor one that an unfinished operation (planned, canary, running, paused) holds as an item. A deleted dead
  letter's links (a boomerang's `previous`, an edited copy's `edited_from`) become empty; the per-status counters
  drop exactly what was deleted, while the arrival counts (charts, sparklines, pattern totals) stay: they count
  arrivals, whatever became of them since. Each batch is one transaction with its own audit row
  (`archive.retention`, `finished.retention`: statuses, count, queues, brokers, ids, cutoff), so a run cut short
  leaves a record of every batch it committed and none of one that rolled back.
- The item rows of operations finished more than DLQ_FINISHED_RETENTION_DAYS ago, purges included. The operation
  keeps its figures, filter, author and times; first its items are summed up into `items_summary` (what a cancel
  left untouched, the commonest errors of its failed messages) with one audit row (`operation.items.retention`),
  then they are deleted in batches, and `items_removed_at` says when the last went.

Pacing, so that ingest beside it slows by less than 10% (bench/retention.py). Retention and ingest hardly share a
lock (ingest writes parked counter cells and patterns, retention the cells of finished statuses; only a boomerang
arriving for a dead letter being deleted waits, for one batch), so what retention takes from ingest is CPU and
disk. Hence: batches of BATCH_SIZE (500) rows, each its own short transaction that selects by the partial index of
finished rows (`deadletter_finished_changed`) in the order they finished, with a keyset, skipping rows another
transaction holds; commits that do not wait for the disk (_commit_without_waiting); after each batch a pause of
REST (3) times as long as the batch took, so retention works at most a quarter of the time it runs; and a run stops
after RUN_SECONDS (four minutes), leaving the rest to the next one (beat runs it every five minutes, and one run at
a time holds an advisory lock). docs/performance.md has what bench/retention.py measured with these figures;
run it again before changing them.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, Exists, OuterRef, Q
from django.utils import timezone

from dlqconsole.accounts.services import record_audit
from dlqconsole.brokers.models import DEFAULT, Broker
from dlqconsole.deadletters.counters import COUNTED_FIELDS, CountedRow, count_status_change
from dlqconsole.deadletters.models import DeadLetter, DeadLetterStatus
from dlqconsole.operations.item_sql import delete_dead_letters, id_array
from dlqconsole.operations.models import FINISHED_STATUSES, ItemStatus, Operation, OperationItem

logger = logging.getLogger(__name__)

BATCH_SIZE = 500
# The pause after a batch, as a multiple of the time the batch took.
REST = 3.0
RUN_SECONDS = 240.0
# The commonest errors of an operation's failed messages its summary keeps.
SUMMARY_ERRORS = 10
# pg_try_advisory_lock's key: one retention run at a time.
LOCK_KEY = 0x646C7172  # "dlqr"


@dataclass(frozen=True)
class Pacing:
    """How a run paces itself (see the module docstring); tests pass a clock and a sleep of their own."""

    batch_size: int = BATCH_SIZE
    rest: float = REST
    seconds: float = RUN_SECONDS
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


class Budget:
    """A run's time: whether another batch may start, and the pause after each batch."""

    def __init__(self, pacing: Pacing) -> None:
        self.pacing = pacing
        self.deadline = pacing.clock() + pacing.seconds

        # A loop stopped for want of time, work left: the next run goes on.
        self.cut_short = False

    def go_on(self) -> bool:
        """Whether time is left for another batch (no: the run is cut short)."""
        if self.pacing.clock() >= self.deadline:
            self.cut_short = True
        return not self.cut_short

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Time the batch inside; after it, rest as long as it took (REST times), never past the deadline."""
        started = self.pacing.clock()
        yield
        ended = self.pacing.clock()
        pause = min((ended - started) * self.pacing.rest, self.deadline - ended)
        if pause > 0:
            self.pacing.sleep(pause)


@dataclass
class RetentionRun:
    """What one run deleted, and whether it got through everything due (not cut short by its time)."""

    dead_letters: Counter[str] = field(default_factory=Counter)
    items: int = 0
    operations: int = 0
    complete: bool = True
    # Another run held the lock: this one did nothing.
    skipped: bool = False


@dataclass(frozen=True)
class Rule:
    """Dead letters of `statuses` are deleted `days` after their status changed, each batch audited as `action`."""

    statuses: tuple[str, ...]
    days: int
    action: str
    words: str


def rules() -> list[Rule]:
    return [
        Rule((DeadLetterStatus.ARCHIVED,), settings.DLQ_ARCHIVE_RETENTION_DAYS, "archive.retention", "archived"),
        Rule(
            (DeadLetterStatus.MOVED, DeadLetterStatus.REPLAYED),
            settings.DLQ_FINISHED_RETENTION_DAYS,
            "finished.retention",
            "replayed or moved",
        ),
    ]


def apply_retention(*, now: dt.datetime | None = None, pacing: Pacing | None = None) -> RetentionRun:
    """Delete every dead letter and operation item past its retention, paced, until done or out of time."""
    now = now or timezone.now()
    budget = Budget(pacing or Pacing())
    run = RetentionRun()
    with _one_at_a_time() as alone:
        if not alone:
            logger.info("retention: another run is under way")
            run.skipped = True
            return run
        for rule in rules():
            run.dead_letters[rule.action] = delete_expired(rule=rule, now=now, budget=budget)
        run.operations, run.items = remove_expired_items(now=now, budget=budget)
        run.complete = not budget.cut_short
    if sum(run.dead_letters.values()) or run.items:
        logger.info(
            "retention: deleted %s dead letters and %s operation items%s",
            sum(run.dead_letters.values()),
            run.items,
            "" if run.complete else "; out of time, the next run goes on",
        )
    return run


def delete_expired(*, rule: Rule, now: dt.datetime, budget: Budget) -> int:
    """Delete the dead letters past `rule`'s retention, oldest status change first, a batch per transaction."""
    cutoff = now - dt.timedelta(days=rule.days)
    after: tuple[dt.datetime, int] | None = None
    deleted = 0
    while budget.go_on():
        with budget.batch(), transaction.atomic():
            _commit_without_waiting()
            rows = _take(rule, cutoff=cutoff, after=after, limit=budget.pacing.batch_size)
            if rows:
                _delete(rule, rows, cutoff=cutoff)
        if not rows:
            break
        # A keyset rather than the oldest again: rows held or locked elsewhere cost one look per run, not one per
        # batch.
        after = (rows[-1][1], rows[-1][0])
        deleted += len(rows)
    return deleted


def _take(rule: Rule, *, cutoff: dt.datetime, after: tuple[dt.datetime, int] | None, limit: int) -> list[Any]:
    """(pk, status_changed_at, *COUNTED_FIELDS) of the next batch past `after`, locked. Passed over: rows another
    transaction holds (the next run takes them), and dead letters an unfinished operation (planned, canary, running,
    paused) holds as an item, which it may still act on."""
    held = OperationItem.objects.filter(dead_letter_id=OuterRef("pk")).exclude(operation__status__in=FINISHED_STATUSES)
    rows = DeadLetter.objects.filter(status__in=rule.statuses, status_changed_at__lt=cutoff).exclude(Exists(held))
    if after is not None:
        # The >= lets the index bound the scan; the OR breaks ties of one status change (a chunk of an operation).
        rows = rows.filter(status_changed_at__gte=after[0]).filter(
            Q(status_changed_at__gt=after[0]) | Q(pk__gt=after[1])
        )
    return list(
        rows.select_for_update(skip_locked=True)
        .order_by("status_changed_at", "pk")
        .values_list("pk", "status_changed_at", *COUNTED_FIELDS)[:limit]
    )


def _delete(rule: Rule, rows: list[Any], *, cutoff: dt.datetime) -> None:
    ids = [row[0] for row in rows]
    delete_dead_letters(ids=ids)
    counted = [CountedRow(*row[2:]) for row in rows]
    count_status_change(counted, to_status=None)
    found: dict[str, Any] = {"status": sorted({row.status for row in counted})}
    brokers = sorted(Broker.objects.filter(pk__in={row.broker_id for row in counted}).values_list("name", flat=True))
    if brokers != [DEFAULT]:
        found["broker"] = brokers
    found["queue"] = sorted({row.source_queue for row in counted})
    # Not "until", which filters mean by arrival: this cutoff is on the time their status changed.
    found["status_changed_before"] = cutoff.isoformat()
    record_audit(
        actor=None,
        action=rule.action,
        filter=found,
        count=len(rows),
        detail=f"deleted dead letters {rule.words} more than {rule.days} days ago (ids {min(ids)} to {max(ids)}, "
        f"status changed {rows[0][1]:%Y-%m-%d %H:%M} to {rows[-1][1]:%Y-%m-%d %H:%M} UTC)",
    )


def remove_expired_items(*, now: dt.datetime, budget: Budget) -> tuple[int, int]:
    """Sum up, then delete, the item rows of operations finished more than DLQ_FINISHED_RETENTION_DAYS ago, oldest
    first. Returns (operations whose items all went, items deleted)."""
    cutoff = now - dt.timedelta(days=settings.DLQ_FINISHED_RETENTION_DAYS)
    expired = Operation.objects.filter(
        status__in=FINISHED_STATUSES, finished_at__lt=cutoff, items_removed_at__isnull=True
    ).order_by("finished_at", "pk")
    operations = items = 0
    while budget.go_on():
        operation = expired.first()
        if operation is None:
            break
        if operation.items_summary is None:
            with budget.batch():
                summarised = _summarise(operation, cutoff=cutoff)
            if not summarised:
                break  # another run summed it up meanwhile: the next run goes on
            continue
        with budget.batch(), transaction.atomic():
            _commit_without_waiting()
            batch = list(
                OperationItem.objects.filter(operation=operation)
                .order_by("pk")
                .values_list("pk", flat=True)[: budget.pacing.batch_size]
            )
            if batch:
                OperationItem.objects.filter(pk__in=id_array(batch)).delete()
            else:
                Operation.objects.filter(pk=operation.pk).update(items_removed_at=now)
        items += len(batch)
        operations += not batch
    return operations, items


def _summarise(operation: Operation, *, cutoff: dt.datetime) -> bool:
    """Keep what the operation's items say that its own figures do not, and audit the removal to come. Read
    before the transaction; written only if the operation is still finished, expired and not summed up."""
    items = OperationItem.objects.filter(operation=operation)
    statuses = dict(items.values_list("status").annotate(n=Count("pk")).order_by())
    not_attempted = items.filter(status=ItemStatus.SKIPPED, error__startswith="cancelled").count()
    errors = list(
        items.filter(status=ItemStatus.FAILED)
        .values_list("error")
        .annotate(n=Count("pk"))
        .order_by("-n", "error")[:SUMMARY_ERRORS]
    )
    summary = {
        "statuses": statuses,
        "not_attempted": not_attempted,
        "errors": [[error, n] for error, n in errors],
    }
    count = sum(statuses.values())
    with transaction.atomic():
        claimed = Operation.objects.filter(
            pk=operation.pk,
            status__in=FINISHED_STATUSES,
            finished_at__lt=cutoff,
            items_summary__isnull=True,
        ).update(items_summary=summary)
        if claimed:
            record_audit(
                actor=None,
                action="operation.items.retention",
                target=f"operation:{operation.pk}",
                count=count,
                detail=f"removing the {count:,} item rows of {operation}, finished "
                f"{operation.finished_at:%Y-%m-%d %H:%M} UTC, more than {settings.DLQ_FINISHED_RETENTION_DAYS} "
                "days ago; its figures stay",
            )
    return bool(claimed)


def _commit_without_waiting() -> None:
    """Let this transaction's commit return before its WAL reaches the disk, so that retention's commits do not
    queue for the disk with ingest's. A crash may lose the last batches committed so: their rows come back with
    their counts and without their audit rows (one transaction), and the next run deletes them again."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL synchronous_commit TO OFF")


@contextmanager
def _one_at_a_time() -> Iterator[bool]:
    """Whether this run is the only one (a session advisory lock on PostgreSQL; SQLite serialises writers)."""
    if connection.vendor != "postgresql":
        yield True
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [LOCK_KEY])
        alone = bool(cursor.fetchone()[0])
    try:
        yield alone
    finally:
        if alone:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [LOCK_KEY])
