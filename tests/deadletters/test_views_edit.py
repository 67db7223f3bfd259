"""Edit and retry: a form, a diff, then an edited copy sent while the original is kept and linked."""

from __future__ import annotations

import json
import re
import threading
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection as db_connection

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.core import jsonsafe
from dlqconsole.deadletters.models import DeadLetter, DeadLetterCount
from dlqconsole.operations.message_retry import edit_and_retry
from dlqconsole.operations.models import Operation
from tests.conftest import client_for
from tests.factories import EnvelopeFactory, store

SUBMISSION = "5" * 32

pytestmark = [pytest.mark.django_db]


def test_viewer_cannot_edit_and_retry(viewer: User) -> None:
    (stored,) = store(EnvelopeFactory.build())

    client = client_for(viewer)

    assert client.get(f"/messages/{stored.pk}/edit/").status_code == 403
    assert (
        client.post(f"/messages/{stored.pk}/edit/", {"body": "{}", "headers": "{}", "action": "send"}).status_code
        == 403
    )
    assert DeadLetter.objects.count() == 1
    assert "/edit/" not in client.get(f"/messages/{stored.pk}/").content.decode()


def test_edit_form_starts_from_the_payload_and_headers(operator: User) -> None:
    (stored,) = store(EnvelopeFactory.build(body=b'{"order": 7, "note": "<b>x</b>"}', headers={"tenant": "acme"}))

    html = client_for(operator).get(f"/messages/{stored.pk}/edit/").content.decode()

    assert re.search(r'name="submission" value="[0-9a-f]{32}"', html)

    assert "{&quot;order&quot;: 7, &quot;note&quot;: &quot;&lt;b&gt;x&lt;/b&gt;&quot;}" in html
    assert "&quot;tenant&quot;: &quot;acme&quot;" in html
    assert "x-death" not in html


def test_edit_form_leaves_out_the_failed_attempts_error_headers_and_the_diff_shows_it(operator: User) -> None:
    (stored,) = store(EnvelopeFactory.build(body=b'{"order": 7}', headers={"tenant": "acme"}))
    client = client_for(operator)

    html = client.get(f"/messages/{stored.pk}/edit/").content.decode()
    form_headers = html[html.index('name="headers"') :].split("</textarea>", 1)[0]
    preview = client.post(
        f"/messages/{stored.pk}/edit/",
        {
            "body": '{"order": 7}',
            "headers": json.dumps({"tenant": "acme"}),
            "action": "preview",
            "submission": SUBMISSION,
        },
    ).content.decode()

    assert "tenant" in form_headers and "x-exception-message" not in form_headers
    assert '<span class="del">-  &quot;x-exception-message&quot;' in preview


def test_preview_shows_the_diff_and_sends_nothing(operator: User) -> None:
    (stored,) = store(EnvelopeFactory.build(body=b'{"order": 7}'))
    headers = {"tenant": "acme"}

    response = client_for(operator).post(
        f"/messages/{stored.pk}/edit/",
        {"body": '{"order": 8}', "headers": json.dumps(headers), "action": "preview", "submission": SUBMISSION},
    )

    html = response.content.decode()
    assert response.status_code == 200
    # JSON is compared one member per line: the member that changed is the line that changed.
    assert '<span class="del">-  &quot;order&quot;: 7</span>' in html
    assert '<span class="add">+  &quot;order&quot;: 8</span>' in html
    assert 'value="send"' in html
    assert f'name="submission" value="{SUBMISSION}"' in html  # carried to the send
    assert DeadLetter.objects.count() == 1 and Operation.objects.count() == 0


def test_headers_nested_past_the_parsers_depth_are_refused_not_a_500(operator: User) -> None:
    (stored,) = store(EnvelopeFactory.build())

    response = client_for(operator).post(
        f"/messages/{stored.pk}/edit/", {"body": "{}", "headers": "[" * 200_000, "action": "send"}
    )

    assert response.status_code == 400
    assert "nested less deeply" in response.content.decode()
    assert DeadLetter.objects.count() == 1


def test_bad_headers_json_is_explained(operator: User) -> None:
    (stored,) = store(EnvelopeFactory.build())

    response = client_for(operator).post(
        f"/messages/{stored.pk}/edit/", {"body": "{}", "headers": "[1, 2", "action": "send"}
    )

    assert response.status_code == 400
    assert "Headers must be a JSON object" in response.content.decode()
    assert DeadLetter.objects.count() == 1


def test_send_keeps_the_original_and_retries_a_linked_copy(
    operator: User, celery_queue: str, django_capture_on_commit_callbacks
) -> None:
    (stored,) = store(EnvelopeFactory.build(body=b'{"order": 7}', headers={"tenant": "acme"}))
    original_body = bytes(stored.body)

    form = {
        "body": '{"order": 8}',
        "headers": '{"tenant": "globex", "fixed": true}',
        "action": "send",
        "submission": SUBMISSION,
    }
    with django_capture_on_commit_callbacks(execute=True) as enqueued:
        response = client_for(operator).post(f"/messages/{stored.pk}/edit/", form)
    # Sent again (a double click, a reloaded page): the same operation, no second copy.
    with django_capture_on_commit_callbacks(execute=True) as enqueued_again:
        again = client_for(operator).post(f"/messages/{stored.pk}/edit/", form)

    copy = DeadLetter.objects.get(edited_from=stored)
    operation = Operation.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/operations/{operation.pk}/"
    assert len(enqueued) == 1
    assert again.status_code == 302 and again["Location"] == response["Location"] and enqueued_again == []
    stored.refresh_from_db()
    assert bytes(stored.body) == original_body
    assert bytes(copy.body) == b'{"order": 8}'
    # The text search reads the edited body, not the original's.
    assert copy.search_text is not None and '{"order": 8}' in copy.search_text
    assert stored.search_text != copy.search_text
    assert jsonsafe.decode(copy.headers) == {"tenant": "globex", "fixed": True}
    assert list(operation.items.values_list("dead_letter_id", flat=True)) == [copy.pk]
    assert AuditEntry.objects.filter(action="deadletter.edit_retry", target=f"deadletter:{stored.pk}").exists()
    assert sum(DeadLetterCount.objects.values_list("count", flat=True)) == 2
    detail = client_for(operator).get(f"/messages/{stored.pk}/").content.decode()
    assert f'href="/messages/{copy.pk}/"' in detail


def test_binary_payload_cannot_be_edited_in_a_form(operator: User) -> None:
    (stored,) = store(EnvelopeFactory.build(body=b"\xff\xfe\x00binary", content_type="application/octet-stream"))

    html = client_for(operator).get(f"/messages/{stored.pk}/edit/").content.decode()

    assert "not UTF-8 text" in html and "<textarea" not in html


def test_the_message_page_offers_no_edit_that_would_be_refused(operator: User, settings: Any) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 300 * 1024
    (text,) = store(EnvelopeFactory.build(body=b'{"order": 7}'))
    (binary,) = store(EnvelopeFactory.build(body=b"\xff\xfe\x00binary", content_type="application/octet-stream"))
    (large,) = store(EnvelopeFactory.build(body=b'{"note": "' + b"x" * 60_000 + b'"}'))
    client = client_for(operator)

    assert f"/messages/{text.pk}/edit/" in client.get(f"/messages/{text.pk}/").content.decode()
    binary_page = client.get(f"/messages/{binary.pk}/").content.decode()
    large_page = client.get(f"/messages/{large.pk}/").content.decode()
    assert "/edit/" not in binary_page and "No edit and retry: the payload is not UTF-8 text" in binary_page
    assert "/edit/" not in large_page and "No edit and retry: the payload is too large to edit" in large_page


def test_a_payload_edited_into_invalid_json_is_flagged_but_may_be_sent(operator: User) -> None:
    (stored,) = store(EnvelopeFactory.build(body=b'{"order": 7}', content_type="application/json"))
    form = {"headers": "{}", "action": "preview", "submission": SUBMISSION}
    client = client_for(operator)

    broken = client.post(f"/messages/{stored.pk}/edit/", {**form, "body": '{"order": 7,}'}).content.decode()
    valid = client.post(f"/messages/{stored.pk}/edit/", {**form, "body": '{"order": 8}'}).content.decode()

    assert "The payload is not valid JSON (line 1, column 12: Illegal trailing comma before end of object)" in broken
    assert 'value="send"' in broken
    assert "not valid JSON" not in valid
    deep = client.post(f"/messages/{stored.pk}/edit/", {**form, "body": "[" * 100_000})
    assert deep.status_code == 200
    assert "The payload is not valid JSON (nested too deeply to read)" in deep.content.decode()


def test_a_payload_too_large_to_post_back_is_not_offered_for_editing(operator: User, settings: Any) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 300 * 1024
    (small,) = store(EnvelopeFactory.build(body=b'{"note": "' + b"x" * 20_000 + b'"}'))
    (large,) = store(EnvelopeFactory.build(body=b'{"note": "' + b"x" * 60_000 + b'"}'))
    client = client_for(operator)

    assert "<textarea" in client.get(f"/messages/{small.pk}/edit/").content.decode()
    html = client.get(f"/messages/{large.pk}/edit/").content.decode()
    assert "more than the 44.0\xa0KB the console can take back in a form" in html
    assert "<textarea" not in html


def test_an_edit_grown_past_the_form_limit_is_refused_whole_and_the_form_says_so_first(
    operator: User, settings: Any
) -> None:
    # The CSRF check reads the form before the view: the server can only refuse (400, nothing sent). The form
    # carries the limit so the browser refuses first and says why (tests/browser/test_message_retry.py).
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 300 * 1024
    (stored,) = store(EnvelopeFactory.build(body=b'{"order": 7}'))
    client = client_for(operator, enforce_csrf_checks=True)
    page = client.get(f"/messages/{stored.pk}/edit/").content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert token is not None

    response = client.post(
        f"/messages/{stored.pk}/edit/",
        {"body": "x" * 400 * 1024, "headers": "{}", "action": "send", "submission": SUBMISSION},
        headers={"X-CSRFToken": token.group(1)},
    )

    assert f'data-max-bytes="{44 * 1024}"' in page and "data-size-error" in page
    assert response.status_code == 400 and "Bad request" in response.content.decode()
    assert DeadLetter.objects.count() == 1 and Operation.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_the_same_edit_sent_twice_at_once_sends_one_copy(operator: User, celery_queue: str) -> None:
    """Two requests with one submission token racing (a double click): the second waits for the first and
    returns its operation."""
    (stored,) = store(EnvelopeFactory.build(body=b'{"order": 7}'))
    start = threading.Barrier(2)
    results: list[int] = []
    errors: list[BaseException] = []

    def send() -> None:
        try:
            start.wait()
            operation = edit_and_retry(
                dead_letter=stored, body=b'{"order": 8}', headers={}, actor=operator, submission=SUBMISSION
            )
            results.append(operation.pk)
        except BaseException as error:  # noqa: BLE001  (reported by the assertion below)
            errors.append(error)
        finally:
            db_connection.close()

    threads = [threading.Thread(target=send) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert errors == []
    assert len(results) == 2 and results[0] == results[1]
    assert DeadLetter.objects.filter(edited_from=stored).count() == 1
    assert Operation.objects.count() == 1
    assert sum(DeadLetterCount.objects.values_list("count", flat=True)) == 2


@pytest.mark.parametrize(
    ("value", "json_text"),
    [("beyond 64 bits", "123456789012345678901234567890"), ("infinite", "1e400"), ("NaN", "NaN")],
)
def test_a_header_amqp_cannot_carry_is_refused_and_nothing_is_sent_or_archived(
    operator: User, value: str, json_text: str
) -> None:
    (stored,) = store(EnvelopeFactory.build(body=b'{"order": 7}'))

    response = client_for(operator).post(
        f"/messages/{stored.pk}/edit/",
        {"body": '{"order": 8}', "headers": '{"n": ' + json_text + "}", "action": "send", "submission": SUBMISSION},
    )

    assert response.status_code == 400, value
    assert "Header &#x27;n&#x27; cannot be sent over AMQP: integers must fit in 64 bits" in response.content.decode()
    stored.refresh_from_db()
    assert (stored.status, DeadLetter.objects.count(), Operation.objects.count()) == ("parked", 1, 0)


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"nul\x00body", "the payload holds NUL characters, which a browser form cannot carry"),
        (b"old mac\rline", "the payload mixes line endings (CR, LF, CRLF), which a browser form would change"),
        (b"a\r\nb\nc", "the payload mixes line endings (CR, LF, CRLF), which a browser form would change"),
    ],
)
def test_a_payload_a_form_would_change_is_not_offered_for_editing(operator: User, body: bytes, why: str) -> None:
    (stored,) = store(EnvelopeFactory.build(body=body, content_type="text/plain"))
    client = client_for(operator)

    edit_page = client.get(f"/messages/{stored.pk}/edit/").content.decode()
    detail = client.get(f"/messages/{stored.pk}/").content.decode()
    posted = client.post(f"/messages/{stored.pk}/edit/", {"body": "x", "headers": "{}", "action": "send"})

    assert f"This payload cannot be edited in a form: {why}" in edit_page and "<textarea" not in edit_page
    assert f"No edit and retry: {why}" in detail and f"/messages/{stored.pk}/edit/" not in detail
    assert posted.status_code == 200 and DeadLetter.objects.count() == 1


def test_a_crlf_payload_keeps_its_line_endings_when_edited(
    operator: User, celery_queue: str, django_capture_on_commit_callbacks
) -> None:
    (stored,) = store(EnvelopeFactory.build(body=b"line one\r\nline two\r\n", content_type="text/plain"))

    with django_capture_on_commit_callbacks(execute=True):
        # The browser sends every line break of a textarea as CRLF.
        response = client_for(operator).post(
            f"/messages/{stored.pk}/edit/",
            {"body": "line one\r\nline 2\r\n", "headers": "{}", "action": "send", "submission": SUBMISSION},
        )

    assert response.status_code == 302
    assert bytes(DeadLetter.objects.get(edited_from=stored).body) == b"line one\r\nline 2\r\n"
