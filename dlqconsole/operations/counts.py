"""Keep DeadLetterCount exact when operations change the status of dead letters (or delete them)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import NamedTuple

from dlqconsole.ingest.services import add_counts


class CountedRow(NamedTuple):
    """The columns of a dead letter that name its counter cell."""

    source_queue: str
    pattern_id: int
    failure_reason: str
    status: str


def count_status_change(rows: Iterable[CountedRow], *, to_status: str | None) -> None:
    """Move each row's count from its current status to `to_status` (None: the rows are deleted).

    Call it in the transaction that changes the rows, with the statuses they had before the change.
    """
    cells: Counter[tuple[str, int, str, str]] = Counter()
    for row in rows:
        if row.status == to_status:
            continue
        cells[(row.source_queue, row.pattern_id, row.failure_reason, row.status)] -= 1
        if to_status is not None:
            cells[(row.source_queue, row.pattern_id, row.failure_reason, to_status)] += 1
    add_counts([(queue, pattern, reason, status, delta) for (queue, pattern, reason, status), delta in cells.items()])
