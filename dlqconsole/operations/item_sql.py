"""The SQL a run uses on many operation items and dead letters at once, and the queries the services share with it:
who else has a dead letter in flight, which replays came back, settling a cancel, deleting for good."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from django.db import connection, transaction
from django.db.models import Case, Count, Exists, F, Min, OuterRef, Value, When
from django.db.models.expressions import RawSQL
from django.db.models.functions import Coalesce
from django.utils import timezone

from dlqconsole.deadletters.models import (
    DeadLetter,
    DeadLetterQuerySet,
    DeadLetterStatus,
    DeathReason,
    FailureReason,
)
from dlqconsole.operations.models import ItemStatus, Operation, OperationItem

# Why an item is skipped when busy_elsewhere finds its dead letter.
BUSY = "another operation is publishing it right now"


def id_array(ids: list[int]) -> Any:
    """A value for `pk__in`: on PostgreSQL one array parameter rather than a placeholder per id. psycopg parses
    every placeholder of a statement on the client, which at a thousand ids costs more than running it."""
    if connection.vendor == "postgresql":
        return RawSQL("SELECT unnest(%s::bigint[])", (pg_array(ids),))
    return list(ids)


def pg_array(values: list[Any]) -> str:
    """A PostgreSQL array literal, built here because psycopg dumps Python lists element by element in Python."""
    items = []
    for value in values:
        if value is None:
            items.append("NULL")
        elif isinstance(value, int):
            items.append(str(value))
        else:
            text = value.isoformat() if isinstance(value, dt.datetime) else str(value)
            items.append('"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"')
    return "{" + ",".join(items) + "}"


def busy_elsewhere(dead_letter_ids: list[int], *, operation_id: int) -> set[int]:
    """Dead letters another operation has in flight. Call it holding their row locks: a take that committed before
    we got them is visible, and none can commit while we hold them."""
    return set(
        OperationItem.objects.filter(dead_letter_id__in=id_array(dead_letter_ids), status=ItemStatus.IN_FLIGHT)
        .exclude(operation_id=operation_id)
        .values_list("dead_letter_id", flat=True)
    )


@dataclass(frozen=True)
class CameBack:
    """The dead letters of an operation that came back after their replay, each counted once, by why their first
    boomerang died ({reason: count}): the broker's death reason ("rejected", "maxlen", "expired"...), or, for one
    that carries none (an application published it to the dead-letter queue itself), its failure reason."""

    reasons: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, operation: Operation) -> CameBack:
        """As last counted on the operation's row (by its worker, its page, its API or the sweep)."""
        return cls({str(reason): int(count) for reason, count in (operation.returned_reasons or {}).items()})

    @property
    def count(self) -> int:
        return sum(self.reasons.values())

    @property
    def rows(self) -> list[tuple[str, str, int]]:
        """(reason, its name in words, count), commonest first: ("maxlen", "queue overflow", 2)."""
        named = [(reason, reason_words(reason), count) for reason, count in self.reasons.items() if count]
        return sorted(named, key=lambda row: (-row[2], row[1].lower()))

    @property
    def words(self) -> str:
        """Why they came back, in words: "3 rejected, 2 queue overflow"."""
        return ", ".join(f"{count:,} {words}" for _, words, count in self.rows)


# The broker's death reasons as a sentence says them ("5 came back: 3 rejected, 2 queue overflow").
DEATH_WORDS: dict[str, str] = {
    DeathReason.REJECTED: "rejected",
    DeathReason.EXPIRED: "expired (TTL)",
    DeathReason.MAXLEN: "queue overflow",
    DeathReason.DELIVERY_LIMIT: "delivery limit reached",
}


def reason_words(reason: str) -> str:
    """Why a boomerang died, as a sentence says it: "rejected", "queue overflow", "expired (TTL)"; a failure reason
    (for one without a death reason) by its label: "internal error"."""
    if reason in DEATH_WORDS:
        return DEATH_WORDS[reason]
    try:
        label = str(FailureReason(reason).label)
    except ValueError:
        return reason  # a reason this version does not know, as stored
    return label[:1].lower() + label[1:]


# The key a boomerang is counted under: its death reason, else (none from the broker) its failure reason.
WHY_IT_DIED = Case(When(death_reason=DeathReason.UNKNOWN, then=F("failure_reason")), default=F("death_reason"))


def boomerangs(*, operation: Operation) -> DeadLetterQuerySet:
    """The first boomerang of each dead letter this operation replayed that died again, whatever the boomerang's
    own status became since (retried, archived...), and whatever the operation's (paused, cancelled, done).

    Boomerangs are new arrivals linked to an earlier record (ingest links them through `previous`). Naming every
    status lets the (status, ingested_at) index find what arrived since the start, a range per status; the
    operation's items are reached through their (operation, dead letter) key. PostgreSQL drives the semi-join
    from whichever side is smaller: the arrivals since the start, or the items of a small operation (each then
    probes the index of `previous`)."""
    assert operation.started_at is not None
    since = DeadLetter.objects.filter(
        status__in=DeadLetterStatus.values, ingested_at__gte=operation.started_at, previous__isnull=False
    )
    # In flight counts too: one that came back was published, even if its confirm is not recorded yet.
    ours = OperationItem.objects.filter(
        operation_id=operation.pk,
        dead_letter_id=OuterRef("previous_id"),
        status__in=[ItemStatus.PUBLISHED, ItemStatus.IN_FLIGHT],
    )
    # A message published twice (its worker died before recording the confirm), or a forged copy pointing at it,
    # may come back many times: each dead letter is counted once, by its first boomerang. A grouping, not a test of
    # each boomerang against the earlier ones, so that the cost grows with the boomerangs, never with their square.
    firsts = since.filter(Exists(ours)).order_by().values("previous_id").annotate(first=Min("pk")).values("first")
    return DeadLetter.objects.filter(pk__in=firsts)


def count_came_back(*, operation: Operation) -> CameBack:
    """What came back of this operation's replays, and why (see boomerangs)."""
    if operation.started_at is None:
        return CameBack()
    rows = (
        boomerangs(operation=operation).order_by().annotate(why=WHY_IT_DIED).values("why").annotate(count=Count("pk"))
    )
    return CameBack({str(row["why"]): int(row["count"]) for row in rows})


def count_returned(*, operation: Operation) -> int:
    """Dead letters of this operation that came back after their replay (each counted once)."""
    return count_came_back(operation=operation).count


def finalize_cancelled(*, operation: Operation) -> None:
    """Settle what a cancelled operation left: pending items and in-flight ones never confirmed are skipped (their
    dead letters never changed). Only call it when no worker is publishing the operation."""
    now = timezone.now()
    with transaction.atomic():
        pending = OperationItem.objects.filter(operation=operation, status=ItemStatus.PENDING).update(
            status=ItemStatus.SKIPPED, error="cancelled"
        )
        in_flight = OperationItem.objects.filter(operation=operation, status=ItemStatus.IN_FLIGHT).update(
            status=ItemStatus.SKIPPED, error="cancelled; it may have been published before its worker stopped"
        )
        Operation.objects.filter(pk=operation.pk).update(
            skipped=F("skipped") + pending + in_flight,
            in_flight=0,
            finished_at=Coalesce("finished_at", Value(now)),
        )


def delete_dead_letters(*, ids: list[int]) -> None:
    """Delete dead letters for good (the caller adjusts the counters). Links to them are cleared; operation items
    keep the id as the record of what was deleted."""
    if not ids:
        return
    DeadLetter.objects.filter(previous_id__in=ids).update(previous=None)
    DeadLetter.objects.filter(edited_from_id__in=ids).update(edited_from=None)
    table = connection.ops.quote_name(DeadLetter._meta.db_table)
    with connection.cursor() as cursor:
        for start in range(0, len(ids), 1000):
            chunk = ids[start : start + 1000]
            cursor.execute(f"DELETE FROM {table} WHERE id IN ({', '.join(['%s'] * len(chunk))})", chunk)


def record_items(rows: list[tuple[int, str, dt.datetime | None, str, str]]) -> None:
    """Write (pk, status, published_at, destination, error) of many items, a statement per thousand.

    Each item has its own publish time, so one UPDATE per value will not do, and Django's bulk_update builds a
    CASE per column with a branch per row, which costs seconds per thousand rows. UPDATE ... FROM a VALUES list
    does the same in milliseconds (PostgreSQL, and SQLite 3.33 or newer).
    """
    table = connection.ops.quote_name(OperationItem._meta.db_table)
    if connection.vendor == "postgresql" and rows:
        # Five array parameters instead of five placeholders per row (see id_array).
        columns = [pg_array(list(column)) for column in zip(*rows, strict=True)]
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {table} SET status = changed.status, published_at = changed.published_at, "
                "destination = changed.destination, error = changed.error "
                "FROM unnest(%s::bigint[], %s::text[], %s::timestamptz[], %s::text[], %s::text[]) "
                f"AS changed (id, status, published_at, destination, error) WHERE {table}.id = changed.id",
                columns,
            )
        return
    for start in range(0, len(rows), 1000):
        chunk = rows[start : start + 1000]
        params: list[Any] = []
        for pk, status, published_at, destination, error in chunk:
            params += [pk, status, connection.ops.adapt_datetimefield_value(published_at), destination, error]
        values = ", ".join(["(%s, %s, %s, %s, %s)"] * len(chunk))
        with connection.cursor() as cursor:
            cursor.execute(
                f"WITH changed (id, status, published_at, destination, error) AS (VALUES {values}) "
                f"UPDATE {table} SET status = changed.status, published_at = changed.published_at, "
                f"destination = changed.destination, error = changed.error FROM changed WHERE {table}.id = changed.id",
                params,
            )


def mark_items(errors: dict[int, str], *, status: str, destinations: dict[int, str] | None = None) -> int:
    """Set items still open to `status` with their own error text (grouped, since most share one); how many."""
    grouped: dict[tuple[str, str], list[int]] = defaultdict(list)
    for pk, error in errors.items():
        grouped[(error[:2000], (destinations or {}).get(pk, ""))].append(pk)
    changed = 0
    for (error, destination), pks in grouped.items():
        changed += OperationItem.objects.filter(
            pk__in=id_array(pks), status__in=[ItemStatus.PENDING, ItemStatus.IN_FLIGHT]
        ).update(status=status, error=error, destination=destination)
    return changed


def mark_in_flight(pks: list[int], *, was: str) -> set[int]:
    """Mark items in flight (one more attempt) if their status is still `was`; the ones marked."""
    if not pks:
        return set()
    table = connection.ops.quote_name(OperationItem._meta.db_table)
    params: list[Any]
    if connection.vendor == "postgresql":
        where, params = "id IN (SELECT unnest(%s::bigint[]))", [pg_array(pks)]
    else:
        where, params = f"id IN ({', '.join(['%s'] * len(pks))})", list(pks)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET status = %s, attempts = attempts + 1 WHERE {where} AND status = %s RETURNING id",
            [ItemStatus.IN_FLIGHT, *params, was],
        )
        return {row[0] for row in cursor.fetchall()}
