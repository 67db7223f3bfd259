"""Pattern services: triage (status, owner, note) and merging, and moving dead letters between patterns (which
merges, splits and ingest's regrouping share). Custom fingerprint rules and splits are in rule_services.py.

Every service is keyword-only, records its history (PatternEvent) and an audit row, raises PatternError with
a message fit to show an operator, and keeps DeadLetterCount exact when dead letters change pattern.

Contracts the pages, the admin and the CLI rely on (keep them stable):
- set_pattern_status(*, pattern, status, actor, note="") -> FailurePattern
- assign_pattern(*, pattern, owner, actor, note=None) -> FailurePattern      (owner None: nobody)
- set_pattern_note(*, pattern, note, actor) -> FailurePattern
- owner_refusal(owner) -> str                                               (why they cannot own one; "": they can)
- merge_patterns(*, target, actor, sources=(), source=None) -> int           (dead letters moved)
- merge_warnings(*, target, sources) -> list[str]                          (what differs, for a preview)

Settings of the apps above this one that watch one pattern (an alert rule's scope, a retry policy's) follow a
merge to the pattern that absorbs it: those apps lend them when they load (`register_pattern_scope`, called from
their AppConfig.ready), as this app cannot import theirs.

Who may call what is the caller's check (dlqconsole.accounts.roles): triage, merge and split are operator
actions on the pages; custom rules are configuration, admin only.

Locking order, shared with ingest (dlqconsole.deadletters.grouping.store), so that nothing can deadlock:
cluster rows, then fingerprint rows (by key), then pattern rows (by id), then dead letters and counters. A
merge or a split locks the fingerprints of every pattern it touches with FOR UPDATE; ingest holds a share lock
on the fingerprints it files under until its batch commits. So a merge waits for batches already filing into
its patterns, and batches that come after it see where the merge put things.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import connection, models, transaction
from django.template.defaultfilters import pluralize
from django.utils import timezone

from dlqconsole.accounts.roles import OPERATOR, has_role
from dlqconsole.accounts.services import record_audit
from dlqconsole.deadletters.counters import add_counts, add_pattern_arrivals, arrival_hour, transfer_pattern_arrivals
from dlqconsole.deadletters.models import (
    DeadLetter,
    FailurePattern,
    Fingerprint,
    FingerprintRule,
    PatternEvent,
    PatternStatus,
)

Actor = AbstractBaseUser | AnonymousUser | None
# Dead letters are moved between patterns in chunks of this many rows, each chunk one UPDATE ... RETURNING.
MOVE_CHUNK = 5000


class PatternError(Exception):
    """A pattern operation that cannot be done; the message says why, in words an operator understands."""


def acting_user(actor: Actor) -> Any:
    return actor if actor is not None and getattr(actor, "is_authenticated", False) else None


def lock_active_pattern(pattern: FailurePattern) -> FailurePattern:
    """The pattern's current row, locked; refuses a pattern that was merged away."""
    locked = FailurePattern.objects.select_for_update().get(pk=pattern.pk)
    if locked.merged_into_id is not None:
        raise PatternError(f"Pattern #{locked.pk} was merged into #{locked.merged_into_id}; use that one.")
    return locked


# Triage --------------------------------------------------------------------------------------------------------


def set_pattern_status(
    *, pattern: FailurePattern, status: str, actor: Actor, note: str = "", now: dt.datetime | None = None
) -> FailurePattern:
    """Open, acknowledge, resolve or ignore a pattern. A resolved pattern reopens by itself when a new dead
    letter arrives in it; an ignored one stays ignored (and out of alerts)."""
    if status not in PatternStatus.values:
        choices = ", ".join(PatternStatus.values)
        raise PatternError(f"'{status}' is not a pattern status; choose one of {choices}.")
    now = now or timezone.now()
    with transaction.atomic():
        locked = lock_active_pattern(pattern)
        previous = locked.status
        if previous == status and not note:
            return locked
        locked.status = status
        locked.status_changed_at = now
        locked.save(update_fields=["status", "status_changed_at"])
        PatternEvent.objects.create(
            pattern=locked,
            kind=PatternEvent.Kind.STATUS,
            from_status=previous,
            to_status=status,
            detail=note,
            actor=acting_user(actor),
            created_at=now,
        )
        record_audit(
            actor=actor,
            action="pattern.status",
            target=f"pattern #{locked.pk}",
            detail=f"{previous} → {status}" + (f": {note}" if note else ""),
        )
    return locked


def assign_pattern(
    *, pattern: FailurePattern, owner: Any, actor: Actor, note: str | None = None, now: dt.datetime | None = None
) -> FailurePattern:
    """Give a pattern an owner (None: nobody) and, when `note` is given, replace its note."""
    refusal = owner_refusal(owner) if owner is not None else ""
    if refusal:
        raise PatternError(refusal)
    return _change_owner_or_note(pattern=pattern, owner=owner, change_owner=True, note=note, actor=actor, now=now)


def owner_refusal(owner: Any) -> str:
    """Why a user cannot own a pattern ("" when they can): owners act on it, so only active operators and admins
    may. The pattern page's form asks it too, to refuse the choice before anything is saved."""
    if not getattr(owner, "is_active", False):
        return f"{owner} is not an active user and cannot own a pattern."
    if not has_role(owner, OPERATOR):
        return f"{owner} may only read (viewer) and cannot own a pattern; owners act on it."
    return ""


def set_pattern_note(
    *, pattern: FailurePattern, note: str, actor: Actor, now: dt.datetime | None = None
) -> FailurePattern:
    """Replace a pattern's note, leaving its owner as it is."""
    return _change_owner_or_note(pattern=pattern, owner=None, change_owner=False, note=note, actor=actor, now=now)


def _change_owner_or_note(
    *,
    pattern: FailurePattern,
    owner: Any,
    change_owner: bool,
    note: str | None,
    actor: Actor,
    now: dt.datetime | None,
) -> FailurePattern:
    now = now or timezone.now()
    with transaction.atomic():
        locked = lock_active_pattern(pattern)
        changes: list[str] = []
        if change_owner and locked.owner_id != (owner.pk if owner is not None else None):
            before = locked.owner.get_username() if locked.owner is not None else "nobody"
            after = owner.get_username() if owner is not None else "nobody"
            changes.append(f"owner {before} → {after}")
            locked.owner = owner
        if note is not None and note != locked.note:
            changes.append("note changed")
            locked.note = note
        if not changes:
            return locked
        locked.save(update_fields=["owner", "note"])
        detail = "; ".join(changes)
        PatternEvent.objects.create(
            pattern=locked, kind=PatternEvent.Kind.NOTE, detail=detail, actor=acting_user(actor), created_at=now
        )
        record_audit(actor=actor, action="pattern.assign", target=f"pattern #{locked.pk}", detail=detail)
    return locked


# Moving dead letters between patterns ---------------------------------------------------------------------------


def lock_fingerprints(*, pattern_ids: Iterable[int]) -> None:
    """Lock (FOR UPDATE, in key order) the fingerprints filed under these patterns: waits for ingest batches
    that are filing into them, and holds back the ones that come next until this transaction commits."""
    ids = sorted(set(pattern_ids))
    if ids:
        list(Fingerprint.objects.select_for_update().filter(pattern_id__in=ids).order_by("key").values_list("pk"))


def move_dead_letters(
    *,
    source_id: int,
    target_id: int,
    fingerprints: Sequence[str] | None = None,
    ids: Sequence[int] | None = None,
    new_fingerprint: str | None = None,
) -> tuple[int, dt.datetime | None, dt.datetime | None]:
    """Move dead letters of pattern `source_id` (all of them, those with one of `fingerprints`, or those with
    one of `ids`) to `target_id`, and the counters with them: the status cells, and the hourly arrival counts of
    the sparklines (all of them when the whole pattern moves, purged arrivals included; else those of the dead
    letters moved). Returns (moved, earliest, latest ingested_at)."""
    table = DeadLetter._meta.db_table
    moved: Counter[tuple[int, str, str, str]] = Counter()
    hours: Counter[dt.datetime] = Counter()
    earliest: dt.datetime | None = None
    latest: dt.datetime | None = None
    set_sql = "pattern_id = %s" + (", fingerprint = %s" if new_fingerprint is not None else "")
    set_params: list[Any] = [target_id] + ([new_fingerprint] if new_fingerprint is not None else [])
    selections: list[tuple[str, list[Any]]]
    if ids is not None:
        chosen = sorted(ids)
        selections = [
            (f"id IN ({','.join(['%s'] * len(part))})", list(part))
            for part in (chosen[start : start + MOVE_CHUNK] for start in range(0, len(chosen), MOVE_CHUNK))
            if part
        ]
    elif fingerprints is not None:
        keys = sorted(set(fingerprints))
        selections = [(f"fingerprint IN ({','.join(['%s'] * len(keys))})", keys)] if keys else []
    else:
        selections = [("1 = 1", [])]
    with connection.cursor() as cursor:
        for condition, params in selections:
            while True:
                cursor.execute(
                    f"UPDATE {table} SET {set_sql} WHERE id IN (SELECT id FROM {table} WHERE pattern_id = %s "
                    f"AND {condition} LIMIT %s) RETURNING broker_id, source_queue, failure_reason, status, ingested_at",
                    [*set_params, source_id, *params, MOVE_CHUNK],
                )
                rows = cursor.fetchall()
                for broker_id, queue, reason, status, ingested_at in rows:
                    moved[(broker_id, queue, reason, status)] += 1
                    if isinstance(ingested_at, str):
                        ingested_at = dt.datetime.fromisoformat(ingested_at)
                    if ingested_at is not None and timezone.is_naive(ingested_at):
                        ingested_at = timezone.make_aware(ingested_at, dt.UTC)
                    if ingested_at is not None:
                        hours[arrival_hour(ingested_at)] += 1
                    earliest = ingested_at if earliest is None or ingested_at < earliest else earliest
                    latest = ingested_at if latest is None or ingested_at > latest else latest
                if len(rows) < MOVE_CHUNK:
                    break
    changes = [(broker, queue, source_id, reason, status, -n) for (broker, queue, reason, status), n in moved.items()]
    changes += [(broker, queue, target_id, reason, status, n) for (broker, queue, reason, status), n in moved.items()]
    add_counts(changes)
    if ids is None and fingerprints is None:
        transfer_pattern_arrivals(source_id=source_id, target_id=target_id)
    else:
        add_pattern_arrivals(
            [(source_id, hour, -n) for hour, n in hours.items()] + [(target_id, hour, n) for hour, n in hours.items()]
        )
    return sum(moved.values()), earliest, latest


# (model, name of its foreign key to FailurePattern) of the settings that watch one pattern; see the module's doc.
_pattern_scopes: list[tuple[type[models.Model], str]] = []


def register_pattern_scope(model: type[models.Model], field: str = "pattern") -> None:
    """Have merges move `model` rows whose `field` names the absorbed pattern to the pattern that absorbs it (an
    alert rule watching a merged-away pattern would never fire again, a retry policy scoped to it never match)."""
    if (model, field) not in _pattern_scopes:
        _pattern_scopes.append((model, field))


def pattern_scopes() -> list[tuple[type[models.Model], str]]:
    return list(_pattern_scopes)


def _move_scopes(*, source_id: int, target_id: int) -> list[str]:
    """Point the registered settings of `source_id` at `target_id`; what moved, as "2 alert rules"."""
    moved: list[str] = []
    for model, field in _pattern_scopes:
        count = model._default_manager.filter(**{f"{field}_id": source_id}).update(**{f"{field}_id": target_id})
        if count:
            name = model._meta.verbose_name if count == 1 else model._meta.verbose_name_plural
            moved.append(f"{count} {name}")
    return moved


def _carry_triage(*, source: FailurePattern, target: FailurePattern) -> tuple[list[str], list[str]]:
    """Fill in the target's triage from the source's where the target has none of its own: an acknowledgement when
    the target is open, the owner when it has none (and the source's may still own one), and the note, appended under
    the source's number when the target has one. Returns (fields changed, what was taken, for the history).
    A source's "ignored" or "resolved" does not carry: it would silence the alerts of an open pattern that is still
    failing for the failures the source never held."""
    fields: list[str] = []
    taken: list[str] = []
    if target.status == PatternStatus.OPEN and source.status == PatternStatus.ACKNOWLEDGED:
        target.status = source.status
        target.status_changed_at = source.status_changed_at
        fields += ["status", "status_changed_at"]
        taken.append(f"status {source.status}")
    owner = source.owner if target.owner_id is None else None
    if owner is not None and not owner_refusal(owner):
        target.owner = owner
        fields.append("owner")
        taken.append(f"owner {owner.get_username()}")
    note = source.note.strip()
    if note and note not in target.note:
        target.note = f"{target.note.rstrip()}\n\n#{source.pk}: {note}" if target.note.strip() else note
        fields.append("note")
        taken.append("note")
    return fields, taken


def absorb_pattern(
    *,
    source: FailurePattern,
    target: FailurePattern,
    actor: Actor,
    now: dt.datetime,
    detail: str,
    inherit_triage: bool = False,
    carry_triage: bool = False,
) -> int:
    """Fold `source` into `target`: its fingerprints, dead letters, counters, history totals, merge chain, split
    rules and the settings that watch it (register_pattern_scope). The caller holds the locks (lock_fingerprints,
    then both pattern rows). Returns letters moved.

    Triage: `inherit_triage` gives the target the source's status, owner and note, whatever it had (a pattern
    created by grouping a moment ago has none of its own); `carry_triage` only fills in what the target lacks
    (_carry_triage). Without either, the target keeps its own triage and the source's is left on the source."""
    Fingerprint.objects.filter(pattern_id=source.pk).update(pattern_id=target.pk)
    moved, _, _ = move_dead_letters(source_id=source.pk, target_id=target.pk)
    # Keep merge chains one hop long: what pointed at the source now points at the target.
    FailurePattern.objects.filter(merged_into_id=source.pk).update(merged_into_id=target.pk)
    FingerprintRule.objects.filter(scope_id=source.pk).update(scope_id=target.pk)
    scopes = _move_scopes(source_id=source.pk, target_id=target.pk)
    absorbed_total = source.total_count
    # The source's history now belongs to the target (the events say how much it brought), so that the totals
    # of all patterns still add up to the dead letters ever ingested.
    target.total_count += source.total_count
    source.merged_into = target
    source.merged_at = now
    source.total_count = 0
    source.save(update_fields=["merged_into", "merged_at", "total_count"])
    target.first_seen_at = min(target.first_seen_at, source.first_seen_at)
    target.last_seen_at = max(target.last_seen_at, source.last_seen_at)
    fields = ["total_count", "first_seen_at", "last_seen_at"]
    taken: list[str] = []
    if inherit_triage:
        target.status = source.status
        target.status_changed_at = source.status_changed_at
        target.owner_id = source.owner_id
        target.note = source.note
        fields += ["status", "status_changed_at", "owner", "note"]
    elif carry_triage:
        carried, taken = _carry_triage(source=source, target=target)
        fields += carried
    target.save(update_fields=fields)
    absorbed = f"Absorbed #{source.pk} ({moved} dead letter{pluralize(moved)}, {absorbed_total} in all): {detail}"
    if taken:
        absorbed += f"; took its {', '.join(taken)}"
    if scopes:
        absorbed += f"; moved here: {', '.join(scopes)} that watched it"
    record_on_both_sides(
        PatternEvent.Kind.MERGED,
        {source: f"Merged into #{target.pk}: {detail}", target: absorbed},
        actor=actor,
        now=now,
    )
    return moved


def record_on_both_sides(kind: str, details: dict[FailurePattern, str], *, actor: Actor, now: dt.datetime) -> None:
    """One history event on each pattern a merge or split touched, each told from its own side."""
    user = acting_user(actor)
    PatternEvent.objects.bulk_create(
        PatternEvent(pattern=pattern, kind=kind, detail=detail, actor=user, created_at=now)
        for pattern, detail in details.items()
    )


def merge_warnings(*, target: FailurePattern, sources: Sequence[FailurePattern]) -> list[str]:
    """What an operator should know before merging `sources` into `target`: the differences that mean the merged
    pattern would hold failures of different causes (and one bulk retry would replay them all)."""
    warnings: list[str] = []
    for pattern in sources:
        differences = []
        if pattern.error_type != target.error_type:
            differences.append(f"error type {pattern.error_type or '(none)'} (target: {target.error_type or '(none)'})")
        if pattern.failure_reason != target.failure_reason:
            differences.append(f"reason {pattern.failure_reason} (target: {target.failure_reason})")
        if pattern.transient != target.transient:
            kind = "transient" if pattern.transient else "permanent"
            differences.append(f"a {kind} failure (the target's is not)")
        if differences:
            warnings.append(f"#{pattern.pk} has " + ", ".join(differences) + ".")
        if pattern.status != target.status and pattern.status != PatternStatus.OPEN:
            warnings.append(f"#{pattern.pk} is {pattern.status}; the merged pattern keeps the target's status.")
    return warnings


def merge_patterns(
    *,
    target: FailurePattern,
    actor: Actor,
    sources: Sequence[FailurePattern] = (),
    source: FailurePattern | None = None,
    now: dt.datetime | None = None,
) -> int:
    """Merge one pattern (`source`) or several (`sources`) into `target`. Their dead letters, counters and
    fingerprints move to the target, and new arrivals with their fingerprints are filed there from now on.
    Returns the number of dead letters moved."""
    chosen = list(sources) + ([source] if source is not None else [])
    source_ids = sorted({pattern.pk for pattern in chosen})
    if not source_ids:
        raise PatternError("Choose at least one pattern to merge.")
    if target.pk in source_ids:
        raise PatternError(f"Pattern #{target.pk} cannot be merged into itself.")
    now = now or timezone.now()
    with transaction.atomic():
        lock_fingerprints(pattern_ids=[*source_ids, target.pk])
        locked = {
            pattern.pk: pattern
            for pattern in FailurePattern.objects.select_for_update()
            .filter(pk__in=[*source_ids, target.pk])
            .order_by("pk")
        }
        missing = [pk for pk in [*source_ids, target.pk] if pk not in locked]
        if missing:
            raise PatternError(f"Pattern #{missing[0]} does not exist.")
        for pk in [*source_ids, target.pk]:
            if locked[pk].merged_into_id is not None:
                raise PatternError(f"Pattern #{pk} was already merged into #{locked[pk].merged_into_id}.")
        moved = 0
        for pk in source_ids:
            moved += absorb_pattern(
                source=locked[pk], target=locked[target.pk], actor=actor, now=now, detail="merged by an operator"
            )
        record_audit(
            actor=actor,
            action="pattern.merge",
            target=f"pattern #{target.pk}",
            count=moved,
            detail="merged " + ", ".join(f"#{pk}" for pk in source_ids) + f" into #{target.pk}",
        )
    target.refresh_from_db()
    return moved
