"""What a purge deleted: a PurgedDeadLetter row per dead letter, written by the run loop in the transaction that
deletes them, and read back as CSV from the operation page.

The rows hang on the purge's audit row (its start, `operation.purge.start`), so they live exactly as long as the
audit log remembers the purge: the audit retention deletes them with it (accounts.services).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.accounts.services import record_audit
from dlqconsole.deadletters.export_lines import FORMULA_START
from dlqconsole.deadletters.models import DeadLetter
from dlqconsole.operations.models import Operation, OperationKind, PurgedDeadLetter

COLUMNS = (
    "dead_letter_id",
    "message_id",
    "dedupe_key",
    "broker_name",
    "source_queue",
    "pattern_id",
    "pattern_template",
    "status",
    "ingested_at",
    "purged_at",
)
CHUNK = 1000
# Actions of the audit row a purge's records hang on: its start, or the row written when that was gone already.
RECORD_ACTIONS = ("operation.purge.start", "operation.purge.records")


def record_purged(*, operation: Operation, dead_letter_ids: list[int]) -> None:
    """Write what these dead letters were, just before the caller deletes them in the same transaction (their rows
    are locked by then)."""
    if not dead_letter_ids:
        return
    entry_id = _audit_entry_id(operation)
    rows = (
        DeadLetter.objects.filter(pk__in=dead_letter_ids)
        .order_by("pk")
        .values_list(
            "pk",
            "message_id",
            "dedupe_key",
            "broker__name",
            "source_queue",
            "pattern_id",
            "status",
            "ingested_at",
            "pattern__template",
        )
    )
    PurgedDeadLetter.objects.bulk_create(
        [
            PurgedDeadLetter(
                operation_id=operation.pk,
                audit_entry_id=entry_id,
                dead_letter_id=pk,
                message_id=message_id,
                dedupe_key=dedupe_key,
                broker_name=broker_name,
                source_queue=source_queue,
                pattern_id=pattern_id,
                pattern_template=template or "",
                status=status,
                ingested_at=ingested_at,
            )
            for pk, message_id, dedupe_key, broker_name, source_queue, pattern_id, status, ingested_at, template in rows
        ],
        batch_size=CHUNK,
    )


def _audit_entry_id(operation: Operation) -> int:
    """The purge's start row, looked for among the rows written since it started (an index range, not a scan of
    the audit log). A purge whose start row is gone (one running longer than the audit retention) gets a row of
    its own, so what it deletes is still recorded and still expires."""
    found = AuditEntry.objects.filter(target=f"operation:{operation.pk}", action__in=RECORD_ACTIONS)
    if operation.started_at is not None:
        found = found.filter(created_at__gte=operation.started_at)
    entry_id = found.order_by("created_at", "pk").values_list("pk", flat=True).first()
    if entry_id is not None:
        return entry_id
    return record_audit(
        actor=None,
        action="operation.purge.records",
        target=f"operation:{operation.pk}",
        filter=operation.filter,
        detail="the purge's start is no longer in the audit log; the dead letters it deletes from now on are "
        "listed with this row",
    ).pk


def has_record(operation: Operation) -> bool:
    return operation.kind == OperationKind.PURGE and PurgedDeadLetter.objects.filter(operation=operation).exists()


def csv_lines(operation: Operation) -> Iterator[str]:
    """The purge's records as CSV, in the order they were deleted, read in keyset pages so memory stays flat."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(COLUMNS)
    yield _flush(buffer)
    found = PurgedDeadLetter.objects.filter(operation=operation).order_by("pk")
    last = 0
    while rows := list(found.filter(pk__gt=last).values_list("pk", *COLUMNS)[:CHUNK]):
        for row in rows:
            writer.writerow([_cell(value) for value in row[1:]])
        last = rows[-1][0]
        yield _flush(buffer)


def _flush(buffer: io.StringIO) -> str:
    text = buffer.getvalue()
    buffer.seek(0)
    buffer.truncate()
    return text


def _cell(value: object) -> str:
    """A cell as text; one a spreadsheet would run as a formula (dead letters carry text from anywhere) starts with
    an apostrophe, as in the messages export."""
    if value is None:
        return ""
    if hasattr(value, "isoformat"):
        return str(value.isoformat())
    text = str(value)
    return "'" + text if isinstance(value, str) and text.startswith(FORMULA_START) else text
