"""`dlq regroup`: stored patterns brought in line with the current grouping rules, by merging only.

The stored state an older rule left is made by hand: dead letters ingested under the current rules are refiled under
fingerprints the current rules never compute (one pattern per older fingerprint), and the current rules' fingerprints
are forgotten, as if those rules had never filed anything.
"""

from __future__ import annotations

import hashlib
import io
import itertools
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.db import transaction
from django.db.models import F

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.alerts.models import AlertRule, RuleKind
from dlqconsole.deadletters.fingerprint import fingerprint
from dlqconsole.deadletters.models import (
    DeadLetter,
    FailurePattern,
    Fingerprint,
    FingerprintKind,
    PatternEvent,
    PatternStatus,
)
from dlqconsole.deadletters.regroup import apply_regroup, plan_regroup
from dlqconsole.deadletters.rule_services import split_pattern
from dlqconsole.deadletters.services import (
    assign_pattern,
    merge_patterns,
    move_dead_letters,
    set_pattern_note,
    set_pattern_status,
)
from dlqconsole.operations.models import RetryPolicy
from tests.deadletters.conftest import Ingest, assert_counts_exact

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]

TIMEOUTS = (
    "payment gateway timed out after 30000ms",
    "payment gateway timed out after 15000ms",
    "payment gateway timed out after 5000ms",
    "payment gateway timed out after 1000ms",
)
DETAIL = "merged by dlq regroup: same pattern under the current grouping rules"
_older = itertools.count(1)


def refile(letters: list[DeadLetter], *, into: FailurePattern | None = None) -> FailurePattern:
    """File `letters` (all in one pattern) as an older rule did: under a fingerprint the current rules never compute,
    in `into` or else in a new pattern of their own. Counters and totals move with them."""
    source = FailurePattern.objects.get(pk=DeadLetter.objects.get(pk=letters[0].pk).pattern_id)
    key = hashlib.sha1(f"older rules {next(_older)}".encode()).hexdigest()
    target = into or FailurePattern.objects.create(
        key=key, template=f"{source.template} (older rules)", error_type=source.error_type
    )
    Fingerprint.objects.create(key=key, template=target.template, pattern=target, auto_pattern=target)
    ids = [letter.pk for letter in letters]
    with transaction.atomic():
        if target.pk == source.pk:
            DeadLetter.objects.filter(pk__in=ids).update(fingerprint=key)
        else:
            moved, _, _ = move_dead_letters(source_id=source.pk, target_id=target.pk, ids=ids, new_fingerprint=key)
            FailurePattern.objects.filter(pk=source.pk).update(total_count=F("total_count") - moved)
            FailurePattern.objects.filter(pk=target.pk).update(total_count=F("total_count") + moved)
    return target


def forget_current_fingerprints() -> None:
    """Only the older rules' fingerprints stay: those the stored dead letters carry (and the rules')."""
    carried = set(DeadLetter.objects.values_list("fingerprint", flat=True))
    Fingerprint.objects.exclude(key__in=carried).exclude(kind=FingerprintKind.RULE).delete()


def older_timeouts(ingest: Ingest, *, apart: int = 1) -> tuple[FailurePattern, FailurePattern, list[DeadLetter]]:
    """The four timeouts, which the current rules file as one pattern, as older rules filed them: the first `apart`
    in a pattern of their own (the newer one), the rest in the pattern ingest made. Returns (the pattern ingest
    made, the newer one, the dead letters)."""
    rows = ingest(*TIMEOUTS)
    first = FailurePattern.objects.get(pk=rows[0].pattern_id)
    newer = refile(rows[:apart])
    refile(rows[apart:], into=first)
    forget_current_fingerprints()
    return first, newer, rows


def regroup(*options: str) -> str:
    out = io.StringIO()
    call_command("dlq", "regroup", *options, stdout=out)
    return out.getvalue()


def pattern_of(row: DeadLetter) -> int:
    return DeadLetter.objects.values_list("pattern_id", flat=True).get(pk=row.pk)


def state() -> dict[str, Any]:
    return {
        "patterns": list(FailurePattern.objects.order_by("pk").values_list("pk", "merged_into_id", "total_count")),
        "letters": list(DeadLetter.objects.order_by("pk").values_list("pk", "pattern_id", "fingerprint")),
        "fingerprints": list(Fingerprint.objects.order_by("key").values_list("key", "pattern_id")),
        "events": PatternEvent.objects.count(),
        "audit": AuditEntry.objects.count(),
    }


def test_dry_run_prints_the_plan_and_changes_nothing(ingest: Ingest) -> None:
    first, newer, _ = older_timeouts(ingest)
    before = state()

    out = regroup("--dry-run")

    assert state() == before
    assert f"Merge into #{first.pk} (3 dead letters): payment gateway timed out after <NUM>ms" in out
    assert f"  #{newer.pk} (1 dead letter): payment gateway timed out after <NUM>ms (older rules)" in out
    assert "Would merge 1 pattern into 1 (1 dead letter would move) and file 1 new fingerprint." in out
    assert out.rstrip().endswith("Dry run: nothing was changed.")


def test_merge_moves_dead_letters_counters_triage_and_watchers_to_the_busiest(
    ingest: Ingest, operator: User, admin_user: User
) -> None:
    first, newer, rows = older_timeouts(ingest, apart=3)
    # The busiest survives, though it is the younger: `first` keeps one dead letter, `newer` three.
    set_pattern_status(pattern=first, status=PatternStatus.ACKNOWLEDGED, actor=operator)
    assign_pattern(pattern=first, owner=operator, actor=admin_user, note="PSP incident OPS-12")
    set_pattern_note(pattern=newer, note="watching the PSP", actor=operator)
    policy = RetryPolicy.objects.create(name="PSP retries", pattern=first)
    rule = AlertRule.objects.create(name="PSP timeouts", kind=RuleKind.PATTERN_REOPENED, pattern=first)

    out = regroup()

    first.refresh_from_db()
    newer.refresh_from_db()
    assert first.merged_into_id == newer.pk
    assert {pattern_of(row) for row in rows} == {newer.pk}
    assert newer.total_count == 4 and first.total_count == 0
    assert_counts_exact()
    assert (newer.status, newer.owner, newer.note) == (
        PatternStatus.ACKNOWLEDGED,
        operator,
        f"watching the PSP\n\n#{first.pk}: PSP incident OPS-12",
    )
    policy.refresh_from_db()
    rule.refresh_from_db()
    assert (policy.pattern_id, rule.pattern_id) == (newer.pk, newer.pk)
    merged = PatternEvent.objects.filter(kind=PatternEvent.Kind.MERGED)
    assert merged.get(pattern=first).detail == f"Merged into #{newer.pk}: {DETAIL}"
    absorbed = merged.get(pattern=newer).detail
    assert absorbed.startswith(
        f"Absorbed #{first.pk} (1 dead letter, 1 in all): {DETAIL}; took its status acknowledged"
    )
    assert "moved here: " in absorbed and "1 alert rule" in absorbed and "1 retry policy" in absorbed
    audit = AuditEntry.objects.get(action="pattern.regroup", target=f"pattern #{newer.pk}")
    assert (audit.actor_name, audit.count) == ("system", 1)
    assert audit.detail == f"merged #{first.pk} into #{newer.pk}: same pattern under the current grouping rules"
    assert f"Merged into #{newer.pk} (3 dead letters before, 1 moved in): payment gateway" in out
    assert "Merged 1 pattern into 1 (1 dead letter moved)." in out
    assert "Filed 1 new fingerprint under the patterns that hold their dead letters." in out


def test_the_survivors_own_triage_is_kept(ingest: Ingest, operator: User, admin_user: User) -> None:
    first, newer, _ = older_timeouts(ingest)
    set_pattern_status(pattern=first, status=PatternStatus.ACKNOWLEDGED, actor=operator)
    assign_pattern(pattern=first, owner=operator, actor=admin_user, note="same note")
    set_pattern_status(pattern=newer, status=PatternStatus.IGNORED, actor=operator)
    assign_pattern(pattern=newer, owner=admin_user, actor=admin_user, note="same note")

    regroup("--user", operator.username)

    first.refresh_from_db()
    assert (first.status, first.owner, first.note) == (PatternStatus.ACKNOWLEDGED, operator, "same note")
    assert PatternEvent.objects.get(pattern=first, kind=PatternEvent.Kind.MERGED).actor == operator
    assert AuditEntry.objects.get(action="pattern.regroup", target=f"pattern #{first.pk}").actor == operator


def test_an_ignored_pattern_does_not_silence_the_open_survivor(ingest: Ingest, operator: User) -> None:
    first, newer, _ = older_timeouts(ingest)
    set_pattern_status(pattern=newer, status=PatternStatus.IGNORED, actor=operator)

    regroup()

    first.refresh_from_db()
    newer.refresh_from_db()
    assert newer.merged_into_id == first.pk
    assert first.status == PatternStatus.OPEN


def test_a_new_arrival_of_a_merged_text_lands_in_the_survivor(ingest: Ingest) -> None:
    first, newer, _ = older_timeouts(ingest)
    regroup()

    current = fingerprint(error_type="", message=TIMEOUTS[0]).key
    assert Fingerprint.objects.get(key=current).pattern_id == first.pk
    (arrival,) = ingest("payment gateway timed out after 999ms")
    # A new text of the same cluster makes ingest mine it again: the filed fingerprint stays where it is.
    ingest("payment gateway timed out waiting for a connection")
    (later,) = ingest("payment gateway timed out after 7ms")

    assert pattern_of(arrival) == pattern_of(later) == first.pk
    assert not FailurePattern.objects.filter(pk=newer.pk, merged_into=None).exists()
    assert_counts_exact()


def test_a_second_run_merges_nothing(ingest: Ingest) -> None:
    older_timeouts(ingest)
    regroup()
    before = state()

    out = regroup()

    assert state() == before
    assert "Nothing to merge" in out
    assert "Filed 0 new fingerprints" in out


def test_a_pattern_spanning_two_new_groups_is_neither_split_nor_merged(ingest: Ingest) -> None:
    rows = ingest(*TIMEOUTS)
    disk = ingest("disk full on worker", "disk full on worker")
    first = FailurePattern.objects.get(pk=rows[0].pattern_id)
    mixed = refile(rows[:1])
    refile(disk[:1], into=mixed)
    newer = refile(rows[1:2])
    before = list(DeadLetter.objects.filter(pattern=mixed).order_by("pk").values_list("pk", flat=True))

    out = regroup()

    mixed.refresh_from_db()
    assert mixed.merged_into_id is None
    assert list(DeadLetter.objects.filter(pattern=mixed).order_by("pk").values_list("pk", flat=True)) == before
    assert FailurePattern.objects.get(pk=newer.pk).merged_into_id == first.pk
    assert FailurePattern.objects.get(pk=disk[1].pattern_id).merged_into_id is None
    assert "1 pattern spanning several groups under the current rules (left as they are)" in out
    assert_counts_exact()


def test_an_operator_split_is_not_merged_back(ingest: Ingest, operator: User) -> None:
    rows = ingest(*TIMEOUTS)
    first = FailurePattern.objects.get(pk=rows[0].pattern_id)
    part = split_pattern(pattern=first, name="Slow PSP", regex="30000ms", actor=operator)
    # An older rule had also filed one of the rest apart: the current rules would put it back with `first`, but
    # `first` was split by an operator, and merging into it would put dead letters of the rule back in it.
    newer = refile(rows[1:2])
    before = state()

    out = regroup()

    assert state()["patterns"] == before["patterns"]
    assert state()["letters"] == before["letters"]
    assert pattern_of(rows[0]) == part.pk
    rule_id = part.rules.get().pk
    assert f"Left as it is: #{first.pk} (2 dead letters), split by rule #{rule_id}" in out
    assert FailurePattern.objects.get(pk=newer.pk).merged_into_id is None
    assert not AuditEntry.objects.filter(action="pattern.regroup").exclude(target="fingerprints").exists()


def test_dead_letters_without_error_text_are_grouped_by_their_task_or_queue(ingest: Ingest) -> None:
    rows = ingest({"message": "", "queue": "orders"}, {"message": "", "queue": "orders"})
    billing = ingest({"message": "", "queue": "billing"})
    first = FailurePattern.objects.get(pk=rows[0].pattern_id)
    assert billing[0].pattern_id != first.pk
    newer = refile(rows[1:])
    refile(billing, into=newer)
    apart = refile(rows[:1], into=first)

    regroup()

    # `newer` holds dead letters of two queues, which are two failures without text: it spans, nothing merges.
    assert FailurePattern.objects.get(pk=apart.pk).merged_into_id is None
    assert FailurePattern.objects.get(pk=newer.pk).merged_into_id is None

    lone = refile(billing)
    regroup()

    assert FailurePattern.objects.get(pk=newer.pk).merged_into_id == first.pk
    assert FailurePattern.objects.get(pk=lone.pk).merged_into_id is None


def test_patterns_that_changed_after_the_plan_are_skipped(ingest: Ingest, operator: User) -> None:
    first, newer, _ = older_timeouts(ingest)
    elsewhere = ingest("disk full on worker")[0]
    plan = plan_regroup()
    # Meanwhile a dead letter of another failure is filed in `first` (by an operator's merge, say).
    merge_patterns(source=FailurePattern.objects.get(pk=elsewhere.pattern_id), target=first, actor=operator)

    result = apply_regroup(plan, actor=None)

    assert [outcome.skipped for outcome in result.skipped] == [
        "dead letters were moved into or out of these patterns meanwhile"
    ]
    assert FailurePattern.objects.get(pk=newer.pk).merged_into_id is None
    assert not AuditEntry.objects.filter(action="pattern.regroup", target=f"pattern #{first.pk}").exists()


def test_a_dead_letter_of_another_failure_arriving_after_the_plan_holds_the_merge_back(ingest: Ingest) -> None:
    first, newer, _ = older_timeouts(ingest)
    plan = plan_regroup()
    refile(ingest("disk full on worker"), into=first)

    result = apply_regroup(plan, actor=None)

    assert len(result.skipped) == 1
    assert "took dead letters of another kind meanwhile" in result.skipped[0].skipped
    assert FailurePattern.objects.get(pk=newer.pk).merged_into_id is None


def test_an_unknown_user_is_refused(ingest: Ingest) -> None:
    with pytest.raises(CommandError, match="no user 'nobody'"):
        regroup("--user", "nobody")
