"""Dead letters for the grouping, pattern and triage tests, made as production makes them (parse_envelope, then
ingest_batch), and a check that the counters match the rows."""

from __future__ import annotations

import datetime as dt
import itertools
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from dlqconsole.deadletters.grouping.rules import forget_rules
from dlqconsole.deadletters.models import DeadLetter, DeadLetterCount, FailurePattern
from dlqconsole.ingest.envelope import ParsedDeadLetter, parse_envelope
from dlqconsole.ingest.services import ingest_batch

_serial = itertools.count(1)


def make_letter(
    message: str,
    *,
    error_type: str = "",
    stack_trace: str = "",
    queue: str = "orders",
    headers: dict[str, Any] | None = None,
) -> ParsedDeadLetter:
    serial = next(_serial)
    all_headers: dict[str, Any] = {
        "x-death": [
            {
                "count": 1,
                "reason": "rejected",
                "queue": queue,
                "time": dt.datetime(2026, 11, 20, 10, 0, tzinfo=dt.UTC),
                "exchange": "shop",
                "routing-keys": [f"{queue}.created"],
            }
        ],
        "x-exception-message": message,
        **({"x-exception-type": error_type} if error_type else {}),
        **({"x-exception-stacktrace": stack_trace} if stack_trace else {}),
        **(headers or {}),
    }
    properties = pika.BasicProperties(message_id=f"grouping-{serial}", headers=all_headers)
    return parse_envelope(
        source_queue=f"{queue}.dlq", body=f"body {serial}".encode(), properties=properties, now=timezone.now()
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
        letters = [make_letter(message) if isinstance(message, str) else make_letter(**message) for message in messages]
        ingest_batch(letters=letters)
        stored = {
            row.message_id: row
            for row in DeadLetter.objects.filter(message_id__in=[letter.message_id for letter in letters])
        }
        return [stored[letter.message_id] for letter in letters]

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


@pytest.fixture
def migrate() -> Iterator[Any]:
    """migrate(targets) -> the historical apps at that state; the database is migrated forward again after."""

    def to(targets: list[tuple[str, str]]) -> Any:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(targets)
        return executor.loader.project_state(targets).apps

    yield to
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())
