"""The text filter: a substring of the error type, the error message or the body's head, in any case, read from
search_text (its trigram index on PostgreSQL); rows stored before that column existed are found by their error until
beat fills them in."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from dlqconsole.deadletters.filters import DeadLetterFilter, FilterError
from dlqconsole.deadletters.models import DeadLetter
from dlqconsole.deadletters.search_fill import fill_search_text, pending_count
from dlqconsole.deadletters.tasks import fill_search_text_task
from tests.api.conftest import api_client, token_for
from tests.conftest import client_for
from tests.factories import EnvelopeFactory, ParsedDeadLetterFactory, store

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]

HX = {"HX-Request": "true"}


def found(text: str) -> set[int]:
    return set(DeadLetterFilter.from_dict({"text": text}).apply().values_list("pk", flat=True))


def letter(*, error: str = "Request failed", error_type: str = "RuntimeError", body: bytes = b"{}") -> DeadLetter:
    return store(EnvelopeFactory.build(error=error, error_type=error_type, body=body))[0]


def forget_search_text(*rows: DeadLetter) -> None:
    """As rows stored before the column existed have it."""
    DeadLetter.objects.filter(pk__in=[row.pk for row in rows]).update(search_text=None)


def test_finds_a_substring_of_the_type_the_message_and_the_body_in_any_case():
    by_type = letter(error_type="PaymentGatewayError")
    by_message = letter(error="Card DECLINED by issuer")
    by_body = letter(body=b'{"order": "ORD-4711", "sku": "Blue-Widget"}')
    letter(error="something else", body=b'{"order": "ORD-1"}')

    assert found("gatewayerr") == {by_type.pk}
    assert found("declined BY") == {by_message.pk}
    assert found("blue-WIDGET") == {by_body.pk}
    assert found("ord-4711") == {by_body.pk}


def test_a_term_that_spans_two_fields_is_not_found():
    """The fields are apart in the stored text (one per line): the end of the message and the start of the body do
    not make a word together."""
    row = letter(error="ends with alpha", body=b"beta begins")

    assert found("alpha") == found("beta") == {row.pk}
    assert found("alphabeta") == found("alpha beta") == set()


@override_settings(DLQ_SEARCH_BODY_BYTES=64)
def test_only_the_head_of_the_body_is_searched():
    body = b'{"pad": "' + b"x" * 100 + b'", "tail": "needle-far-away"}'
    row = letter(body=b'{"near": "needle-near"} ' + body)

    assert found("needle-near") == {row.pk}
    assert found("needle-far-away") == set()


def test_a_body_that_is_not_utf8_or_holds_nul_bytes_is_searched_as_text():
    """Bytes that are not UTF-8 become U+FFFD, a NUL too: the text around them is found, and does not run
    together across them."""
    latin1 = letter(body="café crème, prix: 4€".encode("latin-1", "replace") + b" ref=LATIN-77")
    binary = letter(body=b"\x00\x01\xffhead\x00tail ref=BIN-88\x00")

    assert found("latin-77") == {latin1.pk}
    assert found("caf") == {latin1.pk}
    assert found("ref=bin-88") == {binary.pk}
    assert found("head") == found("tail") == {binary.pk}
    assert found("headtail") == set()
    assert DeadLetter.objects.get(pk=binary.pk).body == b"\x00\x01\xffhead\x00tail ref=BIN-88\x00"  # byte for byte


def test_like_wildcards_in_the_term_match_only_themselves():
    percent = letter(error="disk 100% full")
    underscore = letter(error="unknown field user_id")
    letter(error="disk 1000 full, unknown field userXid")

    assert found("100% full") == {percent.pk}
    assert found("100%") == {percent.pk}
    assert found("user_id") == {underscore.pk}
    assert found("ser_i") == {underscore.pk}
    assert found("100%%") == set()
    assert found("user__") == set()


def test_letters_beyond_ascii_match_in_any_case():
    """Both the stored text and the term are case-folded in Python: accented capitals, the German sharp s and a
    Turkish capital I with its dot each find their lower-case forms."""
    unicode_row = letter(error="ÜNÏCODE decoding failed")
    german = letter(error="Straße nicht gefunden")
    turkish = letter(error="İstanbul deposu kapalı")

    assert found("ünïcode") == found("Ünïcode") == {unicode_row.pk}
    assert found("STRASSE") == found("straße") == {german.pk}
    assert found("İSTANBUL") == found("i\u0307stanbul") == {turkish.pk}
    # Known gaps (no locale rules, no accent folding): the dotted capital folds to i with a combining dot, so a
    # plain i does not find it; a dotless ı is another letter than i.
    assert found("istanbul") == found("KAPALI") == set()


def test_a_term_under_three_characters_is_refused():
    with pytest.raises(FilterError, match="text must be at least 3 characters"):
        DeadLetterFilter.from_dict({"text": "ab"})
    with pytest.raises(FilterError, match="at least 3"):
        DeadLetterFilter.from_dict({"text": " é "})  # spaces around a term are not part of it
    assert DeadLetterFilter.from_dict({"text": "abc"}).text == "abc"


def test_the_messages_page_says_a_short_term_is_refused(viewer):
    letter(error="Card declined")

    page = client_for(viewer).get("/messages/?text=de")
    fragment = client_for(viewer).get("/messages/?text=de", headers=HX)

    assert page.status_code == fragment.status_code == 200
    assert "text must be at least 3 characters" in page.content.decode()
    assert "text must be at least 3 characters" in fragment.content.decode()
    assert 'value="de"' in page.content.decode()  # the form keeps what was typed


def test_the_api_refuses_a_short_term_with_400(viewer):
    response = api_client(token_for(viewer)).get("/api/v1/dead-letters/", {"text": "de"})

    assert response.status_code == 400
    assert "text must be at least 3 characters" in str(response.json()["detail"])


def test_the_dlq_command_refuses_a_short_term():
    """A CommandError: the command prints it and exits with status 1."""
    with pytest.raises(CommandError, match="text must be at least 3 characters"):
        call_command("dlq", "archive", "--text", "de", "--dry-run")


def test_rows_stored_before_the_column_are_found_by_their_error_then_filled_in():
    old = letter(error="Card DECLINED by issuer", body=b'{"order": "ORD-9"}')
    new = letter(error="card declined again", body=b'{"order": "ORD-10"}')
    forget_search_text(old)

    assert pending_count() == 1
    assert found("declined") == {old.pk, new.pk}  # by its error message, in any case
    assert found("ord-9") == set()  # its body is not searched until it is filled in

    assert fill_search_text_task() == 1

    old.refresh_from_db()
    assert old.search_text == 'runtimeerror\ncard declined by issuer\n{"order": "ord-9"}'
    assert pending_count() == 0
    assert found("declined") == {old.pk, new.pk}
    assert found("ord-9") == {old.pk}


def test_filling_in_is_bounded_and_idempotent():
    rows = store(*EnvelopeFactory.build_batch(7, error="Request timed out"))
    forget_search_text(*rows)
    expected = {row.pk: row.search_text for row in rows}

    assert fill_search_text(limit=3, batch_size=2) == 3
    assert pending_count() == 4
    assert fill_search_text(limit=3, batch_size=2) == 3
    assert fill_search_text(limit=3, batch_size=2) == 1
    assert fill_search_text(limit=3, batch_size=2) == 0
    assert dict(DeadLetter.objects.filter(pk__in=expected).values_list("pk", "search_text")) == expected


def test_filling_in_leaves_other_rows_alone():
    filled, pending = store(*EnvelopeFactory.build_batch(2))
    DeadLetter.objects.filter(pk=filled.pk).update(search_text="kept as it is")
    forget_search_text(pending)

    assert fill_search_text() == 1

    assert DeadLetter.objects.get(pk=filled.pk).search_text == "kept as it is"


def test_the_command_fills_in_every_row_and_says_how_far_it_got():
    rows = store(*EnvelopeFactory.build_batch(5))
    forget_search_text(*rows)

    out = call_and_read("fill_search_text", "--batch-size", "2")

    assert "5 dead letters without search text" in out
    assert "5 of 5 (100%)" in out and "Done: 5 dead letters filled in." in out
    assert pending_count() == 0
    assert "nothing to do" in call_and_read("fill_search_text")


def call_and_read(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_a_failure_with_no_error_text_is_found_by_the_name_the_list_shows_for_it():
    """A broker-side death (maxlen, expired) or a Celery reject carries no error: the list shows the name grouping
    gives it, and the search finds that name, whether stored by ingest or filled in later."""
    (maxlen,) = store(
        ParsedDeadLetterFactory.build(
            error_type="",
            error_message="",
            death_reason="maxlen",
            source_queue="inventory.dlq",
            original_queue="inventory",
        )
    )
    (task,) = store(
        ParsedDeadLetterFactory.build(
            error_type="", error_message="", death_reason="rejected", task_name="shop.generate_invoice"
        )
    )
    assert maxlen.pattern.template == "maxlen from inventory"
    assert found("maxlen from invent") == {maxlen.pk}
    assert found("generate_invoice") == found("Celery task shop.generate") == {task.pk}
    forget_search_text(maxlen, task)
    fill_search_text()
    assert found("maxlen from invent") == {maxlen.pk}
    assert found("generate_invoice") == {task.pk}


def test_a_term_without_three_letters_or_digits_in_a_row_is_refused():
    """Trigrams come from runs of letters and digits: `---` or `a.b` would read every row."""
    for term in ("---", "a.b", '":"', "ab-cd", "___"):
        with pytest.raises(FilterError, match="3 letters or digits in a row"):
            DeadLetterFilter.from_dict({"text": term})
    for term in ("404", "x-ray", "50%_off", "日本語"):
        assert DeadLetterFilter.from_dict({"text": term}).text == term


def test_the_dlq_command_refuses_a_filter_given_blank():
    """`--text "$TERM"` with TERM empty must not widen a purge to every dead letter."""
    letter()
    for options in (["--text", "   "], ["--text="], ["--queue", ""], ["--since", " "]):
        with pytest.raises(CommandError, match="is blank"):
            call_command("dlq", "purge", *options, "--dry-run")
    assert DeadLetter.objects.count() == 1
