"""Dead letters for the grouping, pattern and triage tests, made as production makes them (parse_envelope, then
ingest_batch), and a check that the counters match the rows."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from dlqconsole.deadletters.grouping.rules import forget_rules
from dlqconsole.deadletters.models import DeadLetter, DeadLetterCount, FailurePattern
from dlqconsole.ingest.envelope import ParsedDeadLetter
from tests.factories import EnvelopeFactory, store

_serial = itertools.count(1)


def make_letter(
    message: str,
    *,
    error_type: str = "",
    stack_trace: str = "",
    queue: str = "orders",
    headers: dict[str, Any] | None = None,
) -> ParsedDeadLetter:
    """A dead letter as the grouping sees it: only its error (type and stack trace when given) set."""
    return EnvelopeFactory.build(
        error=message,
        error_type=error_type,
        stack_trace=stack_trace,
        queue=queue,
        routing_key=f"{queue}.created",
        host=None,
        version=None,
        headers=headers or {},
    )


Ingest = Callable[..., list[DeadLetter]]


@pytest.fixture(autouse=True)
def fresh_rules() -> None:
    """Ingest reads the rules at most once a second per process; each test starts from the database's."""
    forget_rules()


@pytest.fixture
def ingest(db: None) -> Ingest:
    """Ingest messages (strings, or make_letter keyword dicts) as one batch; returns their stored rows."""

    def run(*messages: str | dict[str, Any]) -> list[DeadLetter]:
        return store(
            *(make_letter(message) if isinstance(message, str) else make_letter(**message) for message in messages)
        )

    return run


def assert_counts_exact() -> None:
    """DeadLetterCount holds exactly the rows' (queue, pattern, reason, status) tallies, and only surviving
    patterns hold dead letters."""
    actual = Counter(
        DeadLetter.objects.values_list("source_queue", "pattern_id", "failure_reason", "status").iterator()
    )
    counted = {
        (cell.source_queue, cell.pattern_id, cell.failure_reason, cell.status): cell.count
        for cell in DeadLetterCount.objects.all()
        if cell.count
    }
    assert counted == dict(actual)
    merged = set(FailurePattern.objects.filter(merged_into__isnull=False).values_list("pk", flat=True))
    assert not merged & {pattern_id for _, pattern_id, _, _ in actual}


def patterns_by_message(rows: list[DeadLetter]) -> dict[str, str]:
    """{error message: template of the pattern it is filed under now}."""
    templates = dict(FailurePattern.objects.values_list("pk", "template"))
    return {
        row.error_message: templates[pattern_id]
        for row, pattern_id in zip(
            rows, [DeadLetter.objects.values_list("pattern_id", flat=True).get(pk=row.pk) for row in rows], strict=True
        )
    }
