from __future__ import annotations

from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from dlqconsole.brokers.models import default_broker_id
from dlqconsole.deadletters.models import DeadLetter, DeadLetterCount, FailurePattern, Fingerprint
from dlqconsole.deadletters.services import merge_patterns
from dlqconsole.ingest import services
from tests.factories import ParsedDeadLetterFactory, store

pytestmark = pytest.mark.django_db


def fingerprint_lookups(queries: CaptureQueriesContext) -> list[str]:
    """The queries that ask which fingerprints exist (not those that read where they are filed)."""
    return [query["sql"] for query in queries.captured_queries if query["sql"].startswith("SELECT key FROM")]


def test_a_fingerprint_met_before_is_not_looked_up_again() -> None:
    store(ParsedDeadLetterFactory.build())
    with CaptureQueriesContext(connection) as queries:
        (row,) = store(ParsedDeadLetterFactory.build())
    assert fingerprint_lookups(queries) == []
    assert FailurePattern.objects.get(pk=row.pattern_id).total_count == 2


def test_a_known_fingerprint_follows_its_pattern_into_a_merge() -> None:
    (first,) = store(ParsedDeadLetterFactory.build())
    (other,) = store(
        ParsedDeadLetterFactory.build(
            error_type="KeyError", error_message="missing 'sku'", failure_reason="VALIDATION_FAILED"
        )
    )
    merge_patterns(source=first.pattern, target=other.pattern, actor=None)

    (again,) = store(ParsedDeadLetterFactory.build())

    assert again.pattern_id == other.pattern_id
    assert again.fingerprint == first.fingerprint
    assert set(DeadLetter.objects.values_list("pattern_id", flat=True)) == {other.pattern_id}
    assert DeadLetterCount.objects.get(pattern_id=other.pattern_id, failure_reason="TIMEOUT").count == 2


def test_a_fingerprint_whose_filing_was_rolled_back_is_filed_again() -> None:
    # The broker `default` is made first: its id is cached per process, and must not be one rolled back below.
    default_broker_id()
    letter = ParsedDeadLetterFactory.build(error_message="Ledger closed for period 2026-11")
    with pytest.raises(RuntimeError), transaction.atomic():
        store(letter)
        raise RuntimeError("the batch's transaction failed")
    assert not Fingerprint.objects.filter(key=letter.fingerprint).exists()

    (row,) = store(ParsedDeadLetterFactory.build(error_message="Ledger closed for period 2026-11"))

    assert Fingerprint.objects.get(key=row.fingerprint).pattern_id == row.pattern_id
    assert FailurePattern.objects.get(pk=row.pattern_id).total_count == 1


@pytest.mark.django_db(transaction=True)
def test_new_fingerprints_are_filed_before_the_batch_and_stay_when_it_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> set[str]:
        raise RuntimeError("the database refused the batch")

    letter = ParsedDeadLetterFactory.build(error_message="Carrier rejected parcel 77812: weight 31kg over limit")
    with monkeypatch.context() as patched:
        patched.setattr(services, "_write", refuse)
        with pytest.raises(RuntimeError):
            store(letter)
    assert Fingerprint.objects.filter(key=letter.fingerprint).exists()
    assert not DeadLetter.objects.exists()

    (row,) = store(letter)

    assert Fingerprint.objects.get(key=row.fingerprint).pattern_id == row.pattern_id
    assert FailurePattern.objects.get(pk=row.pattern_id).total_count == 1
    assert DeadLetterCount.objects.get(pattern_id=row.pattern_id).count == 1
