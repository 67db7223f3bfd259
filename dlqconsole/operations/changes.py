"""Archive, restore and purge: the operations that change dead letters in the database and publish nothing."""

from __future__ import annotations

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from dlqconsole.deadletters.counters import COUNTED_FIELDS, CountedRow, count_status_change
from dlqconsole.deadletters.models import DeadLetter, DeadLetterStatus
from dlqconsole.operations.item_sql import BUSY, busy_elsewhere, delete_dead_letters, mark_items
from dlqconsole.operations.models import ItemStatus, Operation, OperationItem, OperationKind, eligible_statuses
from dlqconsole.operations.purged import record_purged
from dlqconsole.operations.run_state import RunState


class ChangeSteps(RunState):
    """The rounds of OperationRunner for an archive, a restore or a purge: a chunk changed in one transaction."""

    def _change_round(self, operation: Operation, limit: int) -> bool:
        items = self._next_items(limit)
        if not items:
            return False
        self._change_items(operation, items)
        return True

    def _change_items(self, operation: Operation, items: list[tuple[int, int, str]]) -> None:
        now = timezone.now()
        allowed = eligible_statuses(operation.kind, operation.filter.get("status"))
        with transaction.atomic():
            locked = list(
                OperationItem.objects.select_for_update()
                .filter(pk__in=[item[0] for item in items], status__in=[ItemStatus.PENDING, ItemStatus.IN_FLIGHT])
                .values_list("pk", "dead_letter_id")
            )
            letters = {
                row[0]: CountedRow(*row[1:])
                # A purge deletes, so it takes the full lock; the others leave the key alone (see TakeSteps._take).
                for row in DeadLetter.objects.select_for_update(no_key=operation.kind != OperationKind.PURGE)
                .filter(pk__in=[dead_letter_id for _, dead_letter_id in locked])
                .order_by("pk")
                .values_list("pk", *COUNTED_FIELDS)
            }
            busy = busy_elsewhere(list(letters), operation_id=self.operation_id)
            done: list[int] = []
            letter_ids: list[int] = []
            skipped: dict[int, str] = {}
            for item_pk, dead_letter_id in locked:
                row = letters.get(dead_letter_id)
                if row is None:
                    skipped[item_pk] = "the dead letter no longer exists"
                elif dead_letter_id in busy:
                    skipped[item_pk] = BUSY
                elif row.status not in allowed:
                    skipped[item_pk] = f"its status is now {row.status}"
                else:
                    done.append(item_pk)
                    letter_ids.append(dead_letter_id)
            rows = [letters[pk] for pk in letter_ids]
            if operation.kind == OperationKind.PURGE:
                # What it deletes is recorded in the same transaction: a chunk leaves both, or (rolled back) neither.
                record_purged(operation=operation, dead_letter_ids=letter_ids)
                delete_dead_letters(ids=letter_ids)
                count_status_change(rows, to_status=None)
            else:
                new_status = (
                    DeadLetterStatus.ARCHIVED if operation.kind == OperationKind.ARCHIVE else DeadLetterStatus.PARKED
                )
                DeadLetter.objects.filter(pk__in=letter_ids).update(
                    status=new_status, status_changed_at=now, next_retry_at=None
                )
                count_status_change(rows, to_status=new_status)
            OperationItem.objects.filter(pk__in=done).update(status=ItemStatus.DONE, error="")
            mark_items(skipped, status=ItemStatus.SKIPPED)
            Operation.objects.filter(pk=self.operation_id).update(
                succeeded=F("succeeded") + len(done), skipped=F("skipped") + len(skipped), heartbeat_at=now
            )
