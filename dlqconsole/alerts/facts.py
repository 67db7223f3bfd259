"""What one evaluation tick knows, read lazily and at most once (the rule kinds in conditions.py ask for it).

Counter sums (DeadLetterCount), the newest queue samples, running totals a window ago (GrowthSample), one indexed
lookup per queue for the oldest parked dead letter. Nothing here counts dead letters row by row, so a tick costs
the same with a thousand stored dead letters or a million.

A queue is a (broker id, queue name) pair everywhere here: `orders.dlq` on two brokers is two queues, with their own
counts, samples, thresholds, subjects and alerts.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Sum

from dlqconsole.alerts.models import AlertRule, GrowthSample
from dlqconsole.alerts.subjects import queue_label, queue_subject
from dlqconsole.brokers.models import DEFAULT, Broker
from dlqconsole.deadletters.models import (
    DeadLetter,
    DeadLetterCount,
    DeadLetterStatus,
    FailurePattern,
    FailureReason,
    PatternEvent,
    PatternOrigin,
    PatternStatus,
)
from dlqconsole.ingest.models import QueueSample, WatchedQueue
from dlqconsole.operations.models import Operation, OperationStatus

# A queue: (broker id, queue name).
QueueKey = tuple[int, str]
# A running total a window ago: (growth key, window in seconds, basis).
Baseline = tuple[str, int, str]


def queue_key(broker_id: int | None, name: str) -> QueueKey:
    """The key of a row's queue (every row has its broker: the column is NOT NULL)."""
    return (broker_id or 0, name)


@dataclass(frozen=True)
class PatternFacts:
    pk: int
    status: str
    template: str
    total_count: int
    merged: bool


@dataclass(frozen=True)
class DepthSample:
    """A queue's depth as the sampler last saw it."""

    messages: int
    consumers: int


class Facts:
    """What one tick knows. Every property is read lazily and at most once."""

    def __init__(self, *, now: dt.datetime, open_subjects: dict[int, set[str]] | None = None) -> None:
        self.now = now
        self.open_subjects = open_subjects or {}
        self.totals: dict[str, tuple[int, str]] = {}
        self._pattern_cache: dict[int, PatternFacts | None] = {}
        self._parked_cache: dict[int, dict[QueueKey, int]] = {}
        self._candidates: dict[tuple[str, dt.datetime], set[int]] = {}
        self._oldest_cache: dict[tuple[int, int | None], dt.datetime | None] = {}
        self._baseline_cache: dict[Baseline, int | None] = {}
        self._stored_cache: dict[tuple[int, int], int] = {}

    # Brokers -------------------------------------------------------------------------------------------------

    @cached_property
    def broker_names(self) -> dict[int, str]:
        return dict(Broker.objects.values_list("pk", "name"))

    @cached_property
    def several_brokers(self) -> bool:
        return len(self.broker_names) > 1

    def broker_name(self, broker_id: int) -> str:
        return self.broker_names.get(broker_id, DEFAULT)

    def subject(self, key: QueueKey) -> str:
        return queue_subject(key[1], broker=self.broker_name(key[0]))

    def label(self, key: QueueKey) -> str:
        return queue_label(key[1], broker=self.broker_name(key[0]), several=self.several_brokers)

    def broker_in_scope(self, rule: AlertRule, broker_id: int) -> bool:
        return rule.broker_id is None or rule.broker_id == broker_id

    # Counters ----------------------------------------------------------------------------------------------

    @cached_property
    def counts(self) -> dict[tuple[int, str, str], int]:
        """{(broker id, queue, status): dead letters}, leaving out ignored patterns (they never alert) and shed
        messages (a person took them off a flooded work queue on purpose: no failure, nothing to page anyone for)."""
        rows = (
            DeadLetterCount.objects.exclude(pattern__status=PatternStatus.IGNORED)
            .exclude(failure_reason=FailureReason.SHED)
            .values_list("broker_id", "source_queue", "status")
            .annotate(total=Sum("count"))
            .order_by()
        )
        return {(broker_id, queue, status): int(total or 0) for broker_id, queue, status, total in rows}

    @cached_property
    def parked_by_queue(self) -> dict[QueueKey, int]:
        return {
            (broker_id, queue): count
            for (broker_id, queue, status), count in self.counts.items()
            if status == DeadLetterStatus.PARKED and count > 0
        }

    @cached_property
    def stored_by_queue(self) -> dict[QueueKey, int]:
        """Dead letters of each queue in the database, whatever their status: with the broker depth, a total
        that only moves when dead letters arrive (or are purged)."""
        stored: dict[QueueKey, int] = defaultdict(int)
        for (broker_id, queue, _status), count in self.counts.items():
            stored[(broker_id, queue)] += count
        return dict(stored)

    def parked_of_patterns(self, pattern_ids: Iterable[int], *, rule: AlertRule | None = None) -> dict[int, int]:
        """Parked dead letters of each pattern, within the rule's broker and queue (everywhere without a rule)."""
        ids = set(pattern_ids)
        wanted = [pk for pk in ids if pk not in self._parked_cache]
        if wanted:
            for pk in wanted:
                self._parked_cache[pk] = {}
            rows = (
                DeadLetterCount.objects.filter(pattern_id__in=wanted, status=DeadLetterStatus.PARKED, count__gt=0)
                .values_list("pattern_id", "broker_id", "source_queue")
                .annotate(total=Sum("count"))
                .order_by()
            )
            for pattern_id, broker_id, source_queue, total in rows:
                self._parked_cache[pattern_id][(broker_id, source_queue)] = int(total or 0)
        return {
            pk: sum(count for key, count in self._parked_cache[pk].items() if rule is None or self.in_scope(rule, key))
            for pk in ids
        }

    def stored_of_pattern(self, pattern_id: int, *, broker_id: int) -> int:
        """Dead letters of a pattern held for one broker, whatever their status (its growth on that broker)."""
        key = (pattern_id, broker_id)
        if key not in self._stored_cache:
            cells = DeadLetterCount.objects.filter(pattern_id=pattern_id, broker_id=broker_id)
            self._stored_cache[key] = int(cells.aggregate(total=Sum("count"))["total"] or 0)
        return self._stored_cache[key]

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
        return list(WatchedQueue.objects.filter(enabled=True).order_by("name", "broker_id"))

    @cached_property
    def work_queue_of(self) -> dict[QueueKey, str]:
        return {queue_key(queue.broker_id, queue.dead_letter_queue): queue.name for queue in self.watched}

    @cached_property
    def _pairs(self) -> dict[QueueKey, set[str]]:
        pairs: dict[QueueKey, set[str]] = defaultdict(set)
        for queue in self.watched:
            for name in (queue.name, queue.dead_letter_queue):
                pairs[queue_key(queue.broker_id, name)] |= {queue.name, queue.dead_letter_queue}
        return pairs

    def queue_names(self, broker_id: int, name: str) -> set[str]:
        """A rule's queue scope names a DLQ or a work queue; either way it means both of them on each broker."""
        return self._pairs.get((broker_id, name)) or {name}

    def in_scope(self, rule: AlertRule, key: QueueKey) -> bool:
        broker_id, name = key
        if not self.broker_in_scope(rule, broker_id):
            return False
        return not rule.queue or name in self.queue_names(broker_id, rule.queue)

    @cached_property
    def dead_letter_queues(self) -> list[QueueKey]:
        """Every DLQ we know of, in name order: watched ones and those that have dead letters stored."""
        return sorted(set(self.work_queue_of) | set(self.stored_by_queue), key=lambda key: (key[1], key[0]))

    @cached_property
    def samples(self) -> dict[QueueKey, DepthSample]:
        """The newest fresh sample of each watched work queue and DLQ (none when the sampler is behind)."""
        keys = {queue_key(queue.broker_id, queue.name) for queue in self.watched} | set(self.work_queue_of)
        if not keys:
            return {}
        fresh_after = self.now - dt.timedelta(seconds=max(30.0, 3 * settings.DLQ_QUEUE_SAMPLE_SECONDS))
        rows = (
            QueueSample.objects.filter(
                queue__in={name for _, name in keys}, sampled_at__gte=fresh_after, sampled_at__lte=self.now
            )
            .order_by("queue", "broker_id", "-sampled_at")
            .values_list("broker_id", "queue", "messages", "consumers")
        )
        newest: dict[QueueKey, DepthSample] = {}
        for broker_id, name, messages, consumers in rows:
            key = queue_key(broker_id, name)
            if key in keys and key not in newest:
                newest[key] = DepthSample(messages, consumers)
        return newest

    def broker_depth(self, dead_letter_queue: QueueKey) -> int:
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

    def total_before(self, subject: str, window_seconds: int, *, basis: str = "") -> int | None:
        """The subject's running total recorded a window ago, or the oldest one within the window while the
        history is shorter than the window (None when there is none at all)."""
        baseline = (subject, window_seconds, basis)
        self.read_totals_before([baseline])
        return self._baseline_cache[baseline]

    def read_totals_before(self, baselines: Iterable[Baseline]) -> None:
        """Read the totals a window ago of every baseline not read yet. The oldest total within the window is asked
        for apart, and only for baselines without an older one (a history shorter than the window): as a second
        subquery of every probe, its planning would cost more than the whole lookup."""
        wanted = sorted({baseline for baseline in baselines if baseline not in self._baseline_cache})
        if not wanted:
            return
        self._baseline_cache.update(self._sampled_totals(wanted, "sampled_at <= %s ORDER BY sampled_at DESC"))
        young = [baseline for baseline in wanted if self._baseline_cache[baseline] is None]
        if young:
            self._baseline_cache.update(
                self._sampled_totals(young, "sampled_at > %s AND sampled_at < %s ORDER BY sampled_at", until_now=True)
            )

    def _sampled_totals(
        self, baselines: list[Baseline], condition: str, *, until_now: bool = False
    ) -> dict[Baseline, int | None]:
        """The first total of each baseline's subject and basis that meets the condition, in its order (the
        condition's parameters: the window's start, then now when until_now). One statement with a scalar
        subquery per baseline, each one step on the (subject, -sampled_at) index. Each subject is written out
        rather than joined from a list of values, so the planner sees how many samples it has and takes the
        subject index for one without history rather than walk the time index."""
        table = GrowthSample._meta.db_table
        probe = f"SELECT %s, (SELECT total FROM {table} WHERE subject = %s AND basis = %s AND {condition} LIMIT 1)"
        field = GrowthSample._meta.get_field("sampled_at")
        now_value = field.get_db_prep_value(self.now, connection)
        params: list[Any] = []
        for number, (subject, window_seconds, basis) in enumerate(baselines):
            cutoff = field.get_db_prep_value(self.now - dt.timedelta(seconds=window_seconds), connection)
            params += [number, subject, basis, cutoff, *([now_value] if until_now else [])]
        with connection.cursor() as cursor:
            cursor.execute(" UNION ALL ".join([probe] * len(baselines)), params)
            return {baselines[number]: None if total is None else int(total) for number, total in cursor.fetchall()}

    # Oldest parked dead letter -------------------------------------------------------------------------------

    def oldest_parked_of_pattern(self, pattern_id: int, *, broker_id: int | None = None) -> dt.datetime | None:
        """The oldest parked dead letter of a pattern, on one broker or on any."""
        key = (pattern_id, broker_id)
        if key not in self._oldest_cache:
            # Walks the (pattern, status, -id) index from its oldest end and stops at the first row (of the broker).
            parked = DeadLetter.objects.parked().filter(pattern_id=pattern_id)
            if broker_id is not None:
                parked = parked.filter(broker_id=broker_id)
            self._oldest_cache[key] = parked.order_by("id").values_list("ingested_at", flat=True).first()
        return self._oldest_cache[key]

    @cached_property
    def oldest_parked_by_queue(self) -> dict[QueueKey, dt.datetime | None]:
        """The oldest parked dead letter (ignored patterns left out) of every queue with parked ones."""
        return oldest_parked_by_queue(self.parked_by_queue, leave_out_ignored=True)

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


def oldest_parked_by_queue(
    queues: Iterable[QueueKey], *, leave_out_ignored: bool
) -> dict[QueueKey, dt.datetime | None]:
    """The oldest parked dead letter of each queue (None for one without), in one statement: a scalar subquery per
    queue, each walking the (queue, status, -id) index from its oldest end until it meets a dead letter of the
    queue's broker (and, when they are left out, of a pattern that is not ignored). The ignored patterns are a
    subquery rather than a join: a join costs the planner twice as long, for each queue."""
    keys = sorted(set(queues), key=lambda key: (key[1], key[0]))
    if not keys:
        return {}
    letters = DeadLetter._meta.db_table
    patterns = FailurePattern._meta.db_table
    not_ignored = f"AND d.pattern_id NOT IN (SELECT id FROM {patterns} WHERE status = %s) " if leave_out_ignored else ""
    probe = (
        f"SELECT %s, %s, (SELECT d.ingested_at FROM {letters} d WHERE d.source_queue = %s AND d.broker_id = %s "
        f"AND d.status = %s {not_ignored}ORDER BY d.id LIMIT 1)"
    )
    params: list[Any] = []
    for broker_id, name in keys:
        params += [broker_id, name, name, broker_id, DeadLetterStatus.PARKED]
        if leave_out_ignored:
            params.append(PatternStatus.IGNORED)
    with connection.cursor() as cursor:
        cursor.execute(" UNION ALL ".join([probe] * len(keys)), params)
        rows = cursor.fetchall()
    # Raw rows skip the ORM: let the backend turn its value into an aware datetime (SQLite returns text).
    column = DeadLetter._meta.get_field("ingested_at").get_col(letters)
    converters = connection.ops.get_db_converters(column)
    found: dict[QueueKey, dt.datetime | None] = {}
    for broker_id, name, moment in rows:
        for converter in converters:
            moment = converter(moment, column, connection)
        found[(int(broker_id), name)] = moment
    return found
