"""Operator control over grouping: merge, split by a rule, custom fingerprint rules. Each decision moves the
dead letters it concerns (counters kept exact), sticks for new arrivals, and is recorded."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.db.models import ForeignObjectRel
from django.utils.html import escape

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.alerts.models import AlertRule, RuleKind
from dlqconsole.deadletters.models import (
    DeadLetter,
    FailurePattern,
    FingerprintRule,
    PatternEvent,
    PatternOrigin,
    PatternStatus,
)
from dlqconsole.deadletters.rule_services import (
    delete_fingerprint_rule,
    save_fingerprint_rule,
    split_pattern,
    split_preview,
)
from dlqconsole.deadletters.services import PatternError, merge_patterns, pattern_scopes, set_pattern_status
from dlqconsole.operations.models import RetryPolicy
from tests.conftest import client_for
from tests.deadletters.conftest import Ingest, assert_counts_exact

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]


def test_merge_moves_dead_letters_and_counters_and_records_it(ingest: Ingest, operator: User) -> None:
    refused = ingest("connect ECONNREFUSED 10.0.0.7:6379", "connect ECONNREFUSED 10.0.0.8:6379")
    reset = ingest({"message": "read ECONNRESET", "queue": "billing"})
    source, target = refused[0].pattern, reset[0].pattern
    source.total_count, target.total_count = 2, 1

    moved = merge_patterns(source=source, target=target, actor=operator)

    source.refresh_from_db()
    target.refresh_from_db()
    assert moved == 2
    assert source.merged_into_id == target.pk
    assert source.merged_at is not None
    assert target.total_count == 3
    assert set(DeadLetter.objects.values_list("pattern_id", flat=True)) == {target.pk}
    assert source.events.filter(kind=PatternEvent.Kind.MERGED, actor=operator).exists()
    assert target.events.filter(kind=PatternEvent.Kind.MERGED, detail__contains=f"#{source.pk}").exists()
    audit = AuditEntry.objects.get(action="pattern.merge")
    assert (audit.count, audit.actor) == (2, operator)
    assert_counts_exact()


def test_merge_sticks_for_new_arrivals(ingest: Ingest, operator: User) -> None:
    source = ingest("connect ECONNREFUSED 10.0.0.7:6379")[0].pattern
    target = ingest("read ECONNRESET")[0].pattern
    merge_patterns(sources=[source], target=target, actor=operator)

    rows = ingest("connect ECONNREFUSED 10.9.9.9:6379")

    assert rows[0].pattern_id == target.pk
    target.refresh_from_db()
    assert target.total_count == 3
    assert_counts_exact()


def test_merging_several_patterns_keeps_merge_chains_one_hop_long(ingest: Ingest, operator: User) -> None:
    first, second, third = (ingest(message)[0].pattern for message in ["disk full", "socket hang up", "EPIPE"])
    merge_patterns(source=first, target=second, actor=operator)

    merge_patterns(sources=[second], target=third, actor=operator)

    first.refresh_from_db()
    assert first.merged_into_id == third.pk
    assert ingest("disk full")[0].pattern_id == third.pk


def test_merge_refuses_a_pattern_into_itself_and_merged_patterns(ingest: Ingest, operator: User) -> None:
    first = ingest("disk full")[0].pattern
    second = ingest("socket hang up")[0].pattern

    with pytest.raises(PatternError, match="cannot be merged into itself"):
        merge_patterns(sources=[first], target=first, actor=operator)
    merge_patterns(source=first, target=second, actor=operator)
    with pytest.raises(PatternError, match="already merged"):
        merge_patterns(source=first, target=second, actor=operator)
    with pytest.raises(PatternError, match="at least one"):
        merge_patterns(sources=[], target=second, actor=operator)


def test_split_moves_matching_dead_letters_to_a_new_pattern(ingest: Ingest, operator: User) -> None:
    rows = ingest(
        "user alice not found",
        "user bob not found",
        "user svc-import not found",
        "user svc-billing not found",
    )
    pattern = rows[0].pattern
    assert pattern.template == "user <*> not found"

    part = split_pattern(pattern=pattern, name="service accounts not found", regex=r"user svc-", actor=operator)

    assert part.template == "service accounts not found"
    assert part.origin == PatternOrigin.RULE
    assert part.total_count == 2
    stored = dict(DeadLetter.objects.values_list("error_message", "pattern_id"))
    assert stored == {
        "user alice not found": pattern.pk,
        "user bob not found": pattern.pk,
        "user svc-import not found": part.pk,
        "user svc-billing not found": part.pk,
    }
    pattern.refresh_from_db()
    assert pattern.total_count == 2
    assert pattern.events.filter(kind=PatternEvent.Kind.SPLIT, actor=operator).exists()
    assert AuditEntry.objects.get(action="pattern.split").count == 2
    assert_counts_exact()


def test_split_sticks_for_new_arrivals_of_the_pattern_only(ingest: Ingest, operator: User) -> None:
    pattern = ingest("user alice not found", "user bob not found", "user svc-import not found")[0].pattern
    part = split_pattern(pattern=pattern, name="service accounts", regex=r"svc-", actor=operator)

    rows = ingest("user svc-export not found", "user carol not found", "svc-export quota exceeded")

    assert [row.pattern_id for row in rows[:2]] == [part.pk, pattern.pk]
    assert rows[2].pattern_id not in {part.pk, pattern.pk}
    assert rows[0].fingerprint == f"rule-{part.rules.get().pk}"
    assert_counts_exact()


def test_split_by_header(ingest: Ingest, operator: User) -> None:
    rows = ingest(
        {"message": "tenant quota exceeded", "headers": {"x-tenant": "acme"}},
        {"message": "tenant quota exceeded", "headers": {"X-Tenant": "globex"}},
        {"message": "tenant quota exceeded"},
    )
    pattern = rows[0].pattern

    part = split_pattern(pattern=pattern, name="acme quota", header="x-tenant", regex="^acme$", actor=operator)

    assert [DeadLetter.objects.get(pk=row.pk).pattern_id for row in rows] == [part.pk, pattern.pk, pattern.pk]
    assert split_preview(pattern=pattern, header="x-tenant").matching == 1


def test_split_refuses_a_bad_expression(ingest: Ingest, operator: User) -> None:
    pattern = ingest("disk full")[0].pattern

    with pytest.raises(PatternError, match="does not compile"):
        split_pattern(pattern=pattern, name="broken", regex="disk (", actor=operator)
    with pytest.raises(PatternError, match="needs a regular expression, a header"):
        split_pattern(pattern=pattern, name="nothing", actor=operator)

    assert not FingerprintRule.objects.exists()


def test_split_expression_is_searched_in_the_message_and_in_type_and_message(ingest: Ingest, operator: User) -> None:
    rows = ingest(
        {"message": "user alice not found", "error_type": "LookupError"},
        {"message": "user bob not found", "error_type": "LookupError"},
        {"message": "user svc-import not found", "error_type": "LookupError"},
    )
    pattern = rows[0].pattern

    # Anchored at the start of the message, although the error type comes first in the error's one-line form.
    assert split_preview(pattern=pattern, regex=r"^user svc-").matching == 1
    assert split_preview(pattern=pattern, regex=r"^LookupError: user (alice|bob)").matching == 2
    part = split_pattern(pattern=pattern, name="service accounts", regex=r"^user svc-", actor=operator)

    assert DeadLetter.objects.get(pk=rows[2].pk).pattern_id == part.pk
    assert (part.error_type, part.failure_reason) == ("LookupError", rows[2].failure_reason)


def test_split_refuses_a_rule_that_takes_none_or_all_and_leaves_nothing_behind(ingest: Ingest, operator: User) -> None:
    pattern = ingest("user alice not found", "user bob not found")[0].pattern

    with pytest.raises(PatternError, match="matches none"):
        split_pattern(pattern=pattern, name="service accounts", regex=r"svc-", actor=operator)
    with pytest.raises(PatternError, match="matches every dead letter"):
        split_pattern(pattern=pattern, name="everyone", regex=r"not found", actor=operator)

    assert not FingerprintRule.objects.exists()
    assert list(FailurePattern.objects.values_list("pk", flat=True)) == [pattern.pk]
    assert not AuditEntry.objects.filter(action="pattern.split").exists()


def test_split_and_rule_names_must_be_unique(ingest: Ingest, operator: User, admin_user: User) -> None:
    pattern = ingest("user alice not found", "user bob not found", "user svc-import not found")[0].pattern
    split_pattern(pattern=pattern, name="Service accounts", regex=r"svc-", actor=operator)

    with pytest.raises(PatternError, match="already named"):
        split_pattern(pattern=pattern, name="service ACCOUNTS ", regex=r"alice", actor=operator)
    with pytest.raises(PatternError, match=f"Pattern #{pattern.pk} already has this name"):
        split_pattern(pattern=pattern, name="user <*> not found", regex=r"alice", actor=operator)
    rule = FingerprintRule.objects.get()
    rule.regex = "svc-|robot-"
    save_fingerprint_rule(rule=rule, actor=admin_user)  # a rule keeps its own name when edited

    assert FingerprintRule.objects.count() == 1


def test_split_part_keeps_the_triage_of_its_pattern(ingest: Ingest, operator: User) -> None:
    from dlqconsole.deadletters.models import PatternStatus
    from dlqconsole.deadletters.services import assign_pattern, set_pattern_status

    pattern = ingest("user alice not found", "user svc-import not found")[0].pattern
    set_pattern_status(pattern=pattern, status=PatternStatus.ACKNOWLEDGED, actor=operator)
    assign_pattern(pattern=pattern, owner=operator, actor=operator)

    part = split_pattern(pattern=pattern, name="service accounts", regex=r"svc-", actor=operator)

    part.refresh_from_db()
    assert (part.status, part.owner_id) == (PatternStatus.ACKNOWLEDGED, operator.pk)


def test_custom_rule_assigns_a_fixed_pattern_to_new_arrivals(ingest: Ingest, admin_user: User) -> None:
    rule = save_fingerprint_rule(
        rule=FingerprintRule(name="Legacy ERP is down", regex=r"legacy-erp|ERP gateway"), actor=admin_user
    )

    rows = ingest(
        "connect to legacy-erp.corp.example refused",
        {"message": "ERP gateway returned garbage", "error_type": "ValueError"},
        "user alice not found",
    )

    rule.refresh_from_db()
    assert rule.pattern is not None
    assert rule.pattern.template == "Legacy ERP is down"
    assert [row.pattern_id for row in rows[:2]] == [rule.pattern_id, rule.pattern_id]
    assert rows[2].pattern_id != rule.pattern_id
    assert rule.pattern.total_count == 2
    assert AuditEntry.objects.get(action="fingerprint_rule.create").actor == admin_user
    assert_counts_exact()


def test_header_rule_and_rule_order(ingest: Ingest, admin_user: User) -> None:
    header_rule = save_fingerprint_rule(
        rule=FingerprintRule(name="Replays from the old console", header="x-replayed-by", position=1),
        actor=admin_user,
    )
    text_rule = save_fingerprint_rule(
        rule=FingerprintRule(name="Timeouts", regex="timed out", position=2), actor=admin_user
    )

    rows = ingest(
        {"message": "timed out", "headers": {"X-Replayed-By": "old-console"}},
        {"message": "read timed out"},
    )

    assert [row.pattern_id for row in rows] == [header_rule.pattern_id, text_rule.pattern_id]


def test_edited_disabled_and_deleted_rules_apply_from_the_next_batch(ingest: Ingest, admin_user: User) -> None:
    rule = save_fingerprint_rule(rule=FingerprintRule(name="Disk", regex="disk full"), actor=admin_user)
    assert ingest("disk full on worker-3")[0].pattern_id == rule.pattern_id

    rule.regex = "disk almost full"
    rule.name = "Disk nearly full"
    save_fingerprint_rule(rule=rule, actor=admin_user)
    moved_on = ingest("disk full on worker-3", "disk almost full on worker-3")
    rule.enabled = False
    save_fingerprint_rule(rule=rule, actor=admin_user)
    disabled = ingest("disk almost full on worker-4")
    rule.enabled = True
    save_fingerprint_rule(rule=rule, actor=admin_user)
    delete_fingerprint_rule(rule=rule, actor=admin_user)
    deleted = ingest("disk almost full on worker-5")

    assert moved_on[0].pattern_id != rule.pattern_id
    assert moved_on[1].pattern_id == rule.pattern_id
    assert FailurePattern.objects.get(pk=rule.pattern_id).template == "Disk nearly full"
    assert disabled[0].pattern_id != rule.pattern_id
    assert deleted[0].pattern_id == disabled[0].pattern_id
    assert AuditEntry.objects.filter(action__startswith="fingerprint_rule.").count() == 5


def test_rule_with_a_bad_expression_is_refused(admin_user: User) -> None:
    with pytest.raises(PatternError, match="does not compile"):
        save_fingerprint_rule(rule=FingerprintRule(name="bad", regex="(unclosed"), actor=admin_user)

    assert not FingerprintRule.objects.exists()


def test_a_rule_deleted_by_another_process_files_its_dead_letters_as_usual(
    ingest: Ingest, admin_user: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dlqconsole.deadletters.grouping import rules
    from dlqconsole.deadletters.models import Fingerprint

    monkeypatch.setattr(rules, "RULES_TTL", 3600.0)
    rule = save_fingerprint_rule(rule=FingerprintRule(name="Disk", regex="disk full"), actor=admin_user)
    assert ingest("disk full on worker-3")[0].pattern_id == rule.pattern_id
    # Deleted behind this process's back: its cached rules still hold the rule for up to a second.
    FingerprintRule.objects.filter(pk=rule.pk).delete()
    Fingerprint.objects.filter(key=rule.fingerprint_key).delete()

    rows = ingest("disk full on worker-4")

    assert rows[0].pattern_id != rule.pattern_id
    assert rows[0].pattern.template == "disk full on <ID>"


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("name", "n" * 500, "The rule's name is 500 characters long; at most 200 fit."),
        ("regex", "order 1" + "x" * 1000, "The rule's regular expression is 1,007 characters long; at most 1,000 fit."),
        ("header", "h" * 300, "The rule's header name is 300 characters long; at most 255 fit."),
    ],
)
def test_split_refuses_over_long_fields_with_the_reason(
    ingest: Ingest, operator: User, field: str, value: str, message: str
) -> None:
    first, _ = ingest("order 1 failed", "order 2 failed")
    form = {"name": "Order one", "regex": "order 1", "header": "", field: value}

    client = client_for(operator)
    for action in ("preview", "split"):
        response = client.post(f"/patterns/{first.pattern_id}/split/", {**form, "action": action})
        assert response.status_code == 200
        assert escape(message) in response.content.decode()

    assert not FingerprintRule.objects.exists()


def test_every_setting_that_watches_one_pattern_follows_its_merges() -> None:
    """Every foreign key to FailurePattern from another app is a setting that watches one pattern, registered so
    that a merge moves it (an app above deadletters cannot be imported by it)."""
    outside = {
        (relation.related_model, relation.field.name)
        for relation in FailurePattern._meta.get_fields(include_hidden=True)
        if isinstance(relation, ForeignObjectRel)
        and relation.related_model is not None
        and relation.related_model._meta.app_label != "deadletters"
    }

    assert outside == set(pattern_scopes())


def test_an_operator_merge_moves_alert_rules_and_retry_policies(ingest: Ingest, operator: User) -> None:
    source = ingest("disk full on worker")[0].pattern
    target = ingest("payment gateway timed out after 30000ms")[0].pattern
    set_pattern_status(pattern=source, status=PatternStatus.ACKNOWLEDGED, actor=operator)
    policy = RetryPolicy.objects.create(name="disk retries", pattern=source)
    rule = AlertRule.objects.create(name="disk", kind=RuleKind.PATTERN_REOPENED, pattern=source)

    merge_patterns(source=source, target=target, actor=operator)

    policy.refresh_from_db()
    rule.refresh_from_db()
    target.refresh_from_db()
    assert (policy.pattern_id, rule.pattern_id) == (target.pk, target.pk)
    # An operator's merge keeps the target's triage, as before.
    assert target.status == PatternStatus.OPEN
