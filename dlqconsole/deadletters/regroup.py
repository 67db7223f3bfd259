"""Regrouping stored dead letters (`dlq regroup`): bring the stored patterns in line with the current grouping rules,
by merging only.

Grouping rules change (masking, stack-trace signatures, template mining); new arrivals follow the new rules at
once, but stored dead letters stay in the patterns they were filed in. Regrouping reads every stored dead letter's
error type, message, stack trace and failure reason (and, for one without any error text, what ingest names it
by), fingerprints and mines them all together in memory as ingest would (`grouping.engine.Grouper`), and merges the
patterns whose dead letters all land in one new group:

- a pattern whose dead letters span several new groups is left as it is: the store merges, never splits;
- patterns bound to an operator's rule are never merged: a custom rule's own pattern, the part a split took and the
  pattern that was split (merging others into it would put dead letters the split rule takes in the pattern it
  split them from); dead letters filed by a rule keep that rule as their group;
- the survivor of a merge is the pattern holding the most dead letters (the fewest rows to move), the oldest (lowest
  id) among equals; the others are absorbed by `services.absorb_pattern` (dead letters, counters, fingerprints,
  history totals, split rules, the alert rules and retry policies that watch them), with their triage carried
  where the survivor has none (an acknowledgement when it is open, owner, note appended), in one transaction per merge;
- then the fingerprints the current rules give the stored texts, where no Fingerprint row has them yet, are filed
  under the pattern that holds their dead letters, when that is one pattern: a new arrival of the same text lands
  there instead of opening a pattern of its own. They are filed as a rule's fingerprint is, outside any cluster
  (`_file`), so that no later mining moves them; a fingerprint whose dead letters sit in several patterns is left
  to ingest, which files it as any new one.

The read is not one snapshot (a table can hold millions of rows): each merge checks under its locks that its
patterns did not change meanwhile (merged, split, given dead letters from elsewhere or of other texts) and is
skipped, with the reason, when they did; running regroup again picks it up. A second run on an unchanged store
merges nothing.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.db.models import Count, Max, Q
from django.utils import timezone

from dlqconsole.accounts.services import record_audit
from dlqconsole.deadletters.fingerprint import Fingerprint as Found
from dlqconsole.deadletters.fingerprint import fingerprint
from dlqconsole.deadletters.grouping.engine import Grouper
from dlqconsole.deadletters.grouping.store import resolve
from dlqconsole.deadletters.models import (
    DeadLetter,
    FailurePattern,
    Fingerprint,
    FingerprintKind,
    FingerprintRule,
    PatternEvent,
    PatternOrigin,
)
from dlqconsole.deadletters.search import fallback_name
from dlqconsole.deadletters.services import Actor, PatternError, absorb_pattern, lock_fingerprints

# Dead letters are read in chunks of this many rows (by id), each chunk one query.
READ_CHUNK = 5000
# New fingerprints are filed in transactions of this many.
FILE_CHUNK = 500
DETAIL = "merged by dlq regroup: same pattern under the current grouping rules"
RULE_PREFIX = "rule-"
# What is read of each dead letter: its id and pattern, then what ingest groups it by (grouping.Letter).
COLUMNS = (
    "pk",
    "pattern_id",
    "fingerprint",
    "error_type",
    "error_message",
    "stack_trace",
    "failure_reason",
    "transient",
    "task_name",
    "death_reason",
    "original_queue",
    "source_queue",
)
Row = tuple[Any, ...]


@dataclass(slots=True)
class _Letter:
    """A stored dead letter as grouping reads one on its way in (grouping.Letter), for `fallback_name`."""

    source_queue: str
    original_queue: str
    death_reason: str
    failure_reason: str
    transient: bool
    task_name: str
    error_type: str
    error_message: str
    stack_trace: str
    headers: dict[str, Any] = field(default_factory=dict)
    fingerprint: str = ""


@dataclass(slots=True)
class _Text:
    """One distinct failure text: its fingerprint under the current rules and, once all are mined, its group."""

    found: Found
    reason: str
    transient: bool
    grouper_key: str | None  # None: no error text, grouped by its own fingerprint (never mined)
    group: str = ""


class _Texts:
    """The distinct failure texts met, each fingerprinted once and mined with all the others."""

    def __init__(self) -> None:
        self.grouper = Grouper()
        self.texts: list[_Text] = []
        self._by_text: dict[tuple[str, str, str, str], int | None] = {}
        self._by_name: dict[tuple[str, str, str, str, str], int] = {}

    def index(self, row: Row, *, add: bool = True) -> int | None:
        """The text of a row (COLUMNS); None for a text not met before when `add` is False."""
        _, _, _, error_type, message, stack_trace, reason, transient, *_ = row
        text = (error_type, message, stack_trace, reason)
        if text in self._by_text:
            known = self._by_text[text]
            if known is not None:
                return known
        elif not add:
            return None
        else:
            found = fingerprint(error_type=error_type, message=message, stack_trace=stack_trace)
            if found.kind != "empty":
                key = self.grouper.add(error_type=error_type, message=message, stack_trace=stack_trace, reason=reason)
                self._by_text[text] = len(self.texts)
                self.texts.append(_Text(found=found, reason=reason, transient=transient, grouper_key=key))
                return self._by_text[text]
            self._by_text[text] = None
        # No error text: ingest names the failure after the task or the queue (grouping.fallback_name).
        task_name, death_reason, original_queue, source_queue = row[8:12]
        letter = _Letter(
            source_queue=source_queue,
            original_queue=original_queue,
            death_reason=death_reason,
            failure_reason=reason,
            transient=transient,
            task_name=task_name,
            error_type=error_type,
            error_message=message,
            stack_trace=stack_trace,
        )
        name = fallback_name(letter)
        named = self._by_name.get((*text, name))
        if named is None and add:
            found = fingerprint(error_type=error_type, message=message, stack_trace=stack_trace, fallback=name)
            named = self._by_name[(*text, name)] = len(self.texts)
            self.texts.append(_Text(found=found, reason=reason, transient=transient, grouper_key=None))
        return named

    def mine(self) -> None:
        patterns = self.grouper.patterns()
        for text in self.texts:
            text.group = patterns[text.grouper_key].key if text.grouper_key is not None else text.found.key


@dataclass(frozen=True, slots=True)
class PatternSummary:
    id: int
    template: str
    letters: int  # dead letters read in it


@dataclass(frozen=True, slots=True)
class MergeGroup:
    key: str  # the key of the pattern the current rules give these dead letters
    survivor: PatternSummary
    absorbed: tuple[PatternSummary, ...]


@dataclass(frozen=True, slots=True)
class HeldBack:
    pattern: PatternSummary
    reason: str


@dataclass
class RegroupPlan:
    letters: int
    patterns: int
    merges: list[MergeGroup]
    held_back: list[HeldBack]
    spanning: int  # patterns whose dead letters span several groups: left as they are
    to_file: int  # new fingerprints that would be filed (when every merge goes through)
    unfiled: int  # new fingerprints whose dead letters sit in several patterns: left to ingest
    texts: _Texts
    contents: dict[int, Counter[int]]
    last_letter: int
    last_event: int

    @property
    def distinct(self) -> int:
        return len(self.texts.texts)

    def targets(self, final_of: dict[int, int]) -> tuple[dict[str, int], int]:
        """({new fingerprint key: the one pattern its dead letters are in after the merges}, how many keys have
        theirs in several), for keys that have no Fingerprint row yet."""
        where: dict[str, set[int]] = defaultdict(set)
        for pattern_id, counts in self.contents.items():
            for index in counts:
                where[self.texts.texts[index].found.key].add(final_of.get(pattern_id, pattern_id))
        keys = sorted(where)
        known: set[str] = set()
        for start in range(0, len(keys), FILE_CHUNK):
            chunk = keys[start : start + FILE_CHUNK]
            known.update(Fingerprint.objects.filter(key__in=chunk).values_list("key", flat=True))
        fresh = {key: patterns for key, patterns in where.items() if key not in known}
        single = {key: next(iter(patterns)) for key, patterns in fresh.items() if len(patterns) == 1}
        return single, len(fresh) - len(single)

    def fingerprints(self, keys: Iterable[str]) -> dict[str, Found]:
        wanted = set(keys)
        return {text.found.key: text.found for text in self.texts.texts if text.found.key in wanted}


@dataclass(frozen=True, slots=True)
class MergeOutcome:
    group: MergeGroup
    moved: int
    skipped: str = ""  # why it was not merged


@dataclass
class RegroupResult:
    merged: list[MergeOutcome] = field(default_factory=list)
    skipped: list[MergeOutcome] = field(default_factory=list)
    filed: int = 0
    unfiled: int = 0

    @property
    def moved(self) -> int:
        return sum(outcome.moved for outcome in self.merged)


# Planning ---------------------------------------------------------------------------------------------------------


def _rule_bound() -> dict[int, str]:
    """{pattern id: why it is never merged} for the patterns an operator's rule is bound to."""
    bound: dict[int, str] = {}
    for rule_id, scope_id, pattern_id in FingerprintRule.objects.values_list("pk", "scope_id", "pattern_id"):
        if scope_id is not None:
            bound.setdefault(scope_id, f"split by rule #{rule_id}")
            if pattern_id is not None:
                bound.setdefault(pattern_id, f"split off by rule #{rule_id}")
        elif pattern_id is not None:
            bound.setdefault(pattern_id, f"the pattern of custom rule #{rule_id}")
    return bound


def plan_regroup(*, progress: Callable[[int], None] | None = None) -> RegroupPlan:
    """Read the stored dead letters, group them under the current rules and work out the merges; changes nothing.
    `progress` is called with the number of dead letters read after each chunk."""
    last_letter = DeadLetter.objects.aggregate(last=Max("pk"))["last"] or 0
    last_event = PatternEvent.objects.aggregate(last=Max("pk"))["last"] or 0
    # Dead letters filed by a custom rule that applies everywhere were never fingerprinted by ingest: not mined.
    unmined = {
        FingerprintRule(pk=pk).fingerprint_key
        for pk in FingerprintRule.objects.filter(scope=None).values_list("pk", flat=True)
    }
    texts = _Texts()
    contents: dict[int, Counter[int]] = defaultdict(Counter)
    by_rule: dict[int, set[str]] = defaultdict(set)
    letters: Counter[int] = Counter()
    after = read = 0
    while True:
        rows = list(
            DeadLetter.objects.filter(pk__gt=after, pk__lte=last_letter)
            .order_by("pk")
            .values_list(*COLUMNS)[:READ_CHUNK]
        )
        for row in rows:
            pattern_id, key = row[1], row[2]
            letters[pattern_id] += 1
            if key.startswith(RULE_PREFIX):
                # Filed by a rule: where the rule put it, whatever its text says.
                by_rule[pattern_id].add(key)
                if key not in unmined:
                    texts.index(row)
                continue
            index = texts.index(row)
            assert index is not None
            contents[pattern_id][index] += 1
        read += len(rows)
        if rows:
            after = rows[-1][0]
            if progress is not None:
                progress(read)
        if len(rows) < READ_CHUNK:
            break
    texts.mine()

    info = _patterns(letters)
    bound = _rule_bound()
    inside: dict[str, list[int]] = defaultdict(list)
    spanning = 0
    for pattern_id in sorted(letters):
        if pattern_id not in info or info[pattern_id][2] is not None:
            continue  # gone, or merged away while this read
        groups = {texts.texts[index].group for index in contents[pattern_id]} | by_rule[pattern_id]
        if len(groups) > 1:
            spanning += 1
        elif groups and not next(iter(groups)).startswith(RULE_PREFIX):
            inside[next(iter(groups))].append(pattern_id)

    def summary(pattern_id: int) -> PatternSummary:
        return PatternSummary(id=pattern_id, template=info[pattern_id][0], letters=letters[pattern_id])

    merges: list[MergeGroup] = []
    held_back: list[HeldBack] = []
    for key, pattern_ids in sorted(inside.items(), key=lambda item: min(item[1])):
        if len(pattern_ids) < 2:
            continue
        why = {
            pk: bound.get(pk) or ("a rule's pattern" if info[pk][1] == PatternOrigin.RULE else "") for pk in pattern_ids
        }
        free = [pk for pk in pattern_ids if not why[pk]]
        held_back += [HeldBack(summary(pk), why[pk]) for pk in pattern_ids if why[pk]]
        if len(free) < 2:
            continue
        # The busiest survives (the fewest rows move), the oldest among equals.
        survivor = max(free, key=lambda pk: (letters[pk], -pk))
        absorbed = sorted((pk for pk in free if pk != survivor), key=lambda pk: (-letters[pk], pk))
        merges.append(MergeGroup(key=key, survivor=summary(survivor), absorbed=tuple(map(summary, absorbed))))

    plan = RegroupPlan(
        letters=read,
        patterns=len(letters),
        merges=merges,
        held_back=held_back,
        spanning=spanning,
        to_file=0,
        unfiled=0,
        texts=texts,
        contents=contents,
        last_letter=last_letter,
        last_event=last_event,
    )
    targets, plan.unfiled = plan.targets(_final_of(merges))
    plan.to_file = len(targets)
    return plan


def _patterns(pattern_ids: Iterable[int]) -> dict[int, tuple[str, str, int | None]]:
    """{id: (template, origin, merged_into_id)}."""
    ids = sorted(pattern_ids)
    found: dict[int, tuple[str, str, int | None]] = {}
    for start in range(0, len(ids), FILE_CHUNK):
        rows = FailurePattern.objects.filter(pk__in=ids[start : start + FILE_CHUNK]).values_list(
            "pk", "template", "origin", "merged_into_id"
        )
        found.update((pk, (template, origin, merged_into)) for pk, template, origin, merged_into in rows)
    return found


def _final_of(merges: Iterable[MergeGroup]) -> dict[int, int]:
    return {absorbed.id: group.survivor.id for group in merges for absorbed in group.absorbed}


# Applying ---------------------------------------------------------------------------------------------------------


def apply_regroup(
    plan: RegroupPlan,
    *,
    actor: Actor,
    now: dt.datetime | None = None,
    report: Callable[[MergeOutcome], None] | None = None,
) -> RegroupResult:
    """Merge each group of the plan (one transaction each), then file the new fingerprints. `report` is called
    with each merge's outcome as it is done."""
    now = now or timezone.now()
    result = RegroupResult()
    for group in plan.merges:
        try:
            outcome = _merge(plan, group, actor=actor, now=now)
        except PatternError as error:
            outcome = MergeOutcome(group=group, moved=0, skipped=str(error))
        (result.skipped if outcome.skipped else result.merged).append(outcome)
        if report is not None:
            report(outcome)
    targets, result.unfiled = plan.targets(_final_of(outcome.group for outcome in result.merged))
    keys = sorted(targets)
    founds = plan.fingerprints(keys)
    for start in range(0, len(keys), FILE_CHUNK):
        chunk = keys[start : start + FILE_CHUNK]
        result.filed += _file({key: founds[key] for key in chunk}, {key: targets[key] for key in chunk}, now=now)
    if result.filed:
        record_audit(
            actor=actor,
            action="pattern.regroup",
            target="fingerprints",
            count=result.filed,
            detail="filed the fingerprints the current grouping rules give stored dead letters under their patterns",
            now=now,
        )
    return result


def _merge(plan: RegroupPlan, group: MergeGroup, *, actor: Actor, now: dt.datetime) -> MergeOutcome:
    ids = sorted([group.survivor.id, *(pattern.id for pattern in group.absorbed)])
    with transaction.atomic():
        lock_fingerprints(pattern_ids=ids)
        locked = {
            pattern.pk: pattern
            for pattern in FailurePattern.objects.select_for_update().filter(pk__in=ids).order_by("pk")
        }
        changed = _changed(plan, group, ids, locked)
        if changed:
            return MergeOutcome(group=group, moved=0, skipped=changed)
        survivor = locked[group.survivor.id]
        moved = 0
        for pattern in group.absorbed:
            moved += absorb_pattern(
                source=locked[pattern.id], target=survivor, actor=actor, now=now, detail=DETAIL, carry_triage=True
            )
        record_audit(
            actor=actor,
            action="pattern.regroup",
            target=f"pattern #{survivor.pk}",
            count=moved,
            detail="merged "
            + ", ".join(f"#{pattern.id}" for pattern in group.absorbed)
            + f" into #{survivor.pk}: same pattern under the current grouping rules",
            now=now,
        )
    return MergeOutcome(group=group, moved=moved)


def _changed(plan: RegroupPlan, group: MergeGroup, ids: list[int], locked: dict[int, FailurePattern]) -> str:
    """Why the group's patterns may no longer be merged as planned ("" when they may): checked under the locks."""
    for pk in ids:
        if pk not in locked:
            return f"#{pk} no longer exists"
        if locked[pk].merged_into_id is not None:
            return f"#{pk} was merged into #{locked[pk].merged_into_id} meanwhile"
    rule = FingerprintRule.objects.filter(Q(scope_id__in=ids) | Q(pattern_id__in=ids)).first()
    if rule is not None:
        return f"rule #{rule.pk} was made for #{rule.scope_id or rule.pattern_id} meanwhile"
    moves = PatternEvent.objects.filter(
        pattern_id__in=ids, pk__gt=plan.last_event, kind__in=[PatternEvent.Kind.MERGED, PatternEvent.Kind.SPLIT]
    )
    if moves.exists():
        return "dead letters were moved into or out of these patterns meanwhile"
    read = {pattern.id: pattern.letters for pattern in (group.survivor, *group.absorbed)}
    now_there = (
        DeadLetter.objects.filter(pattern_id__in=ids, pk__lte=plan.last_letter)
        .values_list("pattern_id")
        .annotate(n=Count("pk"))
        .order_by()
    )
    for pk, count in now_there:
        if count > read[pk]:
            return f"#{pk} holds dead letters that were filed while regroup read"
    arrived = DeadLetter.objects.filter(pattern_id__in=ids, pk__gt=plan.last_letter).values_list(*COLUMNS)
    for row in arrived.iterator(chunk_size=READ_CHUNK):
        index = None if row[2].startswith(RULE_PREFIX) else plan.texts.index(row, add=False)
        if index is None or plan.texts.texts[index].group != group.key:
            return f"#{row[1]} took dead letters of another kind meanwhile (#{row[0]})"
    return ""


KINDS = {"text": FingerprintKind.TEXT, "trace": FingerprintKind.TRACE}


def _file(founds: dict[str, Found], targets: dict[str, int], *, now: dt.datetime) -> int:
    """File new fingerprints under the patterns that hold their dead letters ({key: pattern id}), in one
    transaction; returns how many were filed. Filed as a rule's fingerprint is, outside any cluster: mining never
    moves them (a group that mining would key differently from the pattern they are filed under would take them
    away at the cluster's next mining), and new arrivals with them go straight to their pattern."""
    with transaction.atomic():
        known = set(Fingerprint.objects.filter(key__in=sorted(founds)).values_list("key", flat=True))
        fresh = sorted(set(founds) - known)
        if not fresh:
            return 0
        wanted = sorted({targets[key] for key in fresh})
        lock_fingerprints(pattern_ids=wanted)
        list(FailurePattern.objects.select_for_update().filter(pk__in=wanted).order_by("pk").values_list("pk"))
        # A pattern merged away since the merges: where it went.
        finals = resolve(wanted)
        Fingerprint.objects.bulk_create(
            [
                Fingerprint(
                    key=key,
                    kind=KINDS.get(founds[key].kind, FingerprintKind.EMPTY),
                    template=founds[key].template,
                    error_type=founds[key].error_type[:255],
                    tokens=list(founds[key].tokens),
                    pattern_id=finals[targets[key]],
                    auto_pattern_id=finals[targets[key]],
                    created_at=now,
                )
                for key in fresh
            ],
            ignore_conflicts=True,
        )
        # Ingest may have filed one of them meanwhile, elsewhere: that one stays as ingest filed it.
        return Fingerprint.objects.filter(key__in=fresh, created_at=now, cluster=None).count()
