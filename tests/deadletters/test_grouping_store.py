from __future__ import annotations

import random
from typing import Any

import pytest
from django.utils import timezone

from dlqconsole.deadletters.grouping import assign_patterns
from dlqconsole.deadletters.models import (
    DeadLetter,
    DeadLetterCount,
    FailurePattern,
    Fingerprint,
    FingerprintKind,
    PatternEvent,
    PatternOrigin,
    PatternStatus,
)
from dlqconsole.deadletters.services import merge_patterns, set_pattern_status
from tests.deadletters.conftest import Ingest, assert_counts_exact, make_letter, patterns_by_message

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]


def test_user_names_in_separate_batches_end_in_one_pattern(ingest: Ingest) -> None:
    first = ingest("user alice not found", "user alice not found")
    ingest("user bob not found")

    pattern = FailurePattern.objects.active().get()
    assert pattern.template == "user <*> not found"
    assert pattern.origin == PatternOrigin.MINED
    assert pattern.total_count == 3
    assert set(DeadLetter.objects.values_list("pattern_id", flat=True)) == {pattern.pk}
    absorbed = FailurePattern.objects.get(pk=first[0].pattern_id)
    assert absorbed.merged_into_id == pattern.pk
    assert absorbed.template == "user alice not found"
    assert pattern.events.filter(kind=PatternEvent.Kind.MERGED).exists()
    assert_counts_exact()


def test_a_generalised_pattern_keeps_the_triage_of_the_pattern_it_absorbed(ingest: Ingest, operator) -> None:  # type: ignore[no-untyped-def]
    first = ingest("user alice not found")
    set_pattern_status(pattern=first[0].pattern, status=PatternStatus.ACKNOWLEDGED, actor=operator)

    ingest("user bob not found")

    pattern = FailurePattern.objects.active().get()
    assert pattern.template == "user <*> not found"
    assert pattern.status == PatternStatus.ACKNOWLEDGED


def test_new_arrivals_of_a_known_template_go_straight_to_its_pattern(
    ingest: Ingest,
    django_assert_max_num_queries,  # type: ignore[no-untyped-def]
) -> None:
    ingest("user alice not found", "user bob not found", "user carol not found")
    pattern = FailurePattern.objects.active().get()
    letters = [make_letter(f"user {name} not found") for name in ["alice", "bob", "carol"] * 50]

    with django_assert_max_num_queries(4):
        filing = assign_patterns(letters=letters, now=timezone.now())

    assert set(filing.values()) == {pattern.pk}


def test_a_new_user_name_joins_the_generalised_pattern_without_a_new_pattern(ingest: Ingest) -> None:
    ingest("user alice not found", "user bob not found")
    pattern = FailurePattern.objects.active().get()

    rows = ingest("user zoe not found")

    assert rows[0].pattern_id == pattern.pk
    # Both names came in one batch, so only the generalised pattern was ever created.
    assert FailurePattern.objects.count() == 1
    assert Fingerprint.objects.filter(pattern=pattern).count() == 3


def test_look_alike_causes_with_different_fixed_words_stay_apart(ingest: Ingest) -> None:
    rows = ingest(
        "publish rejected: queue orders-eu full",
        "publish rejected: queue orders-us full",
        "publish rejected: queue orders-eu paused",
        "publish rejected: queue billing paused",
    )

    assert patterns_by_message(rows) == {
        "publish rejected: queue orders-eu full": "publish rejected: queue <*> full",
        "publish rejected: queue orders-us full": "publish rejected: queue <*> full",
        "publish rejected: queue orders-eu paused": "publish rejected: queue <*> paused",
        "publish rejected: queue billing paused": "publish rejected: queue <*> paused",
    }


def test_error_type_and_reason_separate_otherwise_equal_templates(ingest: Ingest) -> None:
    rows = ingest(
        {"message": "user alice not found", "error_type": "UserNotFound"},
        {"message": "user bob not found", "error_type": "CustomerNotFound"},
    )

    assert rows[0].pattern_id != rows[1].pattern_id


def test_same_stack_trace_signature_is_one_pattern_whatever_the_value(ingest: Ingest) -> None:
    trace = """Traceback (most recent call last):
  File "/app/orders/tasks.py", line 88, in apply_promotions
    total = pricing.apply_discount(order, code)
  File "/app/orders/pricing.py", line 41, in apply_discount
    rate = DISCOUNTS[code]
KeyError: '{code}'"""
    rows = ingest(
        *[
            {"message": f"'{code}'", "error_type": "KeyError", "stack_trace": trace.format(code=code)}
            for code in ["SPRING", "XMAS", "BLACKFRIDAY"]
        ]
    )

    assert len({row.pattern_id for row in rows}) == 1
    pattern = FailurePattern.objects.get(pk=rows[0].pattern_id)
    assert pattern.origin == PatternOrigin.TRACE
    assert pattern.template == "KeyError at orders/tasks.py:apply_promotions → orders/pricing.py:apply_discount"


VALIDATION_TRACE = """Traceback (most recent call last):
  File "/app/orders/tasks.py", line 30, in place_order
    validate(order)
  File "/app/orders/validation.py", line 12, in validate
    raise ValidationError(problem)
orders.validation.ValidationError: {message}"""


def test_different_messages_raised_at_one_place_are_different_patterns(ingest: Ingest) -> None:
    """One place in the code raises several causes: a retry of one must not replay the others."""
    messages = [
        "customer_email bob@example.com is not a valid e-mail address",
        "customer_email eve@example.net is not a valid e-mail address",
        "quantity -3 must be positive",
        "quantity 0 must be positive",
        "shipping_address is required",
    ]
    rows = ingest(
        *[
            {
                "message": message,
                "error_type": "ValidationError",
                "stack_trace": VALIDATION_TRACE.format(message=message),
            }
            for message in messages
        ]
    )

    by_message = {row.error_message: row.pattern_id for row in rows}
    assert by_message[messages[0]] == by_message[messages[1]]
    assert by_message[messages[2]] == by_message[messages[3]]
    assert len(set(by_message.values())) == 3
    templates = set(FailurePattern.objects.filter(pk__in=by_message.values()).values_list("template", flat=True))
    assert templates == {
        "ValidationError at orders/tasks.py:place_order → orders/validation.py:validate: customer_email <EMAIL> is not"
        " a valid e-mail address",
        "ValidationError at orders/tasks.py:place_order → orders/validation.py:validate: quantity <NUM> must be"
        " positive",
        "ValidationError at orders/tasks.py:place_order → orders/validation.py:validate: shipping_address is required",
    }
    assert set(FailurePattern.objects.filter(pk__in=by_message.values()).values_list("origin", flat=True)) == {
        PatternOrigin.TRACE
    }
    assert set(Fingerprint.objects.values_list("kind", flat=True)) == {FingerprintKind.TRACE}


def test_a_word_that_varies_in_a_trace_message_is_mined_like_text(ingest: Ingest) -> None:
    users = ["alice", "bob", "carol", "dave"]
    rows = ingest(
        *[
            {
                "message": f"user {user} has no billing account",
                "error_type": "ValidationError",
                "stack_trace": VALIDATION_TRACE.format(message=f"user {user} has no billing account"),
            }
            for user in users
        ]
    )

    assert len({row.pattern_id for row in rows}) == 1
    pattern = FailurePattern.objects.get(pk=rows[0].pattern_id)
    assert pattern.template.endswith(": user <*> has no billing account")
    assert_counts_exact()


def test_an_operator_merge_sticks_when_the_merged_pattern_later_generalises(ingest: Ingest, operator) -> None:  # type: ignore[no-untyped-def]
    alice = ingest("user alice not found")[0]
    timeout = ingest("payment gateway timed out after 30000ms")[0]
    merge_patterns(sources=[alice.pattern], target=timeout.pattern, actor=operator)

    rows = ingest("user bob not found")

    assert rows[0].pattern_id == timeout.pattern_id
    assert set(DeadLetter.objects.values_list("pattern_id", flat=True)) == {timeout.pattern_id}
    assert_counts_exact()


def grouped(ingest: Ingest, order: list[str], batch: int) -> dict[str, tuple[str, str]]:
    """Ingest the messages in this order and these batch sizes; {message: (pattern key, template)}. Leaves the
    database without dead letters or patterns for the next run."""
    for start in range(0, len(order), batch):
        ingest(*order[start : start + batch])
    patterns = {pattern.pk: (pattern.key, pattern.template) for pattern in FailurePattern.objects.all()}
    result = {row.error_message: patterns[row.pattern_id] for row in DeadLetter.objects.all()}
    assert_counts_exact()
    DeadLetterCount.objects.all().delete()
    DeadLetter.objects.all().delete()
    Fingerprint.objects.all().delete()
    FailurePattern.objects.update(merged_into=None)
    FailurePattern.objects.all().delete()
    return result


def test_grouping_is_the_same_whatever_order_the_messages_arrive_in(ingest: Ingest) -> None:
    messages = [
        "user alice not found",
        "Inventory reservation failed for SKU-10001: requested 3, available 0",
        "user bob not found",
        "publish rejected: queue orders-eu full",
        "Inventory reservation failed for SKU-10002: requested 1, available 0",
        "publish rejected: queue billing full",
        "user carol not found",
        "publish rejected: queue orders-eu paused",
    ]

    one_batch = grouped(ingest, messages, batch=len(messages))
    one_by_one = grouped(ingest, messages, batch=1)
    reversed_pairs = grouped(ingest, list(reversed(messages)), batch=2)

    assert one_batch == one_by_one == reversed_pairs
    assert len(set(one_batch.values())) == 4


def test_a_large_cluster_files_newcomers_that_fit_without_mining_again(
    ingest: Ingest, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dlqconsole.deadletters.grouping import store

    ingest(*[f"user {name} not found" for name in ["alice", "bob", "carol", "dave"]])
    monkeypatch.setattr(store, "LARGE_CLUSTER", 3)
    mined: list[int] = []
    original = store.patterns_of_cluster

    def counting(*args: Any) -> Any:
        mined.append(1)
        return original(*args)

    monkeypatch.setattr(store, "patterns_of_cluster", counting)

    fits = ingest("user erin not found", "user frank not found")
    misfit = ingest("user grace missing today")

    pattern = FailurePattern.objects.active().get(template="user <*> not found")
    assert [row.pattern_id for row in fits] == [pattern.pk, pattern.pk]
    assert mined == [1]  # only for the misfit, whose template fits no group of the cluster
    assert misfit[0].pattern.template == "user grace missing today"
    assert (
        Fingerprint.objects.get(key=misfit[0].fingerprint).cluster_id
        == Fingerprint.objects.get(key=fits[0].fingerprint).cluster_id
    )
    assert Fingerprint.objects.filter(pattern=pattern).count() == 6
    assert_counts_exact()


def test_hostile_error_text_is_grouped_and_stored(ingest: Ingest) -> None:
    rows = ingest(
        {"message": "nul \x00 in the text 42", "error_type": "Bad\x00Type"},
        {"message": "x" * 50000},
        {"message": "'" * 3000 + ":" * 3000},
        {"message": "ünïcödé ✓ 𝔘 user 名前 not found"},
        {"message": "boom", "error_type": "E" * 1000},
        {
            "message": "boom",
            "stack_trace": "Traceback (most recent call last):\n" + '  File "/app/a.py", line 1, in f\n' * 3000,
        },
    )

    assert all(row.pattern_id for row in rows)
    assert "\x00" not in FailurePattern.objects.get(pk=rows[0].pattern_id).template
    assert_counts_exact()


def test_a_longer_name_in_a_later_batch_joins_the_pattern_of_the_shorter_one(ingest: Ingest) -> None:
    short = ingest("user bob not found", "user bob not found")
    long = ingest("user John Smith not found")

    pattern = FailurePattern.objects.active().get()
    assert pattern.pk == short[0].pattern_id == long[0].pattern_id
    assert pattern.template == "user bob not found"
    assert pattern.total_count == 3
    assert_counts_exact()


def test_a_shorter_name_in_a_later_batch_absorbs_the_pattern_of_the_longer_one(ingest: Ingest) -> None:
    long = ingest("user John Smith not found", "user John Smith not found")
    short = ingest("user bob not found")

    pattern = FailurePattern.objects.active().get()
    assert pattern.template == "user bob not found"
    assert pattern.total_count == 3
    assert set(DeadLetter.objects.values_list("pattern_id", flat=True)) == {pattern.pk}
    assert short[0].pattern_id == pattern.pk
    absorbed = FailurePattern.objects.get(pk=long[0].pattern_id)
    assert (absorbed.template, absorbed.merged_into_id) == ("user John Smith not found", pattern.pk)
    assert pattern.events.filter(kind=PatternEvent.Kind.MERGED).exists()
    assert_counts_exact()


def test_an_optional_detail_arriving_later_is_filed_under_the_pattern_without_it(ingest: Ingest) -> None:
    plain = ingest("upload finished, 0 bytes written", "upload finished, 12 bytes written")
    detailed = ingest("upload finished, 1190 bytes (1.16 KB) written")

    assert detailed[0].pattern_id == plain[0].pattern_id == plain[1].pattern_id
    pattern = FailurePattern.objects.active().get()
    assert pattern.template == "upload finished, <NUM> bytes written"
    assert pattern.total_count == 3
    assert_counts_exact()


@pytest.mark.parametrize(
    "messages",
    [
        [
            "user bob not found",
            "user John Smith not found",
            "user Jane van der Berg not found",
            "user 'x y' not found",
            "upload finished, 1190 bytes (1.16 KB) written",
            "upload finished, 0 bytes written",
            "cannot reach the ledger",
            "cannot reach the ledger replica",
            "cannot cancel order in state SHIPPED",
            "cannot cancel order in state PARTIALLY SHIPPED",
        ],
        # Linked first through the quoted value, later through the wildcard its slot becomes: a group's
        # template must never go back to one whose pattern was absorbed.
        [
            "invalid character 'T' looking for beginning of value",
            "invalid character ''' looking for beginning of value",
            "invalid character '<' looking for beginning of value",
            "invalid character 'u' looking for beginning of value",
            "invalid character 'ab cd' looking for beginning of value",
        ],
    ],
)
def test_merging_across_lengths_is_the_same_whatever_order_the_messages_arrive_in(
    ingest: Ingest, messages: list[str]
) -> None:
    expected = grouped(ingest, messages, batch=len(messages))
    shuffled = random.Random(7)
    for _ in range(12):
        order = messages[:]
        shuffled.shuffle(order)
        for batch in (1, 2):
            assert grouped(ingest, order, batch) == expected, (order, batch)
