from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from dlqconsole.deadletters.fingerprint import tokenize
from dlqconsole.deadletters.grouping.engine import Grouper
from dlqconsole.deadletters.grouping.mining import generalize


def mined(*messages: str) -> dict[str, str]:
    """{message: its generalised template}, the messages mined as one cluster per token count."""
    tokens = {message: tokenize(message) for message in messages}
    by_length: dict[int, list[tuple[str, ...]]] = {}
    for value in tokens.values():
        by_length.setdefault(len(value), []).append(value)
    general: dict[tuple[str, ...], tuple[str, ...]] = {}
    for group in by_length.values():
        general.update(generalize(group))
    return {message: "".join(general[value]) for message, value in tokens.items()}


def test_user_names_after_an_entity_noun_merge_from_two_values() -> None:
    result = mined("user alice not found", "user bob not found")

    assert set(result.values()) == {"user <*> not found"}


def test_queue_names_merge_and_fixed_words_after_them_stay_apart() -> None:
    result = mined(
        "publish rejected: queue orders-eu full",
        "publish rejected: queue orders-us full",
        "publish rejected: queue billing full",
        "publish rejected: queue orders-eu paused",
        "publish rejected: queue billing paused",
    )

    assert result["publish rejected: queue orders-eu full"] == "publish rejected: queue <*> full"
    assert result["publish rejected: queue billing paused"] == "publish rejected: queue <*> paused"


def test_two_fixed_words_in_a_plain_slot_stay_apart() -> None:
    result = mined("payment declined: card expired", "payment declined: card stolen")

    assert len(set(result.values())) == 2


def test_three_different_words_in_a_plain_slot_are_a_variable() -> None:
    result = mined("no carrier for Germany today", "no carrier for France today", "no carrier for Spain today")

    assert set(result.values()) == {"no carrier for <*> today"}


def test_enumeration_after_state_needs_more_values_than_a_plain_slot() -> None:
    states = ["SHIPPED", "CANCELLED", "REFUNDED", "PENDING"]
    result = mined(*[f"cannot cancel order in state {state}" for state in states])

    assert len(set(result.values())) == 4


def test_dependency_host_names_stay_apart() -> None:
    result = mined(
        "HTTPSConnectionPool(host='payments-api.internal', port=443): Read timed out.",
        "HTTPSConnectionPool(host='tax-api.internal', port=443): Read timed out.",
        "HTTPSConnectionPool(host='fx-api.internal', port=443): Read timed out.",
    )

    assert len(set(result.values())) == 3


def test_a_variable_next_to_masked_data_needs_only_two_values() -> None:
    result = mined("RequestID: <ID> denied", "RequestID: TDOVLHDRSRAQWOZZ denied")

    assert set(result.values()) == {"RequestID: <*> denied"}


def test_two_variables_in_one_template_merge_through_the_wildcard() -> None:
    messages = [
        "Merchant acme cannot settle in GBP",
        "Merchant globex cannot settle in GBP",
        "Merchant hooli cannot settle in USD",
        "Merchant stark cannot settle in USD",
        "Merchant wayne cannot settle in EUR",
    ]

    result = mined(*messages)

    assert set(result.values()) == {"Merchant <*> cannot settle in <*>"}


def test_a_template_never_becomes_all_wildcards() -> None:
    messages = [f"{a} {b}" for a in ["alpha", "beta", "gamma", "delta"] for b in ["one", "two", "three", "four"]]

    result = mined(*messages)

    assert all(template.count("<*>") <= 1 for template in result.values())


WORDS = ["alice", "bob", "carol", "dave", "orders", "billing", "full", "paused", "eu", "us", "found", "missing"]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(st.sampled_from(WORDS), min_size=3, max_size=3).map(lambda words: "user " + " ".join(words)),
        min_size=2,
        max_size=14,
        unique=True,
    ),
    st.randoms(use_true_random=False),
)
def test_mining_does_not_depend_on_the_order_of_the_templates(messages: list[str], rng: random.Random) -> None:
    shuffled = messages[:]
    rng.shuffle(shuffled)

    assert mined(*messages) == mined(*shuffled)


def test_grouper_gives_the_same_keys_whatever_the_order_of_the_messages() -> None:
    messages = [f"user {name} not found" for name in ["alice", "bob", "carol"]] + [
        f"Inventory reservation failed for SKU-{n}: requested {n % 7}, available 0" for n in range(10)
    ]

    def keys(order: list[str]) -> dict[str, str]:
        grouper = Grouper()
        found = {message: grouper.add(error_type="", message=message) for message in order}
        patterns = grouper.patterns()
        return {message: patterns[key].key for message, key in found.items()}

    assert keys(messages) == keys(list(reversed(messages)))
    assert len(set(keys(messages).values())) == 2


def test_kinds_of_things_in_a_slot_are_the_subject_not_data() -> None:
    result = mined(*[f"{kind} {name} not found" for kind in ("user", "tenant", "queue") for name in ("alice", "bob")])

    assert set(result.values()) == {"user <*> not found", "tenant <*> not found", "queue <*> not found"}


def test_the_first_word_of_a_message_is_never_a_variable() -> None:
    result = mined("resync started (job 12)", "rebuild started (job 12)", "purge started (job 12)")

    assert len(set(result.values())) == 3


def test_the_unit_after_a_number_merges_from_two_values() -> None:
    result = mined("upload of 12 KB rejected by scanner", "upload of 900 B rejected by scanner")

    assert set(result.values()) == {"upload of <NUM> <*> rejected by scanner"}


def test_a_fixed_word_after_a_wildcard_is_not_a_unit() -> None:
    result = mined(
        *[f"publish rejected: queue {name} {state}" for name in ("orders", "billing") for state in ("full", "paused")]
    )

    assert set(result.values()) == {"publish rejected: queue <*> full", "publish rejected: queue <*> paused"}
