"""What each rule kind looks at, and which subjects it holds for right now.

One evaluation tick builds one Facts object (facts.py), which reads each thing at most once and only when a rule
asks, or when prefetch reads ahead, in one statement for all the rules, what several of them look at. A rule
scoped to a broker looks at that broker's queues only; one covering every broker raises one alert per (broker,
queue), so `orders.dlq` on two brokers is two subjects (subjects.py).
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.http import urlencode

from dlqconsole.alerts.facts import Baseline, Facts, PatternFacts, QueueKey, queue_key
from dlqconsole.alerts.models import AlertRule, RuleKind, Severity
from dlqconsole.alerts.subjects import pattern_growth_key, pattern_subject, subject_pattern_id
from dlqconsole.core.bidi import isolate
from dlqconsole.core.breaker import STATE_VALUES
from dlqconsole.deadletters.models import PatternStatus
from dlqconsole.ingest.models import WatchedQueue
from dlqconsole.operations.breakers import breaker_views, split_key

# Facts and PatternFacts are read from here too (the benchmarks, the tests).
__all__ = ["EVALUATORS", "Facts", "Observation", "PatternFacts", "RuleResult", "evaluate", "prefetch"]


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


@functools.lru_cache(maxsize=4096)
def safe_reverse(name: str, *args: Any, query: str = "") -> str:
    """A console path for a link, or "" when that page does not exist (links are a convenience). Cached: the
    same few links are asked for by many rules on every tick, and the URLconf does not change while running."""
    try:
        path = reverse(name, args=args)
    except NoReverseMatch:
        return ""
    return f"{path}?{query}" if query else path


# Rule kinds ----------------------------------------------------------------------------------------------------


def _plural(count: float, word: str) -> str:
    number = int(count) if float(count).is_integer() else round(count, 1)
    return f"{number:,} {word}" if number == 1 else f"{number:,} {word}s"


def _queue_link(key: QueueKey, facts: Facts) -> str:
    """The queue's dead letters on the messages page, narrowed to its broker where there are several."""
    return _messages_link(key[1], facts.broker_name(key[0]) if facts.several_brokers else None)


@functools.lru_cache(maxsize=4096)
def _messages_link(queue: str, broker: str | None) -> str:
    query = {"queue": queue}
    if broker is not None:
        query["broker"] = broker
    return safe_reverse("deadletters:messages", query=urlencode(query))


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


def _on_broker(rule: AlertRule, facts: Facts) -> str:
    """ " on staging" after a pattern's text when the rule looks at one broker of several, else nothing."""
    if rule.broker_id is None or not facts.several_brokers:
        return ""
    return f" on {facts.broker_name(rule.broker_id)}"


def dlq_not_empty(rule: AlertRule, facts: Facts) -> RuleResult:
    threshold = rule.effective_threshold or 0
    result = RuleResult()
    if rule.pattern_id is not None:
        pattern = facts.patterns([rule.pattern_id]).get(rule.pattern_id)
        parked = facts.parked_of_patterns([rule.pattern_id], rule=rule).get(rule.pattern_id, 0)
        if pattern is not None and pattern.status != PatternStatus.IGNORED and parked > threshold:
            where = _on_broker(rule, facts)
            result.holding[pattern_subject(pattern.pk)] = Observation(
                label=_pattern_label(pattern) + where,
                value=parked,
                summary=f"{_plural(parked, 'dead letter')} parked in pattern “{_pattern_label(pattern)}”{where}.",
                link=_pattern_link(pattern.pk),
            )
        return result
    for key in facts.dead_letter_queues:
        if not facts.in_scope(rule, key):
            continue
        parked = facts.parked_by_queue.get(key, 0)
        in_broker = facts.broker_depth(key)
        waiting = parked + in_broker
        if waiting > threshold:
            detail = f" ({in_broker:,} not yet ingested)" if in_broker else ""
            label = facts.label(key)
            result.holding[facts.subject(key)] = Observation(
                label=label,
                value=waiting,
                summary=f"{label}: {_plural(waiting, 'dead letter')} waiting{detail}.",
                link=_queue_link(key, facts),
            )
    return result


# {alert subject: (growth key, label, total, basis, link)}: the growth key is the subject, except for a pattern on
# one broker, whose total is not the pattern's and is recorded apart from it.
GrowthTotals = dict[str, tuple[str, str, int, str, str]]


def _growth_totals(rule: AlertRule, facts: Facts) -> GrowthTotals:
    """The running total of each subject a growth rule watches.

    A pattern's total_count only grows. A queue's total is what it holds in the database (ignored patterns left
    out) plus what still waits in the broker's DLQ: ingest moves dead letters from one to the other without
    changing the sum, arrivals raise it, and only a purge lowers it (growth then reads low for one window, never
    high). A pattern on one broker totals what the counters hold of it there, the same way."""
    totals: GrowthTotals = {}
    if rule.pattern_id is not None:
        pattern = facts.patterns([rule.pattern_id]).get(rule.pattern_id)
        if pattern is not None and pattern.status != PatternStatus.IGNORED:
            subject, link = pattern_subject(pattern.pk), _pattern_link(pattern.pk)
            if rule.broker_id is None:
                totals[subject] = (subject, _pattern_label(pattern), pattern.total_count, "", link)
            else:
                growth_key = pattern_growth_key(pattern.pk, broker=facts.broker_name(rule.broker_id))
                label = _pattern_label(pattern) + _on_broker(rule, facts)
                total = facts.stored_of_pattern(pattern.pk, broker_id=rule.broker_id)
                totals[subject] = (growth_key, label, total, "", link)
    else:
        for key in facts.dead_letter_queues:
            if facts.in_scope(rule, key):
                subject = facts.subject(key)
                total = facts.stored_by_queue.get(key, 0) + facts.broker_depth(key)
                totals[subject] = (subject, facts.label(key), total, facts.ignored_basis, _queue_link(key, facts))
    return totals


def _growth_baselines(rule: AlertRule, totals: GrowthTotals) -> list[Baseline]:
    window = max(1, rule.window_seconds)
    return [(growth_key, window, basis) for growth_key, _label, _total, basis, _link in totals.values()]


def dlq_growth(rule: AlertRule, facts: Facts) -> RuleResult:
    threshold = rule.effective_threshold or 0
    window = max(1, rule.window_seconds)
    totals = _growth_totals(rule, facts)
    facts.read_totals_before(_growth_baselines(rule, totals))
    result = RuleResult()
    for subject, (growth_key, label, total, basis, link) in totals.items():
        facts.record_total(growth_key, total, basis=basis)
        before = facts.total_before(growth_key, window, basis=basis)
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
    """Each watched work queue against the rule's threshold, or against its own (its broker's row) for the rule's
    severity."""
    result = RuleResult()
    for queue in facts.watched:
        key = queue_key(queue.broker_id, queue.name)
        if not facts.in_scope(rule, key):
            continue
        subject = facts.subject(key)
        sample = facts.samples.get(key)
        if sample is None:
            result.unknown.add(subject)
            continue
        threshold = rule.threshold if rule.threshold is not None else depth_threshold(queue, rule.severity)
        if sample.messages >= threshold:
            label = facts.label(key)
            result.holding[subject] = Observation(
                label=label,
                value=sample.messages,
                summary=f"{label}: {_plural(sample.messages, 'message')} ready "
                f"({rule.severity} at {threshold:g}), {_plural(sample.consumers, 'consumer')}.",
                link=safe_reverse("alerts:queues"),
            )
    return result


def _open_pattern_ids(rule: AlertRule, facts: Facts) -> set[int]:
    return {pk for subject in facts.open_subjects.get(rule.pk, ()) if (pk := subject_pattern_id(subject))}


def _since(rule: AlertRule, facts: Facts) -> dt.datetime:
    return facts.now - dt.timedelta(seconds=max(1, rule.window_seconds))


def _new_pattern_candidates(rule: AlertRule, facts: Facts) -> set[int]:
    return facts.new_pattern_ids(_since(rule, facts)) | _open_pattern_ids(rule, facts)


def _reopened_pattern_candidates(rule: AlertRule, facts: Facts) -> set[int]:
    return facts.reopened_pattern_ids(_since(rule, facts)) | _open_pattern_ids(rule, facts)


def new_pattern(rule: AlertRule, facts: Facts) -> RuleResult:
    """A pattern first seen within the window, still open (not triaged) and with dead letters parked (in the
    rule's broker and queue, when it names them)."""
    ids = _new_pattern_candidates(rule, facts)
    patterns = facts.patterns(ids)
    parked = facts.parked_of_patterns(ids, rule=rule)
    where = _on_broker(rule, facts)
    result = RuleResult()
    for pk in sorted(ids):
        pattern = patterns.get(pk)
        count = parked.get(pk, 0)
        if pattern is None or pattern.merged or pattern.status != PatternStatus.OPEN or count <= 0:
            continue
        result.holding[pattern_subject(pk)] = Observation(
            label=_pattern_label(pattern) + where,
            value=count,
            summary=f"New failure pattern “{_pattern_label(pattern)}”{where}: {_plural(count, 'dead letter')} parked.",
            link=_pattern_link(pk),
        )
    return result


def pattern_reopened(rule: AlertRule, facts: Facts) -> RuleResult:
    """A resolved pattern that came back within the window, until someone triages it again (with dead letters
    parked in the rule's broker and queue, when it names them)."""
    ids = _reopened_pattern_candidates(rule, facts)
    patterns = facts.patterns(ids)
    scoped = bool(rule.queue) or rule.broker_id is not None
    parked = facts.parked_of_patterns(ids, rule=rule) if scoped else {}
    where = _on_broker(rule, facts)
    result = RuleResult()
    for pk in sorted(ids):
        pattern = patterns.get(pk)
        if pattern is None or pattern.merged or pattern.status != PatternStatus.OPEN:
            continue
        if scoped and parked.get(pk, 0) <= 0:
            continue
        result.holding[pattern_subject(pk)] = Observation(
            label=_pattern_label(pattern) + where,
            value=pattern.total_count,
            summary=f"Resolved pattern “{_pattern_label(pattern)}” is failing again{where}.",
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
            oldest = facts.oldest_parked_of_pattern(pattern.pk, broker_id=rule.broker_id)
            label = _pattern_label(pattern) + _on_broker(rule, facts)
            candidates.append((pattern_subject(pattern.pk), label, oldest, _pattern_link(pattern.pk)))
    else:
        for key in sorted(facts.parked_by_queue, key=lambda key: (key[1], key[0])):
            if facts.in_scope(rule, key):
                oldest = facts.oldest_parked_by_queue.get(key)
                candidates.append((facts.subject(key), facts.label(key), oldest, _queue_link(key, facts)))
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


def _listed(operation_filter: Any, name: str) -> list[str]:
    values = operation_filter.get(name) if isinstance(operation_filter, dict) else None
    return [str(value) for value in values] if isinstance(values, list) else []


def operation_paused(rule: AlertRule, facts: Facts) -> RuleResult:
    """An operation that paused itself: canary judged bad, too many boomerangs, circuit breaker, an error. A rule
    scoped to a broker or queue skips operations whose filter names only other brokers or queues."""
    result = RuleResult()
    by_name = {name: pk for pk, name in facts.broker_names.items()}
    for operation in facts.paused_operations:
        names = _listed(operation.filter, "queue")
        brokers = [by_name[name] for name in _listed(operation.filter, "broker") if name in by_name]
        if rule.broker_id is not None and brokers and rule.broker_id not in brokers:
            continue
        candidates = brokers or ([rule.broker_id] if rule.broker_id is not None else list(facts.broker_names))
        if rule.queue and names and not any(facts.in_scope(rule, (b, n)) for b in candidates for n in names):
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


def breaker_open(rule: AlertRule, facts: Facts) -> RuleResult:
    """A replay destination whose circuit breaker is open or half-open (probing). A rule scoped to a broker or a
    queue looks at the breakers of that broker, or of that queue (its work queue, or the DLQ it feeds)."""
    result = RuleResult()
    scope_broker = facts.broker_name(rule.broker_id) if rule.broker_id is not None else None
    for view in breaker_views():
        if view.is_closed:
            continue
        broker, queue = split_key(view.key)
        if scope_broker is not None and broker != scope_broker:
            continue
        if rule.queue and rule.queue not in (queue, f"{queue}.dlq"):
            continue
        when = f"probing at {timezone.localtime(view.retry_at):%H:%M:%S %Z}" if view.retry_at else "probing"
        reason = isolate(view.state.reason or "failures")
        result.holding[f"breaker:{view.key}"] = Observation(
            label=view.destination,
            value=STATE_VALUES.get(view.state.state, 0),
            summary=f"Circuit {view.label} for {view.destination}: {reason}; replays into it wait ({when}).",
            link=safe_reverse("operations:list"),
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
    RuleKind.BREAKER_OPEN: breaker_open,
}


def evaluate(rule: AlertRule, facts: Facts) -> RuleResult:
    return EVALUATORS[rule.kind](rule, facts)


def prefetch(rules: list[AlertRule], facts: Facts) -> None:
    """Read ahead what several rules of the tick look at, one statement for all of them rather than one or two per
    rule: the patterns they name or may raise alerts for (with their parked counts), and the running totals a
    window ago that the growth rules compare with. Only a shortcut: a rule still reads whatever it finds missing."""
    pattern_ids: set[int] = set()
    for rule in rules:
        if rule.pattern_id is not None:
            pattern_ids.add(rule.pattern_id)
        if rule.kind == RuleKind.NEW_PATTERN:
            pattern_ids |= _new_pattern_candidates(rule, facts)
        elif rule.kind == RuleKind.PATTERN_REOPENED:
            pattern_ids |= _reopened_pattern_candidates(rule, facts)
    if pattern_ids:
        facts.patterns(pattern_ids)
        facts.parked_of_patterns(pattern_ids)
    # After the patterns: a growth rule's totals read its pattern.
    facts.read_totals_before(
        baseline
        for rule in rules
        if rule.kind == RuleKind.DLQ_GROWTH
        for baseline in _growth_baselines(rule, _growth_totals(rule, facts))
    )
