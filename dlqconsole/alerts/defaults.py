"""The rules a fresh install starts with (installed by a data migration), so that the first dead letter in an
empty dead-letter queue alerts without any configuration. Channels are added by an admin."""

from __future__ import annotations

from typing import Any

DEFAULT_RULES: list[dict[str, Any]] = [
    {
        "name": "Dead letters waiting",
        "kind": "dlq_not_empty",
        "threshold": 0,
        "for_seconds": 0,
        "severity": "warning",
    },
    {
        "name": "Dead-letter queue growing fast",
        "kind": "dlq_growth",
        "threshold": 100,
        "window_seconds": 60,
        "for_seconds": 0,
        "severity": "critical",
    },
    {"name": "Work queue depth: warning", "kind": "queue_depth", "for_seconds": 30, "severity": "warning"},
    {"name": "Work queue depth: critical", "kind": "queue_depth", "for_seconds": 30, "severity": "critical"},
    {"name": "Work queue depth: emergency", "kind": "queue_depth", "for_seconds": 0, "severity": "emergency"},
    {
        "name": "New failure pattern",
        "kind": "new_pattern",
        "window_seconds": 3600,
        "for_seconds": 0,
        "severity": "warning",
    },
    {
        "name": "Resolved pattern reopened",
        "kind": "pattern_reopened",
        "window_seconds": 3600,
        "for_seconds": 0,
        "severity": "warning",
    },
    {
        "name": "Oldest dead letter older than a day",
        "kind": "oldest_age",
        "threshold": 24 * 3600,
        "for_seconds": 0,
        "severity": "warning",
    },
    {"name": "Operation paused automatically", "kind": "operation_paused", "for_seconds": 0, "severity": "critical"},
    {"name": "Circuit breaker open", "kind": "breaker_open", "for_seconds": 0, "severity": "critical"},
]


def install_default_rules(rule_model: Any) -> int:
    """Create the default rules that do not exist yet (by name). Takes the model so a migration can pass its
    historical one. Returns how many were created."""
    created = 0
    for fields in DEFAULT_RULES:
        _, was_created = rule_model.objects.get_or_create(name=fields["name"], defaults=fields)
        created += was_created
    return created
