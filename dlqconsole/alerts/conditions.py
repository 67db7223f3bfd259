"""What each rule kind looks at, and which subjects it holds for right now.

One evaluation tick builds one Facts object. Facts reads each thing at most once and only when a rule asks:
counter sums (DeadLetterCount), the newest queue samples, running totals a window ago (GrowthSample), one
indexed lookup per queue for the oldest parked dead letter. Nothing here counts dead letters row by row, so a
tick costs the same with a thousand stored dead letters or a million.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Sum
from django.urls import NoReverseMatch, reverse

from dlqconsole.alerts.models import AlertRule, GrowthSample, RuleKind, Severity
from dlqconsole.core.bidi import isolate
from dlqconsole.deadletters.models import (
    DeadLetter,
    DeadLetterCount,
    DeadLetterStatus,
    FailurePattern,
    PatternEvent,
    PatternOrigin,
    PatternStatus,
)
from dlqconsole.ingest.models import QueueSample, WatchedQueue
from dlqconsole.operations.models import Operation, OperationStatus


@dataclass(frozen=True)
class Observation:
    """A subject for which the rule's condition holds, with the numbers that make it so."""

    label: str
    value: float
    summary: str
    link: str = ""


@dataclass
class RuleResult:
    holding: dict[str, Observation] = field(default_factory=dict)
    # Subjects whose state cannot be told this tick (no fresh queue sample): their alerts stay as they are.
    unknown: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class PatternFacts:
    pk: int
    status: str
    template: str
    total_count: int
    merged: bool


def queue_subject(name: str) -> str:
    return f"queue:{name}"


def pattern_subject(pk: int) -> str:
    return f"pattern:{pk}"


def subject_pattern_id(subject: str) -> int | None:
    kind, _, rest = subject.partition(":")
    return int(rest) if kind == "pattern" and rest.isdigit() else None


@functools.lru_cache(maxsize=4096)
def safe_reverse(name: str, *args: Any, query: str = "") -> str:
    """A console path for a link, or "" when that page does not exist (links are a convenience). Cached: the
    same few links are asked for by many rules on every tick, and the URLconf does not change while running."""
    try:
        path = reverse(name, args=args)
    except NoReverseMatch:
        return ""
    return f"{path}?{query}" if query else path


class Facts:
    """What one tick knows. Every property is read lazily and at most once."""

    def __init__(self, *, now: dt.datetime, open_subjects: dict[int, set[str]] | None = None) -> None:
        self.now = now
        self.open_subjects = open_subjects or {}
        self.totals: dict[str, tuple[int, str]] = {}
        self._pattern_cache: dict[int, PatternFacts | None] = {}
        self._parked_cache: dict[int, dict[str, int]] = {}
        self._candidates: dict[tuple[str, dt.datetime], set[int]] = {}
        self._oldest_cache: dict[str, dt.datetime | None] = {}
        self._baseline_cache: dict[tuple[str, int], int | None] = {}

    # Counters ----------------------------------------------------------------------------------------------

    @cached_property
    def counts(self) -> dict[tuple[str, str], int]:
        """{(queue, status): dead letters}, leaving out ignored patterns (they never alert)."""
        rows = (
            DeadLetterCount.objects.exclude(pattern__status=PatternStatus.IGNORED)
            .values_list("source_queue", "status")
            .annotate(total=Sum("count"))
        )
        return {(queue, status): int(total or 0) for queue, status, total in rows}

    @cached_property
    def parked_by_queue(self) -> dict[str, int]:
        return {
            queue: count
            for (queue, status), count in self.counts.items()
            if status == DeadLetterStatus.PARKED and count > 0
        }

    @cached_property
    def stored_by_queue(self) -> dict[str, int]:
        """Dead letters of each queue in the database, whatever their status: with the broker depth, a total
        that only moves when dead letters arrive (or are purged)."""
        stored: dict[str, int] = defaultdict(int)
        for (queue, _status), count in self.counts.items():
            stored[queue] += count
        return dict(stored)

    def parked_of_patterns(self, pattern_ids: Iterable[int], *, queue: str = "") -> dict[int, int]:
        """Parked dead letters of each pattern, in the given queue scope ("" for every queue)."""
        ids = set(pattern_ids)
        wanted = [pk for pk in ids if pk not in self._parked_cache]
        if wanted:
            for pk in wanted:
                self._parked_cache[pk] = {}
            rows = (
                DeadLetterCount.objects.filter(pattern_id__in=wanted, status=DeadLetterStatus.PARKED, count__gt=0)
                .values_list("pattern_id", "source_queue")
                .annotate(total=Sum("count"))
                .order_by()
            )
            for pattern_id, source_queue, total in rows:
                self._parked_cache[pattern_id][source_queue] = int(total or 0)
        names = self.queue_names(queue) if queue else None
        return {
            pk: sum(count for name, count in self._parked_cache[pk].items() if names is None or name in names)
            for pk in ids
        }

    def patterns(self, pattern_ids: Iterable[int]) -> dict[int, PatternFacts]:
        wanted = [pk for pk in set(pattern_ids) if pk not in self._pattern_cache]
        if wanted:
            self._pattern_cache.update(dict.fromkeys(wanted))
            for pk, status, template, total, merged_into in FailurePattern.objects.filter(pk__in=wanted).values_list(
                "pk", "status", "template", "total_count", "merged_into_id"
            ):
                self._pattern_cache[pk] = PatternFacts(pk, status, template, total, merged_into is not None)
        return {pk: facts for pk in set(pattern_ids) if (facts := self._pattern_cache[pk]) is not None}

    # Queues --------------------------------------------------------------------------------------------------

    @cached_property
    def watched(self) -> list[WatchedQueue]:
        return list(WatchedQueue.objects.filter(enabled=True))

    @cached_property
    def work_queue_of(self) -> dict[str, str]:
        return {queue.dead_letter_queue: queue.name for queue in self.watched}

    @cached_property
    def _pairs(self) -> dict[str, set[str]]:
        pairs: dict[str, set[str]] = defaultdict(set)
        for queue in self.watched:
            for name in (queue.name, queue.dead_letter_queue):
                pairs[name] |= {queue.name, queue.dead_letter_queue}
        return pairs

    def queue_names(self, name: str) -> set[str]:
        """A rule's queue scope names a DLQ or a work queue; either way it means both of them."""
        return self._pairs.get(name) or {name}

    def in_scope(self, rule: AlertRule, queue: str) -> bool:
        return not rule.queue or queue in self.queue_names(rule.queue)

    @cached_property
    def dead_letter_queues(self) -> set[str]:
        """Every DLQ we know of: watched ones and those that have dead letters stored."""
        return set(self.work_queue_of) | set(self.stored_by_queue)

    @cached_property
    def samples(self) -> dict[str, QueueSample]:
        """The newest fresh sample of each watched work queue and DLQ (none when the sampler is behind)."""
        names = {queue.name for queue in self.watched} | set(self.work_queue_of)
        if not names:
            return {}
        fresh_after = self.now - dt.timedelta(seconds=max(30.0, 3 * settings.DLQ_QUEUE_SAMPLE_SECONDS))
        newest: dict[str, QueueSample] = {}
        for sample in QueueSample.objects.filter(
            queue__in=names, sampled_at__gte=fresh_after, sampled_at__lte=self.now
        ).order_by("queue", "-sampled_at"):
            newest.setdefault(sample.queue, sample)
        return newest

    def broker_depth(self, dead_letter_queue: str) -> int:
        """Messages still in the broker's DLQ, not yet ingested (0 when unknown)."""
        sample = self.samples.get(dead_letter_queue)
        return int(sample.messages) if sample is not None else 0

    # Growth --------------------------------------------------------------------------------------------------

    @cached_property
    def ignored_basis(self) -> str:
        """A short hash of the set of ignored patterns (see GrowthSample.basis)."""
        ignored = (
            FailurePattern.objects.filter(status=PatternStatus.IGNORED).order_by("pk").values_list("pk", flat=True)
        )
        return hashlib.blake2b(",".join(map(str, ignored)).encode(), digest_size=8).hexdigest()

    def record_total(self, subject: str, total: int, *, basis: str = "") -> None:
        self.totals[subject] = (total, basis)

    def totals_before(self, subjects: list[str], window_seconds: int, *, basis: str = "") -> dict[str, int | None]:
        """For each subject, the running total recorded a window ago, or the oldest one within the window while
        the history is shorter than the window (None when there is none at all). One statement for all subjects
        not asked for yet: two scalar subqueries per subject, each one step on the (subject, -sampled_at) index."""
        wanted = [subject for subject in subjects if (subject, window_seconds) not in self._baseline_cache]
        if wanted:
            cutoff = self.now - dt.timedelta(seconds=window_seconds)
            table = GrowthSample._meta.db_table
            probe = (
                f"SELECT %s, COALESCE((SELECT total FROM {table} WHERE subject = %s AND basis = %s AND "
                "sampled_at <= %s ORDER BY sampled_at DESC LIMIT 1), (SELECT total FROM {table} WHERE subject = %s "
                "AND basis = %s AND sampled_at > %s AND sampled_at < %s ORDER BY sampled_at LIMIT 1))"
            ).replace("{table}", table)
            field = GrowthSample._meta.get_field("sampled_at")
            cutoff_value = field.get_db_prep_value(cutoff, connection)
            now_value = field.get_db_prep_value(self.now, connection)
            params: list[Any] = []
            for subject in wanted:
                params += [subject, subject, basis, cutoff_value, subject, basis, cutoff_value, now_value]
            with connection.cursor() as cursor:
                cursor.execute(" UNION ALL ".join([probe] * len(wanted)), params)
                for subject, total in cursor.fetchall():
                    self._baseline_cache[(subject, window_seconds)] = None if total is None else int(total)
        return {subject: self._baseline_cache[(subject, window_seconds)] for subject in subjects}

    # Oldest parked dead letter -------------------------------------------------------------------------------

    def oldest_parked(self, *, queue: str = "", pattern_id: int | None = None) -> dt.datetime | None:
        if pattern_id is not None:
            key = f"pattern:{pattern_id}"
            if key not in self._oldest_cache:
                # Walks the (pattern, status, -id) index from its oldest end and stops at the first row.
                self._oldest_cache[key] = (
                    DeadLetter.objects.parked()
                    .filter(pattern_id=pattern_id)
                    .order_by("id")
                    .values_list("ingested_at", flat=True)
                    .first()
                )
            return self._oldest_cache[key]
        return self.oldest_parked_by_queue.get(queue)

    @cached_property
    def oldest_parked_by_queue(self) -> dict[str, dt.datetime | None]:
        """The oldest parked dead letter (ignored patterns left out) of every queue with parked ones, in one
        statement: a scalar subquery per queue, each walking the (queue, status, -id) index from its oldest end
        until it meets a pattern that is not ignored."""
        queues = sorted(self.parked_by_queue)
        if not queues:
            return {}
        letters = DeadLetter._meta.db_table
        patterns = FailurePattern._meta.db_table
        probe = (
            f"SELECT %s, (SELECT d.ingested_at FROM {letters} d JOIN {patterns} p ON p.id = d.pattern_id "
            "WHERE d.source_queue = %s AND d.status = %s AND p.status <> %s ORDER BY d.id LIMIT 1)"
        )
        sql = " UNION ALL ".join([probe] * len(queues))
        params: list[Any] = []
        for name in queues:
            params += [name, name, DeadLetterStatus.PARKED, PatternStatus.IGNORED]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        # Raw rows skip the ORM: let the backend turn its value into an aware datetime (SQLite returns text).
        column = DeadLetter._meta.get_field("ingested_at").get_col(letters)
        converters = connection.ops.get_db_converters(column)
        found: dict[str, dt.datetime | None] = {}
        for name, moment in rows:
            for converter in converters:
                moment = converter(moment, column, connection)
            found[name] = moment
        return found

    # Candidates shared by rules with the same window ----------------------------------------------------------

    def new_pattern_ids(self, since: dt.datetime) -> set[int]:
        key = ("new", since)
        if key not in self._candidates:
            self._candidates[key] = set(
                FailurePattern.objects.active()
                .filter(status=PatternStatus.OPEN, last_seen_at__gte=since, first_seen_at__gte=since)
                # A rule's pattern (a custom rule or a split) was named by a person: it is known, not new.
                .exclude(origin=PatternOrigin.RULE)
                .values_list("pk", flat=True)
            )
        return self._candidates[key]

    def reopened_pattern_ids(self, since: dt.datetime) -> set[int]:
        key = ("reopened", since)
        if key not in self._candidates:
            self._candidates[key] = set(
                PatternEvent.objects.filter(kind=PatternEvent.Kind.REOPENED, created_at__gte=since).values_list(
                    "pattern_id", flat=True
                )
            )
        return self._candidates[key]

    @cached_property
    def paused_operations(self) -> list[Any]:
        """Operations that paused themselves. A person who pauses one knows it already: that does not alert."""
        paused = Operation.objects.filter(status=OperationStatus.PAUSED, paused_automatically=True)
        return list(paused.only("pk", "kind", "pause_reason", "filter", "succeeded", "total", "returned"))


# Rule kinds ----------------------------------------------------------------------------------------------------


def _plural(count: float, word: str) -> str:
    number = int(count) if float(count).is_integer() else round(count, 1)
    return f"{number:,} {word}" if number == 1 else f"{number:,} {word}s"


def _queue_link(queue: str) -> str:
    return safe_reverse("deadletters:messages", query=f"queue={queue}")


def _pattern_link(pk: int) -> str:
    return safe_reverse("deadletters:pattern", pk)


# How much of a pattern's template an alert's summary quotes.
LABEL_CHARS = 120


def _pattern_label(pattern: PatternFacts) -> str:
    """The pattern's template, cut at a word with an ellipsis when it is long."""
    template = pattern.template
    if len(template) <= LABEL_CHARS:
        return isolate(template) or f"pattern #{pattern.pk}"
    cut = template[: LABEL_CHARS - 1]
    if " " in cut[LABEL_CHARS // 2 :]:
        cut = cut.rsplit(" ", 1)[0]
    return isolate(cut.rstrip(" ,;:·←→") + "…")


def dlq_not_empty(rule: AlertRule, facts: Facts) -> RuleResult:
    threshold = rule.effective_threshold or 0
    result = RuleResult()
    if rule.pattern_id is not None:
        pattern = facts.patterns([rule.pattern_id]).get(rule.pattern_id)
        parked = facts.parked_of_patterns([rule.pattern_id]).get(rule.pattern_id, 0)
        if pattern is not None and pattern.status != PatternStatus.IGNORED and parked > threshold:
            result.holding[pattern_subject(pattern.pk)] = Observation(
                label=_pattern_label(pattern),
                value=parked,
                summary=f"{_plural(parked, 'dead letter')} parked in pattern “{_pattern_label(pattern)}”.",
                link=_pattern_link(pattern.pk),
            )
        return result
    for queue in sorted(facts.dead_letter_queues):
        if not facts.in_scope(rule, queue):
            continue
        parked = facts.parked_by_queue.get(queue, 0)
        in_broker = facts.broker_depth(queue)
        waiting = parked + in_broker
        if waiting > threshold:
            detail = f" ({in_broker:,} not yet ingested)" if in_broker else ""
            result.holding[queue_subject(queue)] = Observation(
                label=isolate(queue),
                value=waiting,
                summary=f"{isolate(queue)}: {_plural(waiting, 'dead letter')} waiting{detail}.",
                link=_queue_link(queue),
            )
    return result


def dlq_growth(rule: AlertRule, facts: Facts) -> RuleResult:
    threshold = rule.effective_threshold or 0
    window = max(1, rule.window_seconds)
    # A pattern's total_count only grows. A queue's total is what it holds in the database (ignored patterns
    # left out) plus what still waits in the broker's DLQ: ingest moves dead letters from one to the other
    # without changing the sum, arrivals raise it, and only a purge lowers it (growth then reads low for one
    # window, never high).
    totals: dict[str, tuple[str, int, str, str]] = {}
    if rule.pattern_id is not None:
        pattern = facts.patterns([rule.pattern_id]).get(rule.pattern_id)
        if pattern is not None and pattern.status != PatternStatus.IGNORED:
            label = _pattern_label(pattern)
            totals[pattern_subject(pattern.pk)] = (label, pattern.total_count, "", _pattern_link(pattern.pk))
    else:
        for queue in sorted(facts.dead_letter_queues):
            if facts.in_scope(rule, queue):
                total = facts.stored_by_queue.get(queue, 0) + facts.broker_depth(queue)
                totals[queue_subject(queue)] = (isolate(queue), total, facts.ignored_basis, _queue_link(queue))
    result = RuleResult()
    bases = {basis for _label, _total, basis, _link in totals.values()}
    before_of: dict[str, int | None] = {}
    for basis in bases:
        same = [subject for subject, values in totals.items() if values[2] == basis]
        before_of.update(facts.totals_before(same, window, basis=basis))
    for subject, (label, total, basis, link) in totals.items():
        facts.record_total(subject, total, basis=basis)
        before = before_of[subject]
        if before is None:
            result.unknown.add(subject)
            continue
        growth = total - before
        if growth > threshold:
            result.holding[subject] = Observation(
                label=label,
                value=growth,
                summary=f"{label}: {_plural(growth, 'new dead letter')} within {window} s (alert above {threshold:g}).",
                link=link,
            )
    return result


def depth_threshold(queue: WatchedQueue, severity: str) -> int:
    if severity == Severity.EMERGENCY:
        return queue.emergency_depth
    if severity == Severity.CRITICAL:
        return queue.critical_depth
    return queue.warning_depth


def queue_depth(rule: AlertRule, facts: Facts) -> RuleResult:
    result = RuleResult()
    for queue in facts.watched:
        if not facts.in_scope(rule, queue.name):
            continue
        subject = queue_subject(queue.name)
        sample = facts.samples.get(queue.name)
        if sample is None:
            result.unknown.add(subject)
            continue
        threshold = rule.threshold if rule.threshold is not None else depth_threshold(queue, rule.severity)
        if sample.messages >= threshold:
            result.holding[subject] = Observation(
                label=isolate(queue.name),
                value=sample.messages,
                summary=f"{isolate(queue.name)}: {_plural(sample.messages, 'message')} ready "
                f"({rule.severity} at {threshold:g}), {_plural(sample.consumers, 'consumer')}.",
                link=safe_reverse("alerts:queues"),
            )
    return result


def _open_pattern_ids(rule: AlertRule, facts: Facts) -> set[int]:
    return {pk for subject in facts.open_subjects.get(rule.pk, ()) if (pk := subject_pattern_id(subject))}


def new_pattern(rule: AlertRule, facts: Facts) -> RuleResult:
    """A pattern first seen within the window, still open (not triaged) and with dead letters parked."""
    since = facts.now - dt.timedelta(seconds=max(1, rule.window_seconds))
    ids = facts.new_pattern_ids(since) | _open_pattern_ids(rule, facts)
    patterns = facts.patterns(ids)
    parked = facts.parked_of_patterns(ids, queue=rule.queue)
    result = RuleResult()
    for pk in sorted(ids):
        pattern = patterns.get(pk)
        count = parked.get(pk, 0)
        if pattern is None or pattern.merged or pattern.status != PatternStatus.OPEN or count <= 0:
            continue
        result.holding[pattern_subject(pk)] = Observation(
            label=_pattern_label(pattern),
            value=count,
            summary=f"New failure pattern “{_pattern_label(pattern)}”: {_plural(count, 'dead letter')} parked.",
            link=_pattern_link(pk),
        )
    return result


def pattern_reopened(rule: AlertRule, facts: Facts) -> RuleResult:
    """A resolved pattern that came back within the window, until someone triages it again."""
    since = facts.now - dt.timedelta(seconds=max(1, rule.window_seconds))
    ids = facts.reopened_pattern_ids(since) | _open_pattern_ids(rule, facts)
    patterns = facts.patterns(ids)
    parked = facts.parked_of_patterns(ids, queue=rule.queue) if rule.queue else {}
    result = RuleResult()
    for pk in sorted(ids):
        pattern = patterns.get(pk)
        if pattern is None or pattern.merged or pattern.status != PatternStatus.OPEN:
            continue
        if rule.queue and parked.get(pk, 0) <= 0:
            continue
        result.holding[pattern_subject(pk)] = Observation(
            label=_pattern_label(pattern),
            value=pattern.total_count,
            summary=f"Resolved pattern “{_pattern_label(pattern)}” is failing again.",
            link=_pattern_link(pk),
        )
    return result


def oldest_age(rule: AlertRule, facts: Facts) -> RuleResult:
    threshold = rule.effective_threshold or 0
    result = RuleResult()
    candidates: list[tuple[str, str, dt.datetime | None, str]] = []
    if rule.pattern_id is not None:
        pattern = facts.patterns([rule.pattern_id]).get(rule.pattern_id)
        if pattern is not None and pattern.status != PatternStatus.IGNORED:
            oldest = facts.oldest_parked(pattern_id=pattern.pk)
            candidates.append((pattern_subject(pattern.pk), _pattern_label(pattern), oldest, _pattern_link(pattern.pk)))
    else:
        for queue in sorted(facts.parked_by_queue):
            if facts.in_scope(rule, queue):
                candidates.append(
                    (queue_subject(queue), isolate(queue), facts.oldest_parked(queue=queue), _queue_link(queue))
                )
    for subject, label, oldest, link in candidates:
        if oldest is None:
            continue
        age = (facts.now - oldest).total_seconds()
        if age > threshold:
            result.holding[subject] = Observation(
                label=label,
                value=age,
                summary=f"{label}: the oldest parked dead letter arrived {_age(age)} ago "
                f"(alert above {_age(threshold)}).",
                link=link,
            )
    return result


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"


def operation_paused(rule: AlertRule, facts: Facts) -> RuleResult:
    """An operation that paused itself: canary judged bad, too many boomerangs, circuit breaker, an error."""
    result = RuleResult()
    for operation in facts.paused_operations:
        queues = (operation.filter or {}).get("queue") if isinstance(operation.filter, dict) else None
        names = [str(name) for name in queues] if isinstance(queues, list) else []
        if rule.queue and names and not any(facts.in_scope(rule, name) for name in names):
            continue
        label = f"{operation.get_kind_display()} #{operation.pk}"
        reason = isolate(operation.pause_reason or "no reason recorded")
        result.holding[f"operation:{operation.pk}"] = Observation(
            label=label,
            value=operation.returned,
            summary=f"{label} paused: {reason} ({operation.succeeded:,} of {operation.total:,} done).",
            link=safe_reverse("operations:detail", operation.pk),
        )
    return result


EVALUATORS: dict[str, Callable[[AlertRule, Facts], RuleResult]] = {
    RuleKind.DLQ_NOT_EMPTY: dlq_not_empty,
    RuleKind.DLQ_GROWTH: dlq_growth,
    RuleKind.QUEUE_DEPTH: queue_depth,
    RuleKind.NEW_PATTERN: new_pattern,
    RuleKind.PATTERN_REOPENED: pattern_reopened,
    RuleKind.OLDEST_AGE: oldest_age,
    RuleKind.OPERATION_PAUSED: operation_paused,
}


def evaluate(rule: AlertRule, facts: Facts) -> RuleResult:
    return EVALUATORS[rule.kind](rule, facts)
