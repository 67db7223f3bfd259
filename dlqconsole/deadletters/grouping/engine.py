"""Grouping in memory: what ingest does against the database, for messages held in memory.

`dlq fingerprint` and the benchmark use it. It files each message exactly as `assign_patterns` would once the
same set of messages has been ingested: fingerprint, cluster by (error type, failure reason, token count),
mine each cluster's templates, key each group by its generalised template.
"""

from __future__ import annotations

from dataclasses import dataclass

from dlqconsole.deadletters.fingerprint import Fingerprint, fingerprint, pattern_key, split_error_type
from dlqconsole.deadletters.grouping.mining import generalize
from dlqconsole.ingest.classify import classify

ClusterKey = tuple[str, str, int]


@dataclass(frozen=True, slots=True)
class Pattern:
    key: str
    template: str
    error_type: str


def describe(*, error_type: str, message: str, stack_trace: str = "") -> tuple[str, str, str]:
    """(error type, message, failure reason) as ingest derives them from the error headers."""
    if not error_type and message:
        error_type, message = split_error_type(message)
    reason = classify(error_type=error_type, message=message, stack_trace=stack_trace)
    return error_type, message, str(reason or "UNKNOWN")


def cluster_of(found: Fingerprint, reason: str) -> ClusterKey | None:
    """The cluster a fingerprint is mined in; None for fingerprints that are never merged (traces, no text)."""
    if found.kind != "text":
        return None
    return (found.error_type, reason, len(found.tokens))


def patterns_of_cluster(error_type: str, templates: dict[str, tuple[str, ...]]) -> dict[str, Pattern]:
    """{fingerprint key: pattern} for the fingerprints of one cluster ({key: tokens})."""
    general = generalize(templates.values())
    result: dict[str, Pattern] = {}
    for key, tokens in templates.items():
        mined = general[tokens]
        template = "".join(mined)
        pattern = key if mined == tokens else pattern_key(error_type=error_type, template=template)
        result[key] = Pattern(key=pattern, template=template, error_type=error_type)
    return result


class Grouper:
    def __init__(self) -> None:
        self._fingerprints: dict[str, Fingerprint] = {}
        self._clusters: dict[ClusterKey, dict[str, tuple[str, ...]]] = {}

    def add(self, *, error_type: str, message: str, stack_trace: str = "", reason: str | None = None) -> str:
        """Fingerprint one message; returns its fingerprint key (look it up in `patterns()` when all are in)."""
        if reason is None:
            error_type, message, reason = describe(error_type=error_type, message=message, stack_trace=stack_trace)
        found = fingerprint(error_type=error_type, message=message, stack_trace=stack_trace)
        if found.key not in self._fingerprints:
            self._fingerprints[found.key] = found
            cluster = cluster_of(found, reason)
            if cluster is not None:
                self._clusters.setdefault(cluster, {})[found.key] = found.tokens
        return found.key

    def patterns(self) -> dict[str, Pattern]:
        """{fingerprint key: the pattern it ends in}."""
        result = {
            key: Pattern(key=key, template=found.template, error_type=found.error_type)
            for key, found in self._fingerprints.items()
        }
        for (error_type, _, _), members in self._clusters.items():
            result.update(patterns_of_cluster(error_type, members))
        return result
