"""Rule services: custom fingerprint rules (validated, saved, disabled when too slow, deleted) and splitting a
pattern by a rule, which is a rule scoped to that pattern.

They follow the pattern services' conventions and locking order (services.py): keyword-only, a history event and
an audit row for each change, PatternError with a message fit to show an operator.

Contracts the pages, the admin and the CLI rely on (keep them stable):
- split_pattern(*, pattern, name, actor, regex="", header="") -> FailurePattern   (the new pattern)
- split_preview(*, pattern, regex="", header="", examples=5) -> SplitPreview (the same, with examples)
- save_fingerprint_rule(*, rule, actor) -> FingerprintRule                 (create or edit; the admin uses it)
- delete_fingerprint_rule(*, rule, actor) -> None
- validate_rule(*, name, regex, header, rule_id=None) -> None   (raises PatternError; for forms)
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import re
import time
from collections import Counter
from collections.abc import Generator, Iterable
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from dlqconsole.accounts.services import record_audit
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
)
from dlqconsole.deadletters.services import (
    MOVE_CHUNK,
    Actor,
    PatternError,
    acting_user,
    lock_active_pattern,
    lock_fingerprints,
    move_dead_letters,
    record_on_both_sides,
)

logger = logging.getLogger(__name__)


# Rules ---------------------------------------------------------------------------------------------------------


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
            rule.created_by = acting_user(actor)
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


# Splits --------------------------------------------------------------------------------------------------------


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
        locked = lock_active_pattern(pattern)
        rule = FingerprintRule.objects.create(
            name=name.strip(),
            regex=regex,
            header=header.strip(),
            scope=locked,
            position=0,
            created_by=acting_user(actor),
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
        record_on_both_sides(
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
