"""Hostile dead letters on every page that shows one: the message page, its edit page, its Django admin page, the
messages list and its pattern's page answer, each under 5 MB, whatever the body and headers hold. A body or a
header too deep or too large to lay out is shown as text, cut at a stated size, with a link to the raw download."""

from __future__ import annotations

import datetime as dt
import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pika
import pika.data
import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape

from dlqconsole.deadletters.models import DeadLetter, FailurePattern
from dlqconsole.deadletters.payload import header_rows
from dlqconsole.ingest.amqp_decoding import decode_table
from dlqconsole.ingest.envelope import parse_envelope
from dlqconsole.ingest.services import ingest_batch
from tests.conftest import client_for
from tests.hostile import HOSTILE_BODIES, HostileBody

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]

PAGE_LIMIT = 5 * 1024 * 1024
_serial = itertools.count(1)


def nested_table(depth: int) -> dict[str, Any]:
    table: dict[str, Any] = {"leaf": "bottom"}
    for _ in range(depth):
        table = {"a": table}
    return table


def deepest_table_on_the_wire() -> dict[str, Any]:
    """A header table nested as deep as pika can encode it (about 490 levels at a test's stack depth; 1,000 is
    past its recursion limit), encoded and decoded as a delivery would be."""
    for depth in range(1000, 0, -10):
        pieces: list[bytes] = []
        try:
            pika.data.encode_table(pieces, {"x-deep": nested_table(depth)})
        except RecursionError:
            continue
        table, _ = decode_table(b"".join(pieces), 0)
        return table
    raise AssertionError("pika encodes no nested table")


def death(number: int = 0) -> dict[str, Any]:
    return {
        "count": number + 1,
        "reason": "rejected",
        "queue": "orders",
        "time": dt.datetime(2026, 11, 20, 10, 0, tzinfo=dt.UTC),
        "exchange": "shop",
        "routing-keys": ["orders.created"],
    }


def header_indent_bomb() -> dict[str, Any]:
    """A table 60 levels deep (under the 64 ingest keeps as tables) with 40,000 small entries at the bottom: laid
    out with indentation, each entry would take a line of 120 spaces."""
    table: dict[str, Any] = {f"k{number}": number for number in range(40_000)}
    for _ in range(60):
        table = {"a": table}
    return {"x-bomb": table}


@dataclass(frozen=True)
class HostileHeaders:
    name: str
    headers: Callable[[], dict[Any, Any]]
    # Replaces the one-entry x-death the other cases get.
    x_death: Callable[[], list[Any]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


HOSTILE_HEADERS: tuple[HostileHeaders, ...] = (
    HostileHeaders("headers-nested-1000", lambda: {"x-deep": nested_table(1000)}),
    HostileHeaders("headers-nested-on-the-wire", deepest_table_on_the_wire),
    HostileHeaders("headers-5000", lambda: {f"h-{number}": "<\"'&>" * 40 for number in range(5000)}),
    HostileHeaders(
        "header-names-not-text", lambda: {f"bad-{number}-\xff".encode("latin-1"): 1 for number in range(5000)}
    ),
    HostileHeaders(
        "header-values-1mb",
        lambda: {
            "x-note": '"' * (1024 * 1024),
            "x-exception-message": "<" * (1024 * 1024),
            "x-exception-stacktrace": "'" * (1024 * 1024),
            "x-blob": b"\xff" * (1024 * 1024),
        },
    ),
    HostileHeaders("header-indent-bomb", header_indent_bomb),
    # Text with NUL is stored tagged (base64 of its UTF-8, lone surrogates kept): a page cannot send those as UTF-8.
    HostileHeaders(
        "header-nul-and-lone-surrogates", lambda: {"x-odd": "a\x00b\ud800c", "x-table": {"k": "\udfff\x00"}}
    ),
    HostileHeaders(
        "x-death-20000",
        dict,
        x_death=lambda: [
            {**death(number), "routing-keys": [f"key-{key}" for key in range(50)], "note": "<" * 200}
            for number in range(20_000)
        ],
    ),
    HostileHeaders(
        "x-death-entry-with-5000-fields",
        dict,
        x_death=lambda: [{**death(), **{f"f{n}": "&" * 100 for n in range(5000)}}],
    ),
)

# Bodies the shared set leaves out: ones that stay editable in a form (UTF-8, under the form's limit) and grow
# six times when escaped for HTML.
EDITABLE_BODIES: tuple[HostileBody, ...] = (
    HostileBody("quotes-2mb", b'"' * (2 * 1024 * 1024), "text/plain"),
    HostileBody("markup-2mb", b"<a href='x'>&</a>" * (2 * 1024 * 1024 // 17), "text/plain"),
    # Deep enough to pass the depth limit (90 levels), and laid out it would take megabytes.
    HostileBody("indent-bomb-under-depth-limit", b"[" * 90 + b"0," * 31_000 + b"0" + b"]" * 90),
)


def store(
    *,
    body: bytes = b'{"order": 1}',
    content_type: str = "application/json",
    content_encoding: str = "",
    headers: dict[Any, Any] | None = None,
    x_death: list[Any] | None = None,
) -> DeadLetter:
    """A dead letter made as production makes one, through parse_envelope and ingest_batch."""
    serial = next(_serial)
    properties = pika.BasicProperties(
        message_id=f"hostile-{serial}",
        content_type=content_type,
        content_encoding=content_encoding or None,
        headers={
            "x-death": x_death if x_death is not None else [death()],
            "x-exception-type": "HostileError",
            "x-exception-message": "hostile payload",
            **(headers or {}),
        },
    )
    parsed = parse_envelope(source_queue="orders.dlq", body=body, properties=properties, now=timezone.now())
    ingest_batch(letters=[parsed])
    return DeadLetter.objects.get(dedupe_key=parsed.dedupe_key)


def pages_of(stored: DeadLetter) -> dict[str, str]:
    return {
        "message": f"/messages/{stored.pk}/",
        "edit": f"/messages/{stored.pk}/edit/",
        "admin": reverse("admin:deadletters_deadletter_change", args=[stored.pk]),
        "list": "/messages/",
        "pattern": f"/patterns/{stored.pattern_id}/",
        "pattern-admin": reverse("admin:deadletters_failurepattern_change", args=[stored.pattern_id]),
    }


def assert_every_page_is_bounded(stored: DeadLetter, *users: User) -> None:
    """Each page answers (the edit page refuses a viewer) in under 5 MB; every page that does not is named."""
    wrong = []
    for user in users:
        client = client_for(user)
        client.raise_request_exception = False  # a 500 is reported with the others, not raised
        for page, url in pages_of(stored).items():
            response = client.get(url)
            expected = 403 if page == "edit" and user.username == "vera-viewer" else 200
            if response.status_code != expected or len(response.content) >= PAGE_LIMIT:
                wrong.append(f"{user.username} {page}: {response.status_code}, {len(response.content):,} bytes")
    assert wrong == []


@pytest.mark.parametrize("hostile", HOSTILE_BODIES + EDITABLE_BODIES, ids=lambda hostile: hostile.name)
def test_every_page_of_a_hostile_body_answers_under_5_mb(hostile: HostileBody, admin_user: User, viewer: User) -> None:
    stored = store(body=hostile.body, content_type=hostile.content_type, content_encoding=hostile.content_encoding)

    # Stored whole, or (over DLQ_MAX_BODY_BYTES) cut, its first part kept.
    assert bytes(stored.body) == hostile.body[: settings.DLQ_MAX_BODY_BYTES]
    assert_every_page_is_bounded(stored, admin_user, viewer)


@pytest.mark.parametrize("hostile", HOSTILE_HEADERS, ids=lambda hostile: hostile.name)
def test_every_page_of_hostile_headers_answers_under_5_mb(
    hostile: HostileHeaders, admin_user: User, viewer: User
) -> None:
    stored = store(headers=hostile.headers(), x_death=hostile.x_death() if hostile.x_death else None)

    assert_every_page_is_bounded(stored, admin_user, viewer)


def test_all_hostile_letters_on_one_list_and_pattern_page(admin_user: User, viewer: User) -> None:
    for hostile in HOSTILE_BODIES:
        store(body=hostile.body, content_type=hostile.content_type, content_encoding=hostile.content_encoding)
    store(headers={"x-exception-message": "<" * (1024 * 1024)})
    pattern = FailurePattern.objects.get(template="hostile payload")

    for user in (admin_user, viewer):
        client = client_for(user)
        for url in ("/messages/", f"/patterns/{pattern.pk}/", reverse("admin:deadletters_deadletter_changelist")):
            response = client.get(url)
            assert response.status_code == 200
            assert len(response.content) < PAGE_LIMIT


def payload_heading(html: str) -> str:
    found = re.search(r"<h2>Payload(.*?)</h2>", html, re.S)
    assert found, "no payload heading"
    return found.group(1)


@pytest.mark.parametrize(
    ("name", "notice"),
    [
        ("nested-1200", "shown as text: nested deeper than 100 levels"),
        ("nested-10000", "shown as text: nested deeper than 100 levels"),
        ("indent-bomb-64k", "shown as text: nested deeper than 100 levels"),
        ("nested-objects-12k", "shown as text: nested deeper than 100 levels"),
    ],
)
def test_a_body_too_deep_to_lay_out_is_shown_as_text_with_the_raw_download(
    name: str, notice: str, viewer: User
) -> None:
    (hostile,) = [body for body in HOSTILE_BODIES if body.name == name]
    stored = store(body=hostile.body)

    response = client_for(viewer).get(f"/messages/{stored.pk}/")

    html = response.content.decode()
    assert response.status_code == 200
    assert notice in payload_heading(html)
    assert f'href="/messages/{stored.pk}/body/"' in payload_heading(html)
    assert escape(hostile.body.decode()[:200]) in html  # the body as it was sent, not laid out


def test_a_body_that_would_lay_out_too_large_is_shown_as_text(viewer: User) -> None:
    stored = store(body=EDITABLE_BODIES[2].body)

    html = client_for(viewer).get(f"/messages/{stored.pk}/").content.decode()

    assert "shown as text: laid out with indentation it would be more than 262,144 characters" in payload_heading(html)
    assert ("[" * 90 + "0,0,0,") in html


def test_a_deep_but_small_body_is_still_laid_out(viewer: User) -> None:
    stored = store(body=b"[" * 100 + b"1" + b"]" * 100)

    html = client_for(viewer).get(f"/messages/{stored.pk}/").content.decode()

    assert "shown as text" not in payload_heading(html)
    assert ">JSON · " in payload_heading(html)
    assert "\n" + " " * 200 + "1\n" in html


def test_a_large_body_says_how_much_of_it_is_shown(viewer: User) -> None:
    (hostile,) = [body for body in HOSTILE_BODIES if body.name == "twenty-megabytes"]
    stored = store(body=hostile.body, content_type=hostile.content_type)

    html = client_for(viewer).get(f"/messages/{stored.pk}/").content.decode()
    heading = payload_heading(html)

    # 20 MB delivered, over DLQ_MAX_BODY_BYTES: 16 MB kept, and the page says both.
    assert "first 64.0\xa0KB of 16.0\xa0MB shown" in heading
    assert f'href="/messages/{stored.pk}/body/"' in heading
    assert "Cut at ingest: 20.0\xa0MB were delivered" in html


def test_a_gzip_bomb_is_inflated_only_as_far_as_the_preview(viewer: User) -> None:
    (hostile,) = [body for body in HOSTILE_BODIES if body.name == "gzip-bomb"]
    stored = store(body=hostile.body, content_encoding="gzip")

    heading = payload_heading(client_for(viewer).get(f"/messages/{stored.pk}/").content.decode())

    assert "decompressed from gzip" in heading
    assert "first 64.0\xa0KB of the decompressed body shown" in heading


def header_value(html: str, name: str) -> str:
    found = re.search(
        rf'data-testid="header-name">{re.escape(name)}</td>\s*<td class="text mono small" data-testid="header-value">'
        r"(.*?)</td>",
        html,
        re.S,
    )
    assert found, f"no header {name}"
    return found.group(1)


def test_a_huge_header_value_is_cut_with_a_note(viewer: User) -> None:
    stored = store(headers={"x-note": "n" * (1024 * 1024)})

    html = client_for(viewer).get(f"/messages/{stored.pk}/").content.decode()

    value = header_value(html, "x-note")
    assert value.startswith("n" * 1000)
    assert "n" * 1001 not in value
    assert "first 1,000 of 1,048,576 characters" in value


def test_a_deep_header_table_is_shown_cut_without_error(viewer: User) -> None:
    stored = store(headers={"x-deep": nested_table(1000)})

    response = client_for(viewer).get(f"/messages/{stored.pk}/")

    value = header_value(response.content.decode(), "x-deep")
    assert response.status_code == 200
    assert value.startswith("{&quot;a&quot;: {&quot;a&quot;: ")
    assert "first 1,000 of" in value


def test_many_headers_are_shown_in_part_with_a_count(viewer: User) -> None:
    stored = store(headers={f"h-{number:04}": "v" for number in range(5000)})

    html = client_for(viewer).get(f"/messages/{stored.pk}/").content.decode()

    assert html.count('data-testid="header-name"') == 100
    assert "100 of 5,003 headers shown" in html
    assert f'href="/messages/export/?ids={stored.pk}&amp;status=parked&amp;format=jsonl"' in html


def test_a_long_death_history_shows_the_newest_entries_with_a_count(viewer: User) -> None:
    entries = [{**death(number), "queue": f"queue-{number}"} for number in range(2000)]
    stored = store(x_death=entries)

    html = client_for(viewer).get(f"/messages/{stored.pk}/").content.decode()

    history = html.split('id="death-history"')[1].split("</section>")[0]
    # RabbitMQ keeps the newest entry first; the page shows the newest 20, oldest first.
    assert history.count("<li>") == 20
    assert "queue-0<" in history and "queue-19<" in history and "queue-20<" not in history
    assert history.index("queue-19<") < history.index("queue-0<")
    assert "The newest 20 of 2,000 entries shown" in history


def test_many_parse_problems_are_shown_in_part(viewer: User) -> None:
    stored = store(headers={f"bad-{number}-\xff".encode("latin-1"): 1 for number in range(500)})
    assert len(stored.parse_errors) > 50

    html = client_for(viewer).get(f"/messages/{stored.pk}/").content.decode()

    problems = html.split("<dt>Parse problems</dt>")[1].split("</dd>")[0]
    assert problems.count("<li>") == 50
    assert f"50 of {len(stored.parse_errors):,} problems shown" in problems


def test_admin_raw_fields_of_deep_wide_headers_are_cut_with_a_note(admin_user: User) -> None:
    stored = store(headers=header_indent_bomb())

    response = client_for(admin_user).get(reverse("admin:deadletters_deadletter_change", args=[stored.pk]))

    html = response.content.decode()
    assert response.status_code == 200
    assert len(response.content) < PAGE_LIMIT
    assert "shown on one line: laid out with indentation it would be more than 65,536 characters" in html
    assert "first 65,536 of" in html


def test_admin_payload_of_the_indent_bomb_is_shown_as_text(admin_user: User) -> None:
    (hostile,) = [body for body in HOSTILE_BODIES if body.name == "indent-bomb-64k"]
    stored = store(body=hostile.body)

    html = client_for(admin_user).get(reverse("admin:deadletters_deadletter_change", args=[stored.pk])).content.decode()

    assert "shown as text: nested deeper than 100 levels" in html
    assert f'href="/messages/{stored.pk}/body/"' in html


def test_a_body_that_would_escape_past_the_page_limit_is_not_offered_for_editing(operator: User) -> None:
    stored = store(body=EDITABLE_BODIES[0].body, content_type="text/plain")
    client = client_for(operator)

    detail = client.get(f"/messages/{stored.pk}/").content.decode()
    edit = client.get(f"/messages/{stored.pk}/edit/")

    assert "No edit and retry: the payload is too large to edit in a form" in detail
    assert edit.status_code == 200 and len(edit.content) < PAGE_LIMIT
    assert "<textarea" not in edit.content.decode()
    assert (
        "This dead letter cannot be edited here: the payload is too large to edit in a form: escaped for the page "
        "it takes 12.0\xa0MB, and at most 2.0\xa0MB fit."
    ) in edit.content.decode()


def test_headers_that_would_escape_past_the_page_limit_are_not_offered_for_editing(operator: User) -> None:
    stored = store(headers={f"h-{number}": "<\"'&>" * 40 for number in range(5000)})
    client = client_for(operator)

    detail = client.get(f"/messages/{stored.pk}/").content.decode()
    edit = client.get(f"/messages/{stored.pk}/edit/").content.decode()

    assert "No edit and retry: the headers are too large to edit in a form: escaped for the page they take" in detail
    assert "This dead letter cannot be edited here: the headers are too large to edit in a form" in edit
    assert "<textarea" not in edit


def test_the_diff_of_an_edited_indent_bomb_is_bounded(operator: User) -> None:
    (hostile,) = [body for body in HOSTILE_BODIES if body.name == "indent-bomb-64k"]
    stored = store(body=hostile.body)
    edited = hostile.body.decode().replace("0]", "1]", 1)

    response = client_for(operator).post(
        f"/messages/{stored.pk}/edit/",
        {"body": edited, "headers": "{}", "submission": "7" * 32, "action": "preview"},
    )

    html = response.content.decode()
    assert response.status_code == 200
    assert len(response.content) < PAGE_LIMIT
    # Compared as sent, one line of 64 KB each side, not laid out (that would be 57 MB a side).
    assert '<span class="del">-' + "[" * 900 + "0,0,0," in html
    assert "… the rest is left out: the diff is longer than 2,000 lines or 100,000 characters" in html


def test_the_diff_of_an_edit_that_moves_400_000_lines_is_bounded(operator: User) -> None:
    (hostile,) = [body for body in HOSTILE_BODIES if body.name == "many-lines"]
    stored = store(body=hostile.body, content_type=hostile.content_type)

    response = client_for(operator).post(
        f"/messages/{stored.pk}/edit/",
        {"body": "x" + hostile.body.decode(), "headers": "{}", "submission": "8" * 32, "action": "preview"},
    )

    html = response.content.decode()
    assert response.status_code == 200
    assert len(response.content) < PAGE_LIMIT
    assert '<span class="hunk">@@ -1,' in html
    payload_diff = html.split("<h3>Payload</h3>")[1].split("</pre>")[0]
    assert payload_diff.count("<span class=") == 2001  # 2,000 lines, then the note that the rest is left out
    assert "… the rest is left out: the diff is longer than 2,000 lines or 100,000 characters" in html


def test_headers_stored_deeper_than_decoding_reads_are_shown_as_stored() -> None:
    deep: Any = "bottom"
    for _ in range(500):
        deep = [deep]

    (row,) = header_rows({"x-deep": deep})

    assert row.name == "(headers)"
    assert row.value.startswith('{"x-deep": [[[[')
    assert row.cut == "shown as stored: nested deeper than 400 levels; first 1,000 of 1,020 characters shown"
