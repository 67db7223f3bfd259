from __future__ import annotations

import random
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from dlqconsole.deadletters.grouping import mining
from dlqconsole.deadletters.grouping.engine import Grouper
from dlqconsole.deadletters.grouping.mining import generalize, generalize_all
from dlqconsole.deadletters.masking import tokenize


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


def grouped(*messages: str) -> dict[str, str]:
    """{message: its group's template}, the messages mined as one cluster of any token count."""
    tokens = {message: tokenize(message) for message in messages}
    general = generalize_all(tokens.values())
    return {message: "".join(general[value]) for message, value in tokens.items()}


def test_a_name_of_several_words_after_an_entity_noun_joins_a_one_word_name() -> None:
    result = grouped("user bob not found", "user John Smith not found")

    # The group's template is its shortest member: it never goes back to one it left as templates arrive.
    assert set(result.values()) == {"user bob not found"}


def test_names_of_several_words_join_the_generalised_one_word_names() -> None:
    result = grouped("user bob not found", "user alice not found", "user John Smith not found")

    assert set(result.values()) == {"user <*> not found"}


def test_a_wildcard_slot_takes_a_value_of_several_words() -> None:
    countries = ["Germany", "France", "Spain", "United Kingdom", "Bosnia and Herzegovina"]
    result = grouped(*[f"no carrier for {country} today" for country in countries])

    assert set(result.values()) == {"no carrier for <*> today"}


def test_an_optional_detail_made_of_data_does_not_split_a_pattern() -> None:
    result = grouped(
        "upload finished, 1190 bytes (1.16 KB) written, 12 bytes (0.01 KB) skipped",
        "upload finished, 1190 bytes (1.16 KB) written, 0 bytes skipped",
        "upload finished, 7 bytes written, 5120 bytes (5.0 KB) skipped",
        "upload finished, 0 bytes written, 0 bytes skipped",
    )

    assert set(result.values()) == {"upload finished, <NUM> bytes written, <NUM> bytes skipped"}


def test_a_value_printed_as_different_data_of_one_length_is_one_value() -> None:
    result = grouped("session closed after 00:01", "session closed after <1 sec")

    assert len(set(result.values())) == 1


def test_a_long_quoted_text_joins_a_short_one() -> None:
    result = grouped(
        'cannot render reminder: "Dear customer, your parcel is late again"', 'cannot render reminder: "hi"'
    )

    assert set(result.values()) == {'cannot render reminder: "hi"'}


def test_an_extra_fixed_word_keeps_templates_apart() -> None:
    result = grouped(
        "cannot reach the ledger",
        "cannot reach the ledger replica",
        "retry 3 of 5 failed",
        "retry 3 of 5 failed for good",
        "connection to ledger refused",
        "connection to ledger replica refused",
    )

    assert len(set(result.values())) == 6


def test_enumeration_values_of_different_lengths_stay_apart() -> None:
    result = grouped("cannot cancel order in state SHIPPED", "cannot cancel order in state PARTIALLY SHIPPED")

    assert len(set(result.values())) == 2


def test_a_key_after_data_is_not_its_unit() -> None:
    result = grouped("login refused from host=10.0.0.1", "login refused from host=10.0.0.2 user=root")

    assert len(set(result.values())) == 2


def test_fixed_words_that_differ_in_one_token_count_stay_apart_when_another_length_links_them() -> None:
    # "expired" and "stolen" are the failure; the longer template shares neither.
    result = grouped(
        "payment declined: card expired",
        "payment declined: card stolen",
        "payment declined: card reported stolen",
    )

    assert len(set(result.values())) == 3


LENGTH_WORDS = ["alice", "bob", "van", "der", "Berg", "(3 KB)", "12", "found", "missing"]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(st.sampled_from(LENGTH_WORDS), min_size=1, max_size=4).map(
            lambda words: "user " + " ".join(words) + " not found"
        ),
        min_size=2,
        max_size=12,
        unique=True,
    ),
    st.randoms(use_true_random=False),
)
def test_merging_across_lengths_does_not_depend_on_the_order_of_the_templates(
    messages: list[str], rng: random.Random
) -> None:
    shuffled = messages[:]
    rng.shuffle(shuffled)

    assert grouped(*messages) == grouped(*shuffled)


def test_a_logger_name_before_the_message_is_not_its_first_word() -> None:
    # Lower-case dotted names are part of the deployment, so it takes as many as an enumeration's values.
    lines = [
        f"com.example.{job}: scheduler told me to run this job; the start time is {n} seconds away"
        for job, n in (
            ("reports.daily", 5),
            ("cache.purge", 7),
            ("mail.digest", 2),
            ("search.reindex", 9),
            ("feed", 1),
        )
    ] + [f"com.example.{job}.hourly: {n} rows archived" for job, n in (("orders", 3), ("users", 4))]
    grouper = Grouper()
    keys = [grouper.add_line(line) for line in lines]
    patterns = grouper.patterns()

    assert len({patterns[key].key for key in keys[:5]}) == 1
    assert patterns[keys[0]].key != patterns[keys[5]].key


def test_words_that_say_what_happened_stay_apart_like_an_enumeration() -> None:
    result = mined(
        "instance 12: VM Started (lifecycle event)",
        "instance 13: VM Stopped (lifecycle event)",
        "instance 14: VM Paused (lifecycle event)",
        "instance 15: VM Resumed (lifecycle event)",
    )

    assert len(set(result.values())) == 4
    assert result["instance 12: VM Started (lifecycle event)"] == "instance <NUM>: VM Started (lifecycle event)"


def test_values_masked_in_one_message_and_not_another_merge_at_two_places_at_once() -> None:
    # A digit decides whether a class name is masked: the two slots differ together, never one at a time.
    result = mined(
        "cannot map class com.acme.v2.OrderEvent to class com.acme.v2.OrderDto",
        "cannot map class com.acme.events.OrderEvent to class com.acme.dto.OrderDto",
    )

    assert set(result.values()) == {"cannot map class <*> to class <*>"}


def test_fixed_words_at_two_places_stay_apart_without_masked_data() -> None:
    result = mined(
        "cannot map class <ID> to class <ID>",
        "cannot map field Order to column <ID>",
        "payment declined: card expired at checkout",
        "payment declined: card stolen at gateway",
    )

    assert len(set(result.values())) == 4


RUN_TOKENS = [" user", " alice", " <NUM>", " <*>", ":", " '<ID>'", ",", " KB", " orders.events", " failed", "<IP>"]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.lists(st.sampled_from(RUN_TOKENS), min_size=0, max_size=18).map(lambda tokens: (" Sync", *tokens)),
        min_size=2,
        max_size=10,
        unique=True,
    )
)
def test_comparing_pairs_directly_finds_the_same_groups_as_hashing_every_cut(
    templates: list[tuple[str, ...]],
) -> None:
    # Small clusters compare their templates two by two, large ones through buckets of every cut: one answer.
    with mock.patch.object(mining, "PAIRWISE_TEMPLATES", 0):
        through_buckets = generalize_all(templates)
    with mock.patch.object(mining, "PAIRWISE_TEMPLATES", len(templates)):
        pairwise = generalize_all(templates)

    assert pairwise == through_buckets


def test_words_that_say_what_happened_stay_apart_even_after_a_noun_that_names_a_thing() -> None:
    # After "instance" or "job" a name varies from two values, but "spawned" / "destroyed" are different events.
    result = mined(
        "Instance spawned successfully.",
        "Instance destroyed successfully.",
        "job started on worker",
        "job failed on worker",
    )

    assert len(set(result.values())) == 4
    assert set(mined("user alice not found", "user bob not found").values()) == {"user <*> not found"}
