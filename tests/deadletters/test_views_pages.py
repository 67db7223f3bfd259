"""The browse pages: dashboard, patterns, messages and one message, each as a full page and as its htmx fragment."""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django.utils.html import escape

from dlqconsole import dashboard
from dlqconsole.deadletters import selectors
from dlqconsole.deadletters.counters import add_counts
from dlqconsole.deadletters.filters import DeadLetterFilter
from dlqconsole.deadletters.models import DeadLetter, DeadLetterCount, DeadLetterStatus, FailurePattern
from dlqconsole.deadletters.views import messages as message_views
from dlqconsole.ingest.models import QueueSample, WatchedQueue
from tests.alerts.conftest import settle
from tests.factories import EnvelopeFactory, many, store

pytestmark = [pytest.mark.django_db]

HX = {"HX-Request": "true"}


@pytest.fixture
def viewer_client(viewer: User) -> Client:
    client = Client()
    client.force_login(viewer)
    return client


def test_pages_need_a_login(client: Client) -> None:
    for url in ("/", "/patterns/", "/messages/", "/operations/"):
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith("/login/")


@pytest.mark.sqlite
def test_dashboard_shows_parked_per_queue_from_the_counters(viewer_client: Client) -> None:
    many(3, queue="orders")
    declined = many(2, queue="billing", error="card declined for customer 7", error_type="CardError")
    # The page reads the counters, not COUNT(*): a counter changed behind its back shows through.
    DeadLetterCount.objects.filter(source_queue="billing.dlq").update(count=777)

    page = viewer_client.get("/")

    assert page.status_code == 200
    html = page.content.decode()
    assert "<html" in html and 'id="panels"' in html
    assert "orders.dlq" in html and "billing.dlq" in html
    assert ">777<" in html
    assert ">780<" in html  # total parked: 3 + 777
    assert escape(FailurePattern.objects.get(pk=declined[0].pattern_id).template) in html


@pytest.mark.sqlite
def test_queue_summaries_give_the_oldest_and_newest_parked_arrival() -> None:
    now = timezone.now()
    first = store(EnvelopeFactory.build(queue="orders"), now=now - dt.timedelta(hours=5))
    store(EnvelopeFactory.build(queue="orders"), now=now - dt.timedelta(hours=1))
    store(EnvelopeFactory.build(queue="billing"), now=now - dt.timedelta(minutes=3))
    DeadLetter.objects.filter(pk=first[0].pk).update(status=DeadLetterStatus.REPLAYED)
    cell = (first[0].broker_id or 0, "orders.dlq", first[0].pattern_id, first[0].failure_reason)
    add_counts([(*cell, str(DeadLetterStatus.PARKED), -1), (*cell, str(DeadLetterStatus.REPLAYED), 1)])
    store(EnvelopeFactory.build(queue="orders"), now=now - dt.timedelta(minutes=1))

    found = {summary.queue: summary for summary in selectors.queue_summaries()}

    assert (found["orders.dlq"].parked, found["billing.dlq"].parked) == (2, 1)
    assert found["orders.dlq"].oldest_at == now - dt.timedelta(hours=1)
    assert found["orders.dlq"].newest_at == now - dt.timedelta(minutes=1)
    assert found["billing.dlq"].oldest_at == found["billing.dlq"].newest_at == now - dt.timedelta(minutes=3)


@pytest.mark.sqlite
def test_dashboard_fragment_is_only_the_panels(viewer_client: Client) -> None:
    many(2)

    fragment = viewer_client.get("/", headers=HX)

    html = fragment.content.decode()
    assert fragment.status_code == 200
    assert "<html" not in html and "<nav" not in html
    assert html.strip().startswith('<div id="panels">')
    assert 'hx-trigger="click, every 10s"' in html
    assert "HX-Request" in fragment["Vary"]


@pytest.mark.sqlite
def test_arrivals_counts_each_bucket_of_the_window() -> None:
    now = timezone.now()
    # In arrival order, as ingest writes them (ids rise with arrival time).
    store(EnvelopeFactory.build(), now=now - dt.timedelta(days=3))
    store(EnvelopeFactory.build(), now=now - dt.timedelta(hours=3))
    store(EnvelopeFactory.build(), now=now - dt.timedelta(minutes=22))
    store(EnvelopeFactory.build(), EnvelopeFactory.build(), now=now - dt.timedelta(minutes=1))

    hour = selectors.arrivals(now=now, width=dt.timedelta(minutes=5), buckets=12)
    day = selectors.arrivals(now=now, width=dt.timedelta(hours=1), buckets=24)

    assert len(hour) == 12 and len(day) == 24
    assert hour[-1][1] + hour[-2][1] == 2  # the last minute may straddle a bucket boundary
    assert sum(count for _, count in hour) == 3
    assert sum(count for _, count in day) == 4
    assert all(start.minute % 5 == 0 and start.second == 0 for start, _ in hour)


@pytest.mark.sqlite
def test_arrivals_count_every_status_and_leave_quiet_hours_empty() -> None:
    now = timezone.now().replace(minute=30, second=0, microsecond=0)
    early = store(
        EnvelopeFactory.build(), EnvelopeFactory.build(), EnvelopeFactory.build(), now=now - dt.timedelta(hours=5)
    )
    store(EnvelopeFactory.build(), now=now - dt.timedelta(hours=2))
    # The first arrival of an hour may be archived or replayed by now: it still arrived then.
    DeadLetter.objects.filter(pk=early[0].pk).update(status=DeadLetterStatus.ARCHIVED)
    DeadLetter.objects.filter(pk=early[1].pk).update(status=DeadLetterStatus.REPLAYED)

    day = selectors.arrivals(now=now, width=dt.timedelta(hours=1), buckets=24)

    assert [count for _, count in day][-6:] == [3, 0, 0, 1, 0, 0]
    assert sum(count for _, count in day) == 4


@pytest.mark.sqlite
def test_pattern_trends_count_arrivals_per_pattern() -> None:
    now = timezone.now()
    timeouts = store(EnvelopeFactory.build(), EnvelopeFactory.build(), now=now - dt.timedelta(hours=2))
    declines = store(
        EnvelopeFactory.build(error="card declined", error_type="CardError"), now=now - dt.timedelta(minutes=5)
    )

    trends = selectors.pattern_trends(
        pattern_ids=[timeouts[0].pattern_id, declines[0].pattern_id], now=now, width=dt.timedelta(hours=1), buckets=24
    )

    assert sum(trends[timeouts[0].pattern_id]) == 2
    assert trends[timeouts[0].pattern_id][-3] == 2 or trends[timeouts[0].pattern_id][-2] == 2
    assert trends[declines[0].pattern_id][-1] + trends[declines[0].pattern_id][-2] == 1


@pytest.mark.sqlite
def test_dashboard_shows_backpressure_levels_from_the_latest_sample(viewer_client: Client) -> None:
    WatchedQueue.objects.create(name="orders", dead_letter_queue="orders.dlq", dead_letter_exchange="orders.dlx")
    WatchedQueue.objects.create(
        name="emails", dead_letter_queue="emails.dlq", dead_letter_exchange="emails.dlx", warning_depth=5
    )
    QueueSample.objects.create(queue="orders", messages=10, consumers=4, sampled_at=timezone.now() - dt.timedelta(1))
    QueueSample.objects.create(queue="orders", messages=250, consumers=0)
    QueueSample.objects.create(queue="emails", messages=7, consumers=2)

    levels = {item.queue: (item.depth, item.level) for item in dashboard.backpressure()}
    html = viewer_client.get("/").content.decode()

    assert levels == {"orders": (250, "critical"), "emails": (7, "warning")}
    assert "lvl-critical" in html and "lvl-warning" in html


@pytest.mark.sqlite
def test_patterns_page_lists_counts_and_filters_by_reason(viewer_client: Client) -> None:
    many(3)
    many(2, error="invalid field 'email'", error_type="ValidationError")

    page = viewer_client.get("/patterns/")
    filtered = viewer_client.get("/patterns/?reason=VALIDATION_FAILED", headers=HX)

    html = page.content.decode()
    assert page.status_code == 200
    assert "Request timed out after" in html
    assert "invalid field" in html
    fragment = filtered.content.decode()
    assert "<html" not in fragment and 'id="patterns"' in fragment
    assert "invalid field" in fragment and "Request timed out" not in fragment


@pytest.mark.sqlite
def test_patterns_first_seen_within_the_hour_are_marked_new(viewer_client: Client) -> None:
    fresh = many(1, error="card declined", error_type="CardError")[0]
    old = many(1, error="disk full")[0]
    FailurePattern.objects.filter(pk=old.pattern_id).update(first_seen_at=timezone.now() - dt.timedelta(hours=2))

    html = viewer_client.get("/patterns/").content.decode()

    row = {
        pk: html[html.index(f'id="pattern-{pk}"') :].split("</tr>", 1)[0] for pk in (fresh.pattern_id, old.pattern_id)
    }
    assert ">new</span>" in row[fresh.pattern_id] and ">new</span>" not in row[old.pattern_id]


def test_patterns_page_sorts_by_waiting_and_hides_triage_controls_from_viewers(viewer_client: Client) -> None:
    many(1, error="rare failure", error_type="RareError")
    many(4)

    html = viewer_client.get("/patterns/?sort=waiting").content.decode()

    assert html.index("Request timed out") < html.index("rare failure")
    assert "/status/" not in html and "/patterns/merge/" not in html and "/operations/plan/" not in html


def test_a_patterns_waiting_count_links_to_exactly_the_dead_letters_it_counts(viewer_client: Client) -> None:
    letters = many(3)
    settle_one = letters[0]
    settle([settle_one], status=DeadLetterStatus.REPLAYED)

    html = viewer_client.get("/patterns/").content.decode()
    link = re.search(rf'href="(/messages/\?pattern={settle_one.pattern_id}&amp;[^"]+)"[^>]*>2</a>', html)
    assert link is not None, "the Waiting count (2) links to the messages page"
    listed = viewer_client.get(link.group(1).replace("&amp;", "&")).content.decode()

    assert f'href="/messages/{letters[1].pk}/"' in listed and f'href="/messages/{letters[2].pk}/"' in listed
    assert f'href="/messages/{settle_one.pk}/"' not in listed


def test_dashboard_running_operations_count_only_what_was_done_as_done(viewer_client: Client, operator: User) -> None:
    from dlqconsole.operations.models import Operation, OperationStatus
    from dlqconsole.operations.planning import plan_operation

    many(10)
    operation = plan_operation(kind="retry", filter={}, actor=operator)
    Operation.objects.filter(pk=operation.pk).update(status=OperationStatus.RUNNING, succeeded=3, failed=1, skipped=2)

    html = viewer_client.get("/").content.decode()
    row = html[html.index(f"Retry #{operation.pk}") :].split("</tr>", 1)[0]

    assert "3 / 10 replayed" in row and "1 failed, 2 skipped" in row
    assert 'aria-valuenow="30"' in row
    assert 'class="skipped" style="left: 40.0%; width: 20.0%"' in row


def test_patterns_page_far_past_the_last_is_empty_not_an_error(viewer_client: Client) -> None:
    many(2)

    far = viewer_client.get("/patterns/?page=99999999999999999999")
    first = viewer_client.get("/patterns/?page=1")

    assert far.status_code == 200 and "Request timed out" not in far.content.decode()
    assert "Request timed out" in first.content.decode()


@pytest.mark.sqlite
def test_patterns_page_shows_triage_controls_to_operators(operator: User) -> None:
    many(1)
    client = Client()
    client.force_login(operator)

    html = client.get("/patterns/").content.decode()

    assert "/status/" in html and "/patterns/merge/" in html and "kind=retry" in html
    assert "kind=purge" not in html


@pytest.mark.sqlite
def test_pattern_page_shows_counts_history_and_a_fragment(viewer_client: Client) -> None:
    letters = many(3)
    pattern = FailurePattern.objects.get(pk=letters[0].pattern_id)

    page = viewer_client.get(f"/patterns/{pattern.pk}/")
    fragment = viewer_client.get(f"/patterns/{pattern.pk}/", headers=HX)

    assert page.status_code == 200
    html = page.content.decode()
    assert escape(pattern.template) in html and "orders.dlq" in html
    assert fragment.content.decode().strip().startswith('<section id="pattern-summary"')


def test_messages_page_walks_pages_by_keyset_without_offset(viewer_client: Client) -> None:
    letters = many(120)
    ids = sorted((row.pk for row in letters), reverse=True)

    with CaptureQueriesContext(connection) as queries:
        first = viewer_client.get("/messages/")
    second = viewer_client.get(f"/messages/?before={ids[49]}", headers=HX)
    third = viewer_client.get(f"/messages/?before={ids[99]}", headers=HX)
    back = viewer_client.get(f"/messages/?after={ids[100]}", headers=HX)

    assert not any("OFFSET" in query["sql"].upper() for query in queries.captured_queries)
    assert f"#{ids[0]}<" in first.content.decode() and f"#{ids[49]}<" in first.content.decode()
    assert f"#{ids[50]}<" not in first.content.decode()
    assert f"before={ids[49]}" in first.content.decode()
    assert f"#{ids[50]}<" in second.content.decode() and f"#{ids[99]}<" in second.content.decode()
    assert f"#{ids[100]}<" in third.content.decode() and f"#{ids[119]}<" in third.content.decode()
    assert "Older" not in third.content.decode()
    assert f"#{ids[99]}<" in back.content.decode() and f"#{ids[50]}<" in back.content.decode()
    assert f"#{ids[100]}<" not in back.content.decode()


@pytest.mark.sqlite
def test_messages_page_filters_by_each_field(viewer_client: Client) -> None:
    store(EnvelopeFactory.build(queue="orders", priority=9, host="web-7", version="2.0.0", body=b'{"sku": "ABC-123"}'))
    store(
        EnvelopeFactory.build(queue="billing", error="card declined", error_type="CardError", priority=1, host="web-1")
    )

    def shown(query: str) -> set[str]:
        html = viewer_client.get(f"/messages/?{query}", headers=HX).content.decode()
        return {queue for queue in ("orders.dlq", "billing.dlq") if f">{queue}<" in html}

    assert shown("") == {"orders.dlq", "billing.dlq"}
    assert shown("queue=billing.dlq") == {"billing.dlq"}
    assert shown("reason=TIMEOUT") == {"orders.dlq"}
    assert shown("priority=5-9") == {"orders.dlq"}
    assert shown("host=web-1") == {"billing.dlq"}
    assert shown("version=2.0.0") == {"orders.dlq"}
    assert shown("text=declined") == {"billing.dlq"}
    assert shown("error_type=CardError") == {"billing.dlq"}
    assert shown("payload=ABC-123") == {"orders.dlq"}
    assert shown("payload=nothing-like-this") == set()
    assert shown("status=archived") == set()
    assert shown("since=1h") == {"orders.dlq", "billing.dlq"}
    assert shown("since=1h30m") == {"orders.dlq", "billing.dlq"}
    assert shown("until=1h") == set()
    assert shown("until=2 days") == set()


def test_messages_page_skips_the_scan_when_the_counters_say_nothing_matches(viewer_client: Client) -> None:
    many(3, queue="orders")
    many(2, queue="billing", error="card declined", error_type="CardError")

    with CaptureQueriesContext(connection) as queries:
        none = viewer_client.get("/messages/?queue=billing.dlq&reason=TIMEOUT", headers=HX)
    reason = DeadLetter.objects.filter(source_queue="billing.dlq").values_list("failure_reason", flat=True)[0]
    some = viewer_client.get(f"/messages/?queue=billing.dlq&reason={reason}", headers=HX)

    assert "No dead letter matches." in none.content.decode()
    assert not any('FROM "deadletters_deadletter"' in query["sql"] for query in queries.captured_queries)
    assert selectors.counted_matches(DeadLetterFilter.from_dict({"queue": "billing.dlq"})) == 2
    assert selectors.counted_matches(DeadLetterFilter.from_dict({"text": "declined"})) is None
    assert selectors.counted_matches(DeadLetterFilter.from_dict({"queue": "orders"})) is None
    assert some.content.decode().count(">billing.dlq<") == 2


@pytest.mark.sqlite
def test_messages_page_reports_a_bad_filter_instead_of_failing(viewer_client: Client) -> None:
    many(1)

    response = viewer_client.get("/messages/?priority=high&since=yesterday-ish")

    assert response.status_code == 200
    assert "priority must be a number" in response.content.decode()
    assert "No dead letter matches." in response.content.decode()


def test_a_bad_filter_value_leaves_the_form_as_typed(viewer_client: Client) -> None:
    many(1)

    html = viewer_client.get("/messages/?since=garbage&text=declined&queue=orders.dlq&pattern=abc").content.decode()

    assert "since must be an ISO date/time or an age" in html or "pattern and ids must be whole numbers" in html
    # Pressing Filter again sends back what was typed, the good values with the bad one to correct.
    for name, value in (("since", "garbage"), ("text", "declined"), ("queue", "orders.dlq"), ("pattern", "abc")):
        assert re.search(rf'name="{name}"[^>]* value="{value}"', html), name


@pytest.mark.parametrize(
    "query", ["/messages/?queue=%00", "/messages/?error_type=a%00b", "/messages/?text=%00", "/patterns/?q=%00"]
)
def test_a_nul_character_in_a_filter_matches_nothing_instead_of_failing(viewer_client: Client, query: str) -> None:
    many(1)

    response = viewer_client.get(query)

    html = response.content.decode()
    assert response.status_code == 200
    assert "cannot hold a NUL character" in html or "No pattern matches." in html


@pytest.mark.sqlite
@pytest.mark.parametrize("moment", ["2026-13-45", "2026-02-30T10:00", "9999-12-31T23:59:59-23:00"])
def test_messages_page_reports_an_impossible_date_instead_of_failing(viewer_client: Client, moment: str) -> None:
    # Well formed but no such day (parse_date raises), or past the last day once in UTC.
    many(1)

    response = viewer_client.get("/messages/", {"since": moment})

    assert response.status_code == 200
    assert "since must be an ISO date/time or an age" in response.content.decode()


@pytest.mark.sqlite
def test_messages_page_keeps_the_filter_in_bookmarkable_links(viewer_client: Client) -> None:
    many(60, queue="orders")

    html = viewer_client.get("/messages/?queue=orders.dlq&reason=TIMEOUT").content.decode()

    assert 'value="orders.dlq"' in html
    assert "queue=orders.dlq&amp;reason=TIMEOUT&amp;before=" in html
    assert "/messages/export/?format=csv&amp;queue=orders.dlq&amp;reason=TIMEOUT" in html


@pytest.mark.sqlite
def test_message_detail_shows_every_part(viewer_client: Client) -> None:
    (stored,) = store(
        EnvelopeFactory.build(
            body=json.dumps({"order": 42, "items": [1, 2]}).encode(), headers={"tenant": "acme", "retry": 3}
        )
    )

    page = viewer_client.get(f"/messages/{stored.pk}/")
    fragment = viewer_client.get(f"/messages/{stored.pk}/", headers=HX)

    html = page.content.decode()
    assert page.status_code == 200
    assert "&quot;order&quot;: 42," in html  # pretty-printed JSON, escaped
    assert "tenant" in html and "acme" in html
    assert 'rejected</strong> in <span class="mono">orders</span>' in html
    assert "msg-" in html and "orders.created" in html
    assert "Request timed out after 3000ms" in html
    assert fragment.content.decode().strip().startswith('<section id="history"')


@pytest.mark.sqlite
def test_message_detail_shows_binary_payload_as_hex(viewer_client: Client) -> None:
    (stored,) = store(EnvelopeFactory.build(body=bytes(range(256)), content_type="application/octet-stream"))

    html = viewer_client.get(f"/messages/{stored.pk}/").content.decode()

    assert "00000000  00 01 02 03" in html
    assert "hex" in html


@pytest.mark.sqlite
def test_message_detail_escapes_markup_in_payload_headers_and_error(viewer_client: Client) -> None:
    (stored,) = store(
        EnvelopeFactory.build(
            body=b"<script>alert('body')</script>",
            error="<script>alert('error')</script>",
            headers={"x-note": "<img src=x onerror=alert('header')>"},
            content_type="text/html",
        )
    )

    html = viewer_client.get(f"/messages/{stored.pk}/").content.decode()

    assert "<script>alert(" not in html
    assert "<img src=x" not in html
    assert "&lt;script&gt;alert(&#x27;body&#x27;)&lt;/script&gt;" in html
    assert "&lt;script&gt;alert(&#x27;error&#x27;)&lt;/script&gt;" in html
    assert "&lt;img src=x onerror=alert(&#x27;header&#x27;)&gt;" in html


@pytest.mark.sqlite
def test_message_detail_links_boomerangs_and_edits(viewer_client: Client) -> None:
    first, second, edited = many(3)
    DeadLetter.objects.filter(pk=second.pk).update(previous=first)
    DeadLetter.objects.filter(pk=edited.pk).update(edited_from=first)

    html = viewer_client.get(f"/messages/{first.pk}/").content.decode()
    later = viewer_client.get(f"/messages/{second.pk}/").content.decode()

    assert f'href="/messages/{second.pk}/"' in html and f'href="/messages/{edited.pk}/"' in html
    assert f'href="/messages/{first.pk}/"' in later and "Replayed from" in later


@pytest.mark.sqlite
def test_raw_body_downloads_as_an_attachment(viewer_client: Client) -> None:
    (stored,) = store(EnvelopeFactory.build(body=b"<b>raw</b>\x00\xff"))

    response = viewer_client.get(f"/messages/{stored.pk}/body/")

    assert response.content == b"<b>raw</b>\x00\xff"
    assert response["Content-Type"] == "application/octet-stream"
    assert response["Content-Disposition"].startswith("attachment;")


@pytest.mark.sqlite
def test_message_detail_of_a_missing_message_is_404(viewer_client: Client) -> None:
    assert viewer_client.get("/messages/987654321/").status_code == 404


@pytest.mark.sqlite
def test_archived_messages_are_hidden_until_asked_for(viewer_client: Client) -> None:
    (stored,) = many(1)
    DeadLetter.objects.filter(pk=stored.pk).update(status=DeadLetterStatus.ARCHIVED)

    default = viewer_client.get("/messages/", headers=HX).content.decode()
    archived = viewer_client.get("/messages/?status=archived", headers=HX).content.decode()

    assert f"#{stored.pk}<" not in default
    assert f"#{stored.pk}<" in archived


def test_a_search_that_runs_too_long_is_stopped_and_explained(
    viewer_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    many(1)

    def slow_page(*args: object, **kwargs: object) -> object:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_sleep(2)")
        raise AssertionError("the time limit did not stop the query")

    monkeypatch.setattr(message_views, "PAGE_QUERY_TIMEOUT_MS", 50)
    monkeypatch.setattr(message_views, "keyset_page", slow_page)

    response = viewer_client.get("/messages/?text=anything", headers=HX)

    assert response.status_code == 200
    assert "took longer than 0.05 s and was stopped" in response.content.decode()
    # The connection is usable afterwards, without the limit.
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_sleep(0.1), 1")
        assert cursor.fetchone()[1] == 1


def test_dashboard_shows_the_alerts_that_matter_most_and_counts_the_rest(viewer_client: Client) -> None:
    from dlqconsole.alerts.models import Alert, AlertRule

    rule = AlertRule.objects.create(name="A storm of new patterns", kind="new_pattern", severity="warning")
    for number in range(11):
        Alert.objects.create(
            rule=rule,
            subject=f"pattern:{number}",
            subject_label=f"pattern {number}",
            severity="warning",
            status="acknowledged" if number < 3 else "firing",
            summary=f"new pattern number-{number:02d}",
        )
    Alert.objects.create(
        rule=rule,
        subject="queue:x",
        subject_label="x",
        severity="critical",
        status="firing",
        summary="the critical one",
    )

    alerts, total = dashboard.firing_alerts()
    html = viewer_client.get("/").content.decode()

    assert total == 12 and len(alerts) == 8
    assert alerts[0].summary == "the critical one"
    assert all(alert.status == "firing" for alert in alerts)  # acknowledged ones after the others
    assert "12 active in all" in html and "the critical one" in html and "number-00" not in html


def test_dashboard_alerts_do_not_repeat_a_label_their_summary_already_says(viewer_client: Client) -> None:
    from dlqconsole.alerts.models import Alert, AlertRule

    rule = AlertRule.objects.create(name="New patterns", kind="new_pattern", severity="warning")
    Alert.objects.create(
        rule=rule,
        subject="pattern:1",
        subject_label="TimeoutError at orders/api.py:pay",
        severity="warning",
        status="firing",
        summary="New failure pattern “TimeoutError at orders/api.py:pay”: 1 dead letter parked.",
    )
    Alert.objects.create(
        rule=rule,
        subject="queue:orders.dlq",
        subject_label="orders.dlq",
        severity="warning",
        status="firing",
        summary="12 dead letters waiting.",
    )

    html = viewer_client.get("/").content.decode()

    assert html.count("TimeoutError at orders/api.py:pay") == 1
    assert "orders.dlq · since" in html


def test_a_rows_host_links_to_the_list_filtered_by_it(viewer_client: Client) -> None:
    many(1, queue="orders", host="web-1 &<x>")
    many(1, queue="orders", host="web-2")

    html = viewer_client.get("/messages/?queue=orders.dlq&before=999999").content.decode()
    filtered = viewer_client.get("/messages/?queue=orders.dlq&host=web-2").content.decode()

    assert 'href="?queue=orders.dlq&amp;host=web-1%20%26%3Cx%3E"' in html
    assert ">web-2</a>" in filtered and "web-1" not in filtered.split("<tbody>", 1)[1]


def test_messages_page_says_how_many_match_when_the_counters_know(viewer_client: Client) -> None:
    many(3, queue="orders")
    many(1, queue="billing")

    def count(query: str) -> str:
        html = viewer_client.get(f"/messages/?{query}").content.decode()
        return html[html.index('data-testid="match-count"') :].split("</span>", 1)[0]

    assert "4 dead letters match this filter" in count("")
    assert "1 dead letter matches this filter" in count("queue=billing.dlq")
    assert "match this filter" not in count("queue=orders.dlq&text=timed")  # only a scan could tell
