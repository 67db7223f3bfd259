"""Grouping in memory: what ingest does against the database, for messages held in memory.

`dlq fingerprint` and the benchmark use it; `store` uses its cluster and mining helpers. It files each message
exactly as `assign_patterns` would once the same set of messages has been ingested: fingerprint, cluster by
(error type, failure reason of the template, first word; or type and frames for a stack trace), mine each cluster's
templates together (each token count, then across token counts), key each group by its generalised template.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from dlqconsole.deadletters.classify import classify
from dlqconsole.deadletters.fingerprint import TRACE_PREFIX, Fingerprint, fingerprint, pattern_key, split_error_type
from dlqconsole.deadletters.grouping.mining import anchor, generalize_all

ClusterKey = tuple[str, str, str]
# A dotted name ("ssl.gstatic.com", "timeout.handler.Worker") names a host, a key or a class: a keyword inside it
# ("ssl", "timeout") says nothing about how the failure happened.
# Possessive: a word that is not followed by a dot is given up at once, not a character at a time.
DOTTED = re.compile(r"\b[A-Za-z][\w-]*+(?=\.[\w-])(?:\.[\w-]++)+")
# What every dotted name holds, found much faster (a pattern that starts with a literal): most texts have none.
DOTTED_HINT = re.compile(r"\.[\w-]")


def _without_dotted(text: str) -> str:
    return DOTTED.sub("", text) if DOTTED_HINT.search(text) else text


@dataclass(frozen=True, slots=True)
class Pattern:
    key: str
    template: str
    error_type: str
    tokens: tuple[str, ...] = ()


def cluster_of(found: Fingerprint, fallback_reason: str = "UNKNOWN") -> ClusterKey | None:
    """The cluster a fingerprint is mined in; None for fingerprints that are never merged (no text).

    The failure reason is classified from the masked template, not from one message: a variable part that
    happens to read "504" or "timeout" must not send one message of a template to another cluster. A text
    cluster's third part is the message's first word; a trace cluster's, its type and frames (`scope`): the
    messages raised at one place are mined together.
    """
    if found.kind == "text":
        reason = classify(error_type=found.error_type, message=_without_dotted(found.template))
        return (found.error_type, str(reason or fallback_reason), anchor(found.tokens))
    if found.kind == "trace":
        message = _without_dotted("".join(found.tokens[1:]))
        reason = classify(error_type=found.error_type, message=message) if message else None
        return (found.error_type, str(reason or fallback_reason), found.scope)
    return None


def scope_of(cluster: ClusterKey) -> str:
    """What a cluster adds to its patterns' keys: a trace cluster's scope, nothing for text."""
    return cluster[2] if is_trace_cluster(cluster) else ""


def is_trace_cluster(cluster: ClusterKey) -> bool:
    return cluster[2].startswith(TRACE_PREFIX)


def patterns_of_cluster(error_type: str, templates: dict[str, tuple[str, ...]], scope: str = "") -> dict[str, Pattern]:
    """{fingerprint key: pattern} for the fingerprints of one cluster ({key: tokens}); `scope_of` the cluster."""
    keyed_type = f"{error_type}\x00{scope}" if scope else error_type
    general = generalize_all(templates.values())
    by_form: dict[tuple[str, ...], Pattern] = {}
    result: dict[str, Pattern] = {}
    for key, tokens in templates.items():
        mined = general[tokens]
        pattern = by_form.get(mined)
        if pattern is None:
            # Made once per mined form: most of a cluster's templates end in a few.
            template = "".join(mined)
            pattern = by_form[mined] = Pattern(
                key=pattern_key(error_type=keyed_type, template=template),
                template=template,
                error_type=error_type,
                tokens=mined,
            )
        result[key] = pattern
    return result


class Grouper:
    def __init__(self) -> None:
        self._fingerprints: dict[str, Fingerprint] = {}
        self._clusters: dict[ClusterKey, dict[str, tuple[str, ...]]] = {}

    def add(self, *, error_type: str, message: str, stack_trace: str = "", reason: str = "UNKNOWN") -> str:
        """Fingerprint one failure; returns its fingerprint key (look it up in `patterns()` when all are in).
        `reason` is the letter's own failure reason, used only when its template says nothing."""
        found = fingerprint(error_type=error_type, message=message, stack_trace=stack_trace)
        if found.key not in self._fingerprints:
            self._fingerprints[found.key] = found
            cluster = cluster_of(found, reason)
            if cluster is not None:
                self._clusters.setdefault(cluster, {})[found.key] = found.tokens
        return found.key

    def add_line(self, line: str) -> str:
        """A line of text as `dlq fingerprint` reads it: "Type: message" or just a message."""
        error_type, message = split_error_type(line) if line else ("", "")
        return self.add(error_type=error_type, message=message)

    def patterns(self) -> dict[str, Pattern]:
        """{fingerprint key: the pattern it ends in}."""
        mined: dict[str, Pattern] = {}
        for cluster, members in self._clusters.items():
            mined.update(patterns_of_cluster(cluster[0], members, scope_of(cluster)))
        return {
            key: mined.get(key) or Pattern(key=key, template=found.template, error_type=found.error_type)
            for key, found in self._fingerprints.items()
        }


def group_lines(lines: Iterable[str]) -> list[Pattern]:
    """The pattern of every line, after mining all of them together."""
    grouper = Grouper()
    keys = [grouper.add_line(line) for line in lines]
    patterns = grouper.patterns()
    return [patterns[key] for key in keys]
