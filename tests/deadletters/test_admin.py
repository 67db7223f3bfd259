from __future__ import annotations

import datetime as dt
import re

import pika
import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.deadletters.admin import CountCappedPaginator
from dlqconsole.deadletters.models import DeadLetter, FailurePattern, PatternEvent
from dlqconsole.ingest.envelope import parse_envelope
from dlqconsole.ingest.models import WatchedQueue
from dlqconsole.ingest.services import ingest_batch
from tests.conftest import client_for
from tests.factories import UserFactory

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]

CHANGELIST = "admin:deadletters_deadletter_changelist"


def store(
    message_id: str,
    *,
    queue: str = "orders",
    reason: str = "rejected",
    body: bytes = b'{"order_id": 1}',
    content_type: str = "application/json",
    headers: dict[str, object] | None = None,
) -> DeadLetter:
    death = {
        "count": 1,
        "reason": reason,
        "queue": queue,
        "time": dt.datetime(2026, 11, 20, 10, 0, tzinfo=dt.UTC),
        "exchange": "shop",
        "routing-keys": [f"{queue}.created"],
    }
    properties = pika.BasicProperties(
        message_id=message_id,
        correlation_id=f"corr-{message_id}",
        content_type=content_type,
        headers={"x-death": [death], **(headers or {})},
    )
    parsed = parse_envelope(source_queue=f"{queue}.dlq", body=body, properties=properties, now=timezone.now())
    ingest_batch(letters=[parsed])
    return DeadLetter.objects.get(message_id=message_id)


@pytest.fixture
def letters() -> dict[str, DeadLetter]:
    return {
        "timeout": store("m-timeout", headers={"x-exception-message": "Read timed out after 3000ms"}),
        "invalid": store(
            "m-invalid", queue="payments", headers={"x-exception-message": "field 'amount' must be greater than 0"}
        ),
        "expired": store("m-expired", queue="emails", reason="expired"),
        "task": store(
            "m-task",
            body=b"[[], {}, {}]",
            headers={"task": "shop.invoices.generate_invoice", "id": "task-1234", "retries": 2},
        ),
    }


@pytest.fixture
def admin_client(client: Client) -> Client:
    """A superuser (the tests' conftest defines admin_user as the admin role, which is not staff)."""
    client.force_login(User.objects.create_superuser("root", password="pw-root"))
    return client


@pytest.fixture
def staff_client(client: Client) -> Client:
    """A staff user (not a superuser) of the operator role who may view everything and change patterns."""
    user = UserFactory.create(username="sam-staff", is_staff=True, role="operator")
    names = [
        "view_deadletter",
        "view_failurepattern",
        "change_failurepattern",
        "view_deadlettercount",
        "view_patternevent",
        "view_watchedqueue",
    ]
    user.user_permissions.add(*Permission.objects.filter(codename__in=names))
    client.force_login(user)
    return client


def listed(response: object) -> set[str]:
    """Message ids of the rows the changelist shows (each row links to its change page)."""
    html = response.content.decode()  # type: ignore[attr-defined]
    return {
        dead_letter.message_id
        for dead_letter in DeadLetter.objects.all()
        if f'href="{reverse("admin:deadletters_deadletter_change", args=[dead_letter.pk])}' in html
    }


def test_dead_letter_changelist_shows_queue_reason_pattern_status_and_error(
    admin_client: Client, letters: dict[str, DeadLetter]
) -> None:
    response = admin_client.get(reverse(CHANGELIST))

    assert response.status_code == 200
    html = response.content.decode()
    for column in ("orders.dlq", "Timeout", "Read timed out after &lt;NUM&gt;ms", "Parked", "4 dead letters"):
        assert column in html
    assert "Read timed out after 3000ms" in html


def test_staff_user_can_open_the_changelist_and_change_page(
    staff_client: Client, letters: dict[str, DeadLetter]
) -> None:
    dead_letter = letters["timeout"]

    assert staff_client.get(reverse(CHANGELIST)).status_code == 200
    page = staff_client.get(reverse("admin:deadletters_deadletter_change", args=[dead_letter.pk]))

    assert page.status_code == 200
    assert "m-timeout" in page.content.decode()


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"failure_reason__exact": "TIMEOUT"}, {"m-timeout"}),
        ({"failure_reason__exact": "VALIDATION_FAILED"}, {"m-invalid"}),
        ({"death_reason__exact": "expired"}, {"m-expired"}),
        ({"queue": "payments.dlq"}, {"m-invalid"}),
        ({"status__exact": "parked"}, {"m-timeout", "m-invalid", "m-expired", "m-task"}),
        ({"status__exact": "replayed"}, set()),
        ({"q": "m-expired"}, {"m-expired"}),
        ({"q": "corr-m-invalid"}, {"m-invalid"}),
        ({"q": "task-1234"}, {"m-task"}),
        ({"q": "timed out"}, {"m-timeout"}),
    ],
)
def test_changelist_filters_and_search(
    admin_client: Client, letters: dict[str, DeadLetter], query: dict[str, str], expected: set[str]
) -> None:
    response = admin_client.get(reverse(CHANGELIST), query)

    assert response.status_code == 200
    assert listed(response) == expected


def test_pattern_and_ingested_date_filters(admin_client: Client, letters: dict[str, DeadLetter]) -> None:
    pattern = letters["invalid"].pattern
    DeadLetter.objects.filter(pk=letters["expired"].pk).update(ingested_at=timezone.now() - dt.timedelta(days=40))
    midnight = timezone.localtime().replace(hour=0, minute=0, second=0, microsecond=0)

    by_pattern = admin_client.get(reverse(CHANGELIST), {"pattern": str(pattern.pk)})
    # The parameters of the filter's own "Past 7 days" link.
    recent = admin_client.get(
        reverse(CHANGELIST),
        {
            "ingested_at__gte": str(midnight - dt.timedelta(days=7)),
            "ingested_at__lt": str(midnight + dt.timedelta(days=1)),
        },
    )

    assert listed(by_pattern) == {"m-invalid"}
    assert listed(recent) == {"m-timeout", "m-invalid", "m-task"}


def test_the_queue_filter_offers_every_dead_letter_queue_and_the_watched_ones_that_hold_none_yet(
    admin_client: Client, letters: dict[str, DeadLetter]
) -> None:
    WatchedQueue.objects.create(name="refunds", dead_letter_queue="refunds.dlq", dead_letter_exchange="refunds.dlx")

    page = admin_client.get(reverse(CHANGELIST)).content.decode()

    assert "?queue=refunds.dlq" in page and "?queue=payments.dlq" in page


def test_script_payload_is_shown_escaped_never_as_markup(admin_client: Client) -> None:
    dead_letter = store("m-xss", body=b"<script>alert('owned')</script><b>bold</b>", content_type="text/html")

    response = admin_client.get(reverse("admin:deadletters_deadletter_change", args=[dead_letter.pk]))

    html = response.content.decode()
    assert response.status_code == 200
    assert "&lt;script&gt;alert(&#x27;owned&#x27;)&lt;/script&gt;&lt;b&gt;bold&lt;/b&gt;" in html
    assert "<script>alert(" not in html
    assert "<b>bold</b>" not in html
    assert "UTF-8 text" in html


def test_binary_payload_is_shown_as_a_hex_dump(admin_client: Client) -> None:
    dead_letter = store("m-binary", body=b"\xff\xfe\x00\x01\x80binary", content_type="application/octet-stream")

    response = admin_client.get(reverse("admin:deadletters_deadletter_change", args=[dead_letter.pk]))

    html = response.content.decode()
    assert "binary, hex dump" in html
    assert "00000000  ff fe 00 01 80 62 69 6e 61 72 79" in html


def test_raw_fields_are_read_only_and_dead_letters_cannot_be_added_changed_or_deleted(
    admin_client: Client, letters: dict[str, DeadLetter]
) -> None:
    dead_letter = letters["timeout"]
    change_url = reverse("admin:deadletters_deadletter_change", args=[dead_letter.pk])

    page = admin_client.get(change_url).content.decode()
    posted = admin_client.post(change_url, {"status": "archived", "headers": "{}", "error_message": "edited"})

    for raw in ("x-death", "headers", "properties", "payload"):
        assert raw in page
    assert 'name="headers"' not in page and 'name="body"' not in page and 'name="status"' not in page
    assert "&quot;x-exception-message&quot;: &quot;Read timed out after 3000ms&quot;" in page
    assert posted.status_code == 403
    dead_letter.refresh_from_db()
    assert (dead_letter.status, dead_letter.error_message) == ("parked", "Read timed out after 3000ms")
    assert admin_client.get(reverse("admin:deadletters_deadletter_add")).status_code == 403
    assert admin_client.post(reverse("admin:deadletters_deadletter_delete", args=[dead_letter.pk])).status_code == 403
    assert DeadLetter.objects.filter(pk=dead_letter.pk).exists()


def test_changelist_never_counts_every_dead_letter(
    admin_client: Client, letters: dict[str, DeadLetter], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(CountCappedPaginator, "cap", 2)
    admin_client.get(reverse(CHANGELIST))  # warm caches (sessions, content types)

    with CaptureQueriesContext(connection) as queries:
        response = admin_client.get(reverse(CHANGELIST), {"status__exact": "parked"})

    counts = [query["sql"] for query in queries if "COUNT(" in query["sql"].upper()]
    assert counts, "the paginator still counts, within its cap"
    assert all("LIMIT 3" in sql for sql in counts), counts
    assert "More than 2 dead letters" in response.content.decode()
    assert "more than 2 results" in response.content.decode()


def test_pattern_admin_lists_and_filters_patterns(admin_client: Client, letters: dict[str, DeadLetter]) -> None:
    FailurePattern.objects.filter(pk=letters["expired"].pattern_id).update(status="ignored")

    everything = admin_client.get(reverse("admin:deadletters_failurepattern_changelist"))
    ignored = admin_client.get(reverse("admin:deadletters_failurepattern_changelist"), {"status__exact": "ignored"})
    page = admin_client.get(reverse("admin:deadletters_failurepattern_change", args=[letters["timeout"].pattern_id]))

    assert everything.status_code == 200
    assert "Read timed out after &lt;NUM&gt;ms" in everything.content.decode()
    assert "Read timed out" not in ignored.content.decode()
    assert page.status_code == 200
    assert "orders.dlq parked: 1" in page.content.decode()
    assert f"?pattern={letters['timeout'].pattern_id}" in page.content.decode()


def test_pattern_status_change_in_the_admin_goes_through_the_triage_service(
    staff_client: Client, letters: dict[str, DeadLetter]
) -> None:
    pattern = letters["timeout"].pattern

    response = staff_client.post(
        reverse("admin:deadletters_failurepattern_change", args=[pattern.pk]),
        {"status": "acknowledged", "owner": "", "note": "PSP is slow, ticket OPS-1"},
    )

    assert response.status_code == 302
    pattern.refresh_from_db()
    assert (pattern.status, pattern.note) == ("acknowledged", "PSP is slow, ticket OPS-1")
    event = PatternEvent.objects.get(pattern=pattern, kind=PatternEvent.Kind.STATUS)
    assert (event.from_status, event.to_status) == ("open", "acknowledged")
    # The triage service's audit row, not a second one from the admin.
    assert AuditEntry.objects.filter(action="pattern.status").count() == 1
    assert not AuditEntry.objects.filter(action__startswith="admin.").exists()


def test_an_operator_picks_a_pattern_owner_in_the_admin_among_those_who_may_own_it(
    operator: User, viewer: User, admin_user: User, letters: dict[str, DeadLetter]
) -> None:
    # The owner was an autocomplete over the user admin, which only admins may read: for an operator it answered
    # 403 ("The results could not be loaded"). The choices are those of the console's pattern page instead.
    pattern = letters["timeout"].pattern
    client = client_for(operator)
    url = reverse("admin:deadletters_failurepattern_change", args=[pattern.pk])

    page = client.get(url).content.decode()
    select = re.search(r'<select name="owner"[^>]*>(.*?)</select>', page, re.S)
    assert select is not None
    owners = re.findall(r'<option value="\d+"[^>]*>([^<]+)</option>', select.group(1))
    refused = client.post(url, {"status": "open", "owner": str(viewer.pk), "note": ""})
    taken = client.post(url, {"status": "open", "owner": str(operator.pk), "note": ""})

    assert "autocomplete" not in select.group(0)
    assert owners == [admin_user.username, operator.username]
    assert refused.status_code == 200 and "Select a valid choice" in refused.content.decode()
    assert taken.status_code == 302
    pattern.refresh_from_db()
    assert pattern.owner == operator
    assert AuditEntry.objects.filter(action="pattern.assign", actor=operator).count() == 1


def test_viewer_cannot_change_a_pattern_in_the_admin(client: Client, letters: dict[str, DeadLetter]) -> None:
    user = UserFactory.create(username="vic-viewer", is_staff=True, role="viewer")
    user.user_permissions.add(*Permission.objects.filter(codename__in=["view_failurepattern", "change_failurepattern"]))
    client.force_login(user)
    pattern = letters["timeout"].pattern

    response = client.post(
        reverse("admin:deadletters_failurepattern_change", args=[pattern.pk]), {"status": "ignored", "note": "x"}
    )

    assert response.status_code == 403
    pattern.refresh_from_db()
    assert pattern.status == "open"


def test_viewer_opens_a_pattern_in_the_admin_read_only_and_a_post_changes_nothing(
    viewer: User, letters: dict[str, DeadLetter]
) -> None:
    client = client_for(viewer)
    pattern = letters["timeout"].pattern
    url = reverse("admin:deadletters_failurepattern_change", args=[pattern.pk])

    page = client.get(url)
    sent = client.post(url, {"status": "ignored", "owner": viewer.pk, "note": "mine now"})

    assert page.status_code == 200
    assert "Read timed out after &lt;NUM&gt;ms" in page.content.decode()
    assert 'name="status"' not in page.content.decode() and 'name="owner"' not in page.content.decode()
    assert sent.status_code == 403
    pattern.refresh_from_db()
    assert (pattern.status, pattern.owner_id, pattern.note) == ("open", None, "")
    assert not AuditEntry.objects.filter(target=f"pattern #{pattern.pk}").exists()


def test_counters_and_pattern_history_are_read_only(admin_client: Client, letters: dict[str, DeadLetter]) -> None:
    counts = admin_client.get(reverse("admin:deadletters_deadlettercount_changelist"))
    events = admin_client.get(reverse("admin:deadletters_patternevent_changelist"))

    assert counts.status_code == 200 and "orders.dlq" in counts.content.decode()
    assert events.status_code == 200
    assert admin_client.get(reverse("admin:deadletters_deadlettercount_add")).status_code == 403
    assert admin_client.get(reverse("admin:deadletters_patternevent_add")).status_code == 403


def test_watched_queue_thresholds_are_edited_in_the_admin_with_an_audit_row(admin_client: Client) -> None:
    watched = WatchedQueue.objects.create(
        name="orders", dead_letter_queue="orders.dlq", dead_letter_exchange="orders.dlx"
    )
    url = reverse("admin:ingest_watchedqueue_change", args=[watched.pk])
    form = {"warning_depth": 10, "critical_depth": 100, "emergency_depth": 1000, "enabled": "on"}

    response = admin_client.post(url, form)
    refused = admin_client.post(url, {**form, "critical_depth": 5})

    assert response.status_code == 302
    watched.refresh_from_db()
    assert (watched.warning_depth, watched.critical_depth, watched.emergency_depth) == (10, 100, 1000)
    assert watched.dead_letter_queue == "orders.dlq"
    assert AuditEntry.objects.filter(action="watched_queue.change", target="orders").count() == 1
    assert not AuditEntry.objects.filter(action__startswith="admin.").exists()
    assert refused.status_code == 200
    assert "Thresholds must rise" in refused.content.decode()


def test_only_admins_edit_watched_queues(staff_client: Client) -> None:
    watched = WatchedQueue.objects.create(
        name="orders", dead_letter_queue="orders.dlq", dead_letter_exchange="orders.dlx"
    )
    url = reverse("admin:ingest_watchedqueue_change", args=[watched.pk])

    response = staff_client.post(url, {"warning_depth": 1, "critical_depth": 2, "emergency_depth": 3})

    assert staff_client.get(url).status_code == 200
    assert response.status_code == 403
    watched.refresh_from_db()
    assert watched.warning_depth == 50


def test_a_merged_pattern_cannot_be_triaged_in_the_admin_and_no_success_is_claimed(
    admin_client: Client, letters: dict[str, DeadLetter]
) -> None:
    from dlqconsole.deadletters.services import merge_patterns

    source = letters["timeout"].pattern
    target = next(letter.pattern for letter in letters.values() if letter.pattern_id != source.pk)
    merge_patterns(sources=[source], target=target, actor=None)

    response = admin_client.post(
        reverse("admin:deadletters_failurepattern_change", args=[source.pk]), {"status": "ignored", "note": "x"}
    )

    html = response.content.decode()
    assert response.status_code == 200
    assert f"was merged into #{target.pk}; triage that one." in html and "changed successfully" not in html
    source.refresh_from_db()
    assert (source.status, source.note) == ("open", "")
