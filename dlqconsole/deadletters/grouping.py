"""Assign each incoming dead letter to a FailurePattern.

This is the one entry point ingest calls. Merge decisions live in the database (FailurePattern.merged_into),
so every consumer process files a fingerprint under the same pattern.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import TYPE_CHECKING

from django.db import connection

from dlqconsole.deadletters.fingerprint import fingerprint
from dlqconsole.deadletters.models import FailurePattern

if TYPE_CHECKING:
    from dlqconsole.ingest.envelope import ParsedDeadLetter


def fallback_name(letter: ParsedDeadLetter) -> str:
    if letter.task_name:
        return f"Celery task {letter.task_name} failed ({letter.death_reason})"
    return f"{letter.death_reason} from {letter.original_queue or letter.source_queue}"


def assign_patterns(*, letters: Sequence[ParsedDeadLetter], now: dt.datetime) -> dict[str, int]:
    """Compute each letter's fingerprint, create missing patterns, and return {fingerprint: pattern id}.

    Sets `letter.fingerprint` on each letter. Safe under concurrency: creation is INSERT ... ON CONFLICT.
    """
    templates: dict[str, tuple[str, str, str, bool]] = {}
    for letter in letters:
        found = fingerprint(error_type=letter.error_type, message=letter.error_message, fallback=fallback_name(letter))
        letter.fingerprint = found.key
        templates.setdefault(found.key, (found.template, found.error_type, letter.failure_reason, letter.transient))
    if not templates:
        return {}
    table = FailurePattern._meta.db_table
    with connection.cursor() as cursor:
        rows = [
            (key, template[:10000], error_type, reason, transient, now, now, "open", now, "", now)
            for key, (template, error_type, reason, transient) in templates.items()
        ]
        placeholders = ",".join(["(%s,%s,%s,%s,%s,0,%s,%s,%s,%s,%s,%s)"] * len(rows))
        cursor.execute(
            f"INSERT INTO {table} (key, template, error_type, failure_reason, transient, total_count, "
            "first_seen_at, last_seen_at, status, status_changed_at, note, created_at) "
            f"VALUES {placeholders} ON CONFLICT (key) DO NOTHING",
            [value for row in rows for value in row],
        )
    resolved: dict[str, int] = {}
    merged: dict[str, int] = {}
    for pattern_id, key, merged_into_id in FailurePattern.objects.filter(key__in=templates).values_list(
        "id", "key", "merged_into_id"
    ):
        resolved[key] = pattern_id
        if merged_into_id is not None:
            merged[key] = merged_into_id
    # Follow merge chains to the surviving pattern (chains are short; a cycle is cut after a few hops).
    for key, target in merged.items():
        for _ in range(8):
            next_target = FailurePattern.objects.filter(pk=target).values_list("merged_into_id", flat=True).first()
            if next_target is None:
                break
            target = next_target
        resolved[key] = target
    return resolved
