"""The record of a retry or move (see runner.py): what each publish came to, on the items, the dead letters, the
counters and the operation. (The circuit breakers of the destinations are breaking.py's.)"""

from __future__ import annotations

import datetime as dt
from collections.abc import Hashable
from typing import Any

from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from dlqconsole.core.publish import CONFIRMED, NACKED, NOT_SENT, RETURNED, UNSENDABLE, Outcome
from dlqconsole.deadletters.counters import COUNTED_FIELDS, CountedRow, count_status_change
from dlqconsole.deadletters.models import DeadLetter, DeadLetterStatus
from dlqconsole.operations.item_sql import id_array, record_items
from dlqconsole.operations.models import ItemStatus, Operation, OperationItem
from dlqconsole.operations.pipeline import HELD, Claimed
from dlqconsole.operations.run_state import RunState
from dlqconsole.operations.taking import FAILABLE_STATUSES


class RecordSteps(RunState):
    """The record of OperationRunner (the last of the steps runner.py's docstring describes)."""

    def _record_now(self, claimed: list[Claimed], *, outcomes: dict[Hashable, Outcome], publish_error: str) -> None:
        self.recorders[0].submit(self._record, claimed, outcomes, publish_error).result()

    def _record(self, claimed: list[Claimed], outcomes: dict[Hashable, Outcome], publish_error: str) -> None:
        now = timezone.now()
        new_status = self.new_status
        rows: list[tuple[int, str, dt.datetime | None, str, str]] = []
        outcome_of: dict[int, str] = {}
        unsent: list[int] = []
        held: list[int] = []
        uncertain: list[int] = []
        last_error = ""
        for entry in claimed:
            outcome = outcomes.get(entry.letter.pk) or Outcome(entry.letter.pk, NOT_SENT, publish_error)
            moment = dt.datetime.fromtimestamp(outcome.published_at, tz=dt.UTC) if outcome.published_at else None
            if outcome.status == CONFIRMED:
                rows.append((entry.item_pk, ItemStatus.PUBLISHED, moment, str(entry.destination), ""))
                outcome_of[entry.letter.pk] = new_status
            elif outcome.status in (RETURNED, NACKED, UNSENDABLE):
                rows.append((entry.item_pk, ItemStatus.FAILED, moment, str(entry.destination), outcome.error[:2000]))
                outcome_of[entry.letter.pk] = DeadLetterStatus.FAILED
                last_error = outcome.error
            elif outcome.status == NOT_SENT:
                unsent.append(entry.item_pk)
            elif outcome.status == HELD:
                held.append(entry.item_pk)
                last_error = last_error or outcome.error
            else:
                uncertain.append(entry.item_pk)
        with transaction.atomic():
            if connection.vendor == "postgresql":
                # This commit need not wait for the disk: if PostgreSQL itself crashed before writing it, the items
                # would still be in flight (their take was committed durably) and would be published again and
                # counted as duplicates, as after a killed worker. The take is never relaxed like this.
                with connection.cursor() as cursor:
                    cursor.execute("SET LOCAL synchronous_commit TO off")
            # The statuses and patterns as they are now (a policy may have scheduled one meanwhile, a merge moved
            # it to another pattern): the counters move from there.
            current = {
                row[0]: CountedRow(*row[1:])
                for row in DeadLetter.objects.select_for_update(no_key=True)
                .filter(pk__in=id_array(list(outcome_of)))
                .order_by("pk")
                .values_list("pk", *COUNTED_FIELDS)
            }
            record_items(rows)
            for status in (new_status, DeadLetterStatus.FAILED):
                ids = [
                    pk
                    for pk, outcome in outcome_of.items()
                    if outcome == status
                    and pk in current
                    and (status != DeadLetterStatus.FAILED or current[pk].status in FAILABLE_STATUSES)
                ]
                if not ids:
                    continue
                changes: dict[str, Any] = {"status": status, "status_changed_at": now, "next_retry_at": None}
                if status == new_status:
                    changes["replay_count"] = F("replay_count") + 1
                DeadLetter.objects.filter(pk__in=id_array(ids)).update(**changes)
                count_status_change([current[pk] for pk in ids], to_status=status)
            # Never sent: back to pending, as if never taken. (Held back ones too: their broker cannot be reached.)
            if unsent or held:
                OperationItem.objects.filter(pk__in=id_array(unsent + held)).update(
                    status=ItemStatus.PENDING, attempts=F("attempts") - 1
                )
            succeeded = sum(1 for outcome in outcome_of.values() if outcome == new_status)
            Operation.objects.filter(pk=self.operation_id).update(
                succeeded=F("succeeded") + succeeded,
                failed=F("failed") + len(outcome_of) - succeeded,
                in_flight=len(uncertain),
                last_error=(publish_error or last_error or F("last_error")),
                heartbeat_at=now,
            )
        # Unsent items are read again next; held back ones are passed over until their broker's wait is over.
        with self.cursor_lock:
            if unsent:
                self.cursor = min(self.cursor, min(unsent) - 1)
            if uncertain:
                self.look_for_in_flight = True

    def _count_outcomes(self, outcomes: list[Outcome], *, broker: str) -> None:
        """Count the confirms of this run; a confirm from a broker shows it reachable again."""
        for outcome in outcomes:
            if outcome.status == CONFIRMED:
                self.confirmed += 1
                self.connection_failures.pop(broker, None)
