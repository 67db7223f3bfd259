"""Pattern services: triage (status, owner, note), merging, splitting and custom fingerprint rules.

Every service is keyword-only, records its history (PatternEvent) and an audit row, raises PatternError with
a message fit to show an operator, and keeps DeadLetterCount exact when dead letters change pattern.

Contracts the pages, the admin and the CLI rely on (keep them stable):
- set_pattern_status(*, pattern, status, actor, note="") -> FailurePattern
- assign_pattern(*, pattern, owner, actor, note=None) -> FailurePattern      (owner None: nobody)
- set_pattern_note(*, pattern, note, actor) -> FailurePattern
- merge_patterns(*, target, actor, sources=(), source=None) -> int           (dead letters moved)
- merge_warnings(*, target, sources) -> list[str]                          (what differs, for a preview)
- split_pattern(*, pattern, name, actor, regex="", header="") -> FailurePattern   (the new pattern)
- split_preview(*, pattern, regex="", header="", examples=5) -> SplitPreview (the same, with examples)
- save_fingerprint_rule(*, rule, actor) -> FingerprintRule                 (create or edit; the admin uses it)
- delete_fingerprint_rule(*, rule, actor) -> None
- validate_rule(*, name, regex, header, rule_id=None) -> None   (raises PatternError; for forms)

Who may call what is the caller's check (dlqconsole.accounts.roles): triage, merge and split are operator
actions on the pages; custom rules are configuration, admin only.

Locking order, shared with ingest (dlqconsole.deadletters.grouping.store), so that nothing can deadlock:
cluster rows, then fingerprint rows (by key), then pattern rows (by id), then dead letters and counters. A
merge or a split locks the fingerprints of every pattern it touches with FOR UPDATE; ingest holds a share lock
on the fingerprints it files under until its batch commits. So a merge waits for batches already filing into
its patterns, and batches that come after it see where the merge put things.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import re
import time
from collections import Counter
from collections.abc import Generator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import connection, transaction
from django.template.defaultfilters import pluralize
from django.utils import timezone

from dlqconsole.accounts.roles import OPERATOR, has_role
from dlqconsole.accounts.services import record_audit
from dlqconsole.deadletters.counters import add_counts, add_pattern_arrivals, arrival_hour, transfer_pattern_arrivals
from dlqconsole.deadletters.grouping.rules import (
    MATCH_TIMEOUT,
    RuleTooSlowError,
    compile_rule,
    forget_rules,
    matches,
    search,
)
from dlqconsole.deadletters.models import (
    DeadLetter,
    FailurePattern,
    FailureReason,
    Fingerprint,
    FingerprintKind,
    FingerprintRule,
    PatternEvent,
    PatternOrigin,
    PatternStatus,
)

logger = logging.getLogger(__name__)

Actor = AbstractBaseUser | AnonymousUser | None
# Dead letters are moved between patterns in chunks of this many rows, each chunk one UPDATE ... RETURNING.
MOVE_CHUNK = 5000


class PatternError(Exception):
    """A pattern operation that cannot be done; the message says why, in words an operator understands."""


def _user(actor: Actor) -> Any:
    return actor if actor is not None and getattr(actor, "is_authenticated", False) else None


def _active(pattern: FailurePattern) -> FailurePattern:
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
        locked = _active(pattern)
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
            actor=_user(actor),
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
    if owner is not None and not getattr(owner, "is_active", False):
        raise PatternError(f"{owner} is not an active user and cannot own a pattern.")
    if owner is not None and not has_role(owner, OPERATOR):
        raise PatternError(f"{owner} may only read (viewer) and cannot own a pattern; owners act on it.")
    return _change_owner_or_note(pattern=pattern, owner=owner, change_owner=True, note=note, actor=actor, now=now)


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
        locked = _active(pattern)
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
            pattern=locked, kind=PatternEvent.Kind.NOTE, detail=detail, actor=_user(actor), created_at=now
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
    moved: Counter[tuple[str, str, str]] = Counter()
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
                    f"AND {condition} LIMIT %s) RETURNING source_queue, failure_reason, status, ingested_at",
                    [*set_params, source_id, *params, MOVE_CHUNK],
                )
                rows = cursor.fetchall()
                for queue, reason, status, ingested_at in rows:
                    moved[(queue, reason, status)] += 1
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
    changes = [(queue, source_id, reason, status, -n) for (queue, reason, status), n in moved.items()]
    changes += [(queue, target_id, reason, status, n) for (queue, reason, status), n in moved.items()]
    add_counts(changes)
    if ids is None and fingerprints is None:
        transfer_pattern_arrivals(source_id=source_id, target_id=target_id)
    else:
        add_pattern_arrivals(
            [(source_id, hour, -n) for hour, n in hours.items()] + [(target_id, hour, n) for hour, n in hours.items()]
        )
    return sum(moved.values()), earliest, latest


def absorb_pattern(
    *,
    source: FailurePattern,
    target: FailurePattern,
    actor: Actor,
    now: dt.datetime,
    detail: str,
    inherit_triage: bool = False,
) -> int:
    """Fold `source` into `target`: its fingerprints, dead letters, counters, history totals, merge chain and
    split rules. The caller holds the locks (lock_fingerprints, then both pattern rows). Returns letters moved."""
    Fingerprint.objects.filter(pattern_id=source.pk).update(pattern_id=target.pk)
    moved, _, _ = move_dead_letters(source_id=source.pk, target_id=target.pk)
    # Keep merge chains one hop long: what pointed at the source now points at the target.
    FailurePattern.objects.filter(merged_into_id=source.pk).update(merged_into_id=target.pk)
    FingerprintRule.objects.filter(scope_id=source.pk).update(scope_id=target.pk)
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
    if inherit_triage:
        target.status = source.status
        target.status_changed_at = source.status_changed_at
        target.owner_id = source.owner_id
        target.note = source.note
        fields += ["status", "status_changed_at", "owner", "note"]
    target.save(update_fields=fields)
    _record_both(
        PatternEvent.Kind.MERGED,
        {
            source: f"Merged into #{target.pk}: {detail}",
            target: f"Absorbed #{source.pk} ({moved} dead letter{pluralize(moved)}, {absorbed_total} in all): {detail}",
        },
        actor=actor,
        now=now,
    )
    return moved


def _record_both(kind: str, details: dict[FailurePattern, str], *, actor: Actor, now: dt.datetime) -> None:
    """One history event on each pattern a merge or split touched, each told from its own side."""
    user = _user(actor)
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


# Rules and splits -----------------------------------------------------------------------------------------------


def _forget_rules() -> None:
    # Also when the transaction rolls back: the next batch simply reads the rules again.
    forget_rules()


def validate_rule(*, name: str, regex: str, header: str, rule_id: int | None = None) -> None:
    """Refuses a rule without a name or anything to match, an expression that does not compile, and a name
    already taken by another rule or pattern (two patterns of one name cannot be told apart on the pages)."""
    name = name.strip()
    if not name:
        raise PatternError("Give the rule a name; it becomes the template of its pattern.")
    if "\x00" in name:
        raise PatternError("A rule's name cannot hold a NUL character.")
    _check_length("name", name, FingerprintRule._meta.get_field("name").max_length)
    _validate_match(regex=regex, header=header)
    other_rules = FingerprintRule.objects.filter(name__iexact=name)
    patterns = FailurePattern.objects.active().filter(template__iexact=name)
    if rule_id is not None:
        other_rules = other_rules.exclude(pk=rule_id)
        patterns = patterns.exclude(rules__pk=rule_id)
    other_rule = other_rules.first()
    if other_rule is not None:
        raise PatternError(f"Rule #{other_rule.pk} is already named “{other_rule.name}”; choose another name.")
    taken = patterns.first()
    if taken is not None:
        raise PatternError(f"Pattern #{taken.pk} already has this name; choose another one.")


def _check_length(what: str, value: str, limit: int | None) -> None:
    if limit is not None and len(value) > limit:
        raise PatternError(f"The rule's {what} is {len(value):,} characters long; at most {limit:,} fit.")


def _validate_match(*, regex: str, header: str) -> None:
    if "\x00" in regex or "\x00" in header:
        raise PatternError("A rule cannot hold a NUL character.")
    _check_length("regular expression", regex, FingerprintRule._meta.get_field("regex").max_length)
    _check_length("header name", header.strip(), FingerprintRule._meta.get_field("header").max_length)
    if not regex and not header.strip():
        raise PatternError("A rule needs a regular expression, a header, or both.")
    if regex:
        try:
            re.compile(regex)
        except re.error as problem:
            raise PatternError(f"The regular expression does not compile: {problem}.") from None
        _refuse_catastrophic(regex)


# Texts on which an expression that backtracks without end (overlapping alternatives repeated, (a|aa)+$) runs out of
# time: a long run of one kind of character that does not end the way the expression wants. (The regex module
# answers some classic ones, (x+x+)+y, at once; those pass.)
BACKTRACKING_PROBES = tuple(character * 40 + end for character in "ax1 .-_/" for end in ("!", "\n"))


def _refuse_catastrophic(expression: str) -> None:
    """Refuse, when it is saved, an expression that a search bounds only by its timeout: at ingest every message
    it meets would cost up to two timeouts (MATCH_TIMEOUT each), and it would match by the clock, not the text."""
    rule = compile_rule(FingerprintRule(name="probe", regex=expression))
    for probe in BACKTRACKING_PROBES:
        try:
            search(rule, probe, strict=True)
        except RuleTooSlowError:
            shown = repr(probe[:1] * 3 + "…" + probe[-1])
            raise PatternError(
                f"The regular expression backtracks without end on a text like {shown} (one search took over "
                f"{MATCH_TIMEOUT * 1000:.0f} ms): make it simpler, without repeated alternatives that overlap such as "
                "(a|aa)+."
            ) from None


def ensure_rule_pattern(
    *, rule: FingerprintRule, now: dt.datetime, error_type: str = "", reason: str = FailureReason.UNKNOWN
) -> FailurePattern:
    """The pattern a rule files dead letters under, and the fingerprint row that points there (created once)."""
    pattern = rule.pattern
    if pattern is None:
        pattern, _ = FailurePattern.objects.get_or_create(
            key=rule.fingerprint_key,
            defaults={
                "template": rule.name,
                "error_type": error_type,
                "failure_reason": reason,
                "origin": PatternOrigin.RULE,
                "first_seen_at": now,
                "last_seen_at": now,
                "status_changed_at": now,
            },
        )
        rule.pattern = pattern
        FingerprintRule.objects.filter(pk=rule.pk).update(pattern=pattern)
        PatternEvent.objects.create(
            pattern=pattern, kind=PatternEvent.Kind.CREATED, detail=f"Created for rule #{rule.pk}", created_at=now
        )
    final = pattern
    while final.merged_into_id is not None:
        final = FailurePattern.objects.get(pk=final.merged_into_id)
    Fingerprint.objects.get_or_create(
        key=rule.fingerprint_key,
        defaults={
            "kind": FingerprintKind.RULE,
            "template": rule.name,
            "pattern": final,
            "auto_pattern": pattern,
            "created_at": now,
        },
    )
    return pattern


def save_fingerprint_rule(*, rule: FingerprintRule, actor: Actor, now: dt.datetime | None = None) -> FingerprintRule:
    """Create or change a custom fingerprint rule. It applies to dead letters that arrive from now on (in every
    consumer, from its next batch); dead letters already stored stay where they are."""
    validate_rule(name=rule.name, regex=rule.regex, header=rule.header, rule_id=rule.pk)
    now = now or timezone.now()
    creating = rule.pk is None
    with transaction.atomic():
        if creating and rule.created_by_id is None:
            rule.created_by = _user(actor)
        if rule.enabled:
            rule.disabled_reason = ""  # enabled again by a person, who has seen why it was off
        rule.updated_at = now
        rule.save()
        pattern = ensure_rule_pattern(rule=rule, now=now)
        if pattern.template != rule.name:
            FailurePattern.objects.filter(pk=pattern.pk).update(template=rule.name)
            Fingerprint.objects.filter(key=rule.fingerprint_key).update(template=rule.name)
        where = f" (header {rule.header})" if rule.header else ""
        _forget_rules()
        record_audit(
            actor=actor,
            action="fingerprint_rule.create" if creating else "fingerprint_rule.update",
            target=f"rule #{rule.pk}",
            detail=f"{rule.name}: /{rule.regex}/{where}" + ("" if rule.enabled else " (disabled)"),
        )
    return rule


def disable_slow_rule(*, rule_id: int, reason: str) -> bool:
    """Turn off a rule whose searches keep running out of time at ingest (grouping.rules decides when), for every
    process, with the reason on the rule and in the audit log. False when it was already off or is gone."""
    with transaction.atomic():
        changed = FingerprintRule.objects.filter(pk=rule_id, enabled=True).update(
            enabled=False, disabled_reason=reason, updated_at=timezone.now()
        )
        if changed:
            record_audit(actor=None, action="fingerprint_rule.disable", target=f"rule #{rule_id}", detail=reason)
    _forget_rules()
    if changed:
        logger.error("Fingerprint rule #%s disabled: %s", rule_id, reason)
    return bool(changed)


def delete_fingerprint_rule(*, rule: FingerprintRule, actor: Actor) -> None:
    """Remove a rule. Dead letters it already filed stay in its pattern; new ones are grouped as usual."""
    with transaction.atomic():
        pk, name = rule.pk, rule.name
        rule.delete()
        _forget_rules()
        record_audit(actor=actor, action="fingerprint_rule.delete", target=f"rule #{pk}", detail=name)


def _split_matches(compiled: Any, error_type: str, message: str, headers: Any) -> bool:
    """Whether a split rule takes a dead letter; a search that ran out of time refuses the split (PatternError)
    rather than leaving the dead letter where it is unchecked."""
    try:
        return matches(compiled, error_type=error_type, message=message, headers=headers, strict=True)
    except RuleTooSlowError as problem:
        raise PatternError(str(problem)) from None


def _bounded(rows: Iterable[tuple[Any, ...]]) -> Generator[tuple[Any, ...]]:
    """The rows, until SPLIT_TIME_LIMIT has passed: then PatternError (an expression fast on each text can still
    be slow over a large pattern, and the operator waits for the answer). Use it in contextlib.closing()."""
    deadline = time.monotonic() + SPLIT_TIME_LIMIT
    try:
        for row in rows:
            if time.monotonic() > deadline:
                raise PatternError(
                    f"Checking the rule against the pattern's dead letters took longer than {SPLIT_TIME_LIMIT:.0f} "
                    "s; make the expression simpler or more specific."
                )
            yield row
    finally:
        # Close a server-side cursor now, inside the caller's transaction: closed later by the garbage collector,
        # after the transaction rolled back, its CLOSE would fail.
        close = getattr(rows, "close", None)
        if close is not None:
            close()


def split_pattern(
    *,
    pattern: FailurePattern,
    name: str,
    actor: Actor,
    regex: str = "",
    header: str = "",
    now: dt.datetime | None = None,
) -> FailurePattern:
    """Split the dead letters of `pattern` that match a rule (a regular expression on the error text, and/or a
    header) into a new pattern named `name`. The rule is kept, scoped to the pattern, so later arrivals that
    match are split off too. Returns the new pattern."""
    validate_rule(name=name, regex=regex, header=header)
    now = now or timezone.now()
    with transaction.atomic():
        lock_fingerprints(pattern_ids=[pattern.pk])
        locked = _active(pattern)
        rule = FingerprintRule.objects.create(
            name=name.strip(),
            regex=regex,
            header=header.strip(),
            scope=locked,
            position=0,
            created_by=_user(actor),
            created_at=now,
            updated_at=now,
        )
        part = ensure_rule_pattern(rule=rule, now=now, error_type=locked.error_type, reason=locked.failure_reason)
        part.transient = locked.transient
        part.save(update_fields=["transient"])
        compiled = compile_rule(rule)
        _forget_rules()
        rows = (
            DeadLetter.objects.filter(pattern_id=locked.pk)
            .order_by("pk")
            .values_list("pk", "error_type", "error_message", "headers")
            .iterator(chunk_size=2000)
        )
        with contextlib.closing(_bounded(rows)) as bounded:
            matching = [pk for pk, *row in bounded if _split_matches(compiled, *row)]
        if not matching:
            # Rolls the rule and its pattern back: an empty split only leaves a confusing empty pattern behind.
            raise PatternError(f"The rule matches none of the dead letters of #{locked.pk}; nothing was split.")
        if len(matching) == DeadLetter.objects.filter(pattern_id=locked.pk).count():
            raise PatternError(
                f"The rule matches every dead letter of #{locked.pk}: a split needs a rule that tells some apart."
            )
        kinds = Counter(
            DeadLetter.objects.filter(pk__in=matching[:MOVE_CHUNK]).values_list("error_type", "failure_reason")
        )
        moved, earliest, latest = move_dead_letters(
            source_id=locked.pk, target_id=part.pk, ids=matching, new_fingerprint=rule.fingerprint_key
        )
        part = FailurePattern.objects.select_for_update().get(pk=part.pk)
        part.total_count += moved
        part.first_seen_at = earliest or now
        part.last_seen_at = latest or now
        # The part is named after what it holds (a merged pattern can hold several error types), and keeps the
        # triage of the pattern it came from: splitting a pattern someone owns does not make it new again.
        (part.error_type, part.failure_reason), _ = kinds.most_common(1)[0]
        part.status, part.owner_id, part.status_changed_at = locked.status, locked.owner_id, now
        part.save(
            update_fields=[
                "total_count",
                "first_seen_at",
                "last_seen_at",
                "error_type",
                "failure_reason",
                "status",
                "owner",
                "status_changed_at",
            ]
        )
        locked.total_count = max(0, locked.total_count - moved)
        locked.save(update_fields=["total_count"])
        how = f"/{regex}/" + (f" in header {header}" if header else "")
        _record_both(
            PatternEvent.Kind.SPLIT,
            {
                locked: f"{moved} dead letters matching {how} split into #{part.pk} ({name})",
                part: f"Split from #{locked.pk} by {how}: {moved} dead letters",
            },
            actor=actor,
            now=now,
        )
        record_audit(
            actor=actor,
            action="pattern.split",
            target=f"pattern #{locked.pk}",
            count=moved,
            detail=f"{how} -> #{part.pk} {name}",
        )
    return part


@dataclass(frozen=True)
class SplitPreview:
    matching: int  # among the `examined` newest dead letters of the pattern
    examined: int
    examples: list[tuple[int, str]]  # (dead letter id, error message) of the newest that match

    @property
    def exact(self) -> bool:
        """True when every dead letter of the pattern was examined (the count is the split's)."""
        return self.examined < SPLIT_PREVIEW_LIMIT

    @property
    def splits(self) -> bool:
        """Whether the rule tells some dead letters apart (a split must take some but not all)."""
        return self.matching > 0 and not (self.exact and self.matching == self.examined)


# A preview reads at most this many of the pattern's newest dead letters.
SPLIT_PREVIEW_LIMIT = 10000
# A split or its preview gives up (and says so) when checking its rule takes longer than this (seconds).
SPLIT_TIME_LIMIT = 10.0


def split_preview(*, pattern: FailurePattern, regex: str = "", header: str = "", examples: int = 5) -> SplitPreview:
    """What a split rule would take from a pattern, for a page that shows it before the operator confirms: how many
    of its newest dead letters match, and a few of them."""
    _validate_match(regex=regex, header=header)
    compiled = compile_rule(FingerprintRule(name="preview", regex=regex, header=header))
    rows = DeadLetter.objects.filter(pattern_id=pattern.pk).order_by("-pk")[:SPLIT_PREVIEW_LIMIT]
    examined = matching = 0
    found: list[tuple[int, str]] = []
    values = rows.values_list("pk", "error_type", "error_message", "headers").iterator(chunk_size=2000)
    with contextlib.closing(_bounded(values)) as bounded:
        for pk, error_type, message, headers in bounded:
            examined += 1
            if _split_matches(compiled, error_type, message, headers):
                matching += 1
                if len(found) < examples:
                    found.append((pk, message))
    return SplitPreview(matching=matching, examined=examined, examples=found)
