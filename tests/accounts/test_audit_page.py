"""The audit log page: every signed-in role reads it, filters narrow it, pages follow the ids, targets link to
their console pages, and hostile text is shown as text."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.accounts.services import record_audit
from dlqconsole.accounts.views import PAGE_SIZE
from tests.conftest import client_for

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]


def test_signed_out_visitors_are_sent_to_login(client: Client) -> None:
    response = client.get("/audit/")

    assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_viewer_reads_who_did_what_with_which_filter_and_links_to_targets(viewer: User, operator: User) -> None:
    record_audit(
        actor=operator,
        action="operation.retry.plan",
        target="operation:12",
        filter={"queue": ["orders.dlq"], "reason": "TIMEOUT"},
        count=2000,
    )
    record_audit(actor=operator, action="pattern.merge", target="pattern #7", count=5, detail="merged #3 into #7")
    record_audit(actor=None, action="channel.disable", target="channel:4", detail="<script>alert(1)</script>")

    response = client_for(viewer).get("/audit/")

    html = response.content.decode()
    assert response.status_code == 200
    assert 'href="/operations/12/"' in html and 'href="/patterns/7/"' in html
    assert "queue=orders.dlq; reason=TIMEOUT" in html and "2000" in html
    assert "merged #3 into #7" in html and operator.username in html and "system" in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "<script>alert(1)" not in html
    assert re.search(r"channel:4\s*</div>", html)  # no console page: shown, not linked


def test_filters_by_person_action_target_and_time(viewer: User, operator: User, admin_user: User) -> None:
    record_audit(actor=operator, action="operation.retry.plan", target="operation:1", detail="d-retry")
    record_audit(actor=admin_user, action="operation.purge.plan", target="operation:2", detail="d-purge")
    record_audit(actor=operator, action="pattern.status", target="pattern #3", detail="d-status")
    old = record_audit(actor=operator, action="pattern.assign", target="pattern #3", detail="d-ancient")
    AuditEntry.objects.filter(pk=old.pk).update(created_at=timezone.now() - dt.timedelta(days=30))
    client = client_for(viewer)

    def shown(**query: str) -> set[str]:
        html = client.get("/audit/", query).content.decode()
        return {name for name in ("retry", "purge", "status", "ancient") if f"d-{name}" in html}

    assert shown(actor=operator.username) == {"retry", "status", "ancient"}
    assert shown(action="operation.") == {"retry", "purge"}
    assert shown(action="purge") == shown(action="PURGE") == {"purge"}  # anywhere in the action, in any case
    assert shown(target="pattern:3") == {"status", "ancient"}
    assert shown(target="pattern 3", since=(timezone.now() - dt.timedelta(days=1)).date().isoformat()) == {"status"}
    assert shown(action="pattern.", since="1h") == {"status"}  # an age, as on the messages page
    bad = client.get("/audit/", {"since": "last tuesday", "until": "99999999w"}).content.decode()
    assert "since must be an ISO date/time or an age" in bad
    assert "until: &#x27;99999999w&#x27; reaches back before the year 1; try a shorter age" in bad


def test_pages_follow_the_ids_and_the_fragment_is_the_table_alone(viewer: User) -> None:
    for n in range(PAGE_SIZE + 5):
        record_audit(actor=None, action="export", target=f"export:{n}", detail=f"entry-{n:03d}")
    client = client_for(viewer)

    first = client.get("/audit/").content.decode()
    older_query = first.split('hx-get="?', 1)[1].split('"', 1)[0].replace("&amp;", "&")
    second = client.get(f"/audit/?{older_query}", headers={"HX-Request": "true"}).content.decode()

    assert f"entry-{PAGE_SIZE + 4:03d}" in first and "entry-004" not in first
    assert second.strip().startswith('<section id="audit"')
    assert "entry-004" in second and "entry-000" in second and f"entry-{PAGE_SIZE + 4:03d}" not in second
    assert "Older" not in second


def test_a_page_mark_in_other_digits_is_ignored_not_a_server_error(viewer: User) -> None:
    record_audit(actor=None, action="export", target="export:1", detail="the-entry")

    response = client_for(viewer).get("/audit/", {"before": "²"})

    assert response.status_code == 200 and "the-entry" in response.content.decode()


def test_an_impossible_date_is_reported_and_no_entry_is_shown_as_its_answer(viewer: User) -> None:
    record_audit(actor=None, action="export", target="export:1", detail="the-entry")

    response = client_for(viewer).get("/audit/", {"before": "abc", "since": "2026-13-45", "until": "2026-02-30T10:00"})

    html = response.content.decode()
    assert response.status_code == 200
    assert "since must be an ISO date/time or an age" in html and "until must be an ISO date/time or an age" in html
    assert "the-entry" not in html


@pytest.mark.parametrize("name", ["actor", "action", "target"])
def test_a_nul_character_in_a_filter_matches_nothing_instead_of_failing(viewer: User, name: str) -> None:
    # PostgreSQL text cannot hold a NUL, and a query that compares with one fails.
    record_audit(actor=None, action="export", target="export:1", detail="the-entry")

    response = client_for(viewer).get("/audit/", {name: "export\x00"})

    html = response.content.decode()
    assert response.status_code == 200
    assert "NUL character" in html and "the-entry" not in html


def test_message_and_pattern_pages_link_to_their_audit_entries(viewer: User) -> None:
    from tests.factories import many

    (letter,) = many(1)
    client = client_for(viewer)

    message_page = client.get(f"/messages/{letter.pk}/").content.decode()
    pattern_page = client.get(f"/patterns/{letter.pattern_id}/").content.decode()

    assert f'href="/audit/?target=deadletter:{letter.pk}"' in message_page
    assert f'href="/audit/?target=pattern:{letter.pattern_id}"' in pattern_page


def test_a_patterns_audit_link_also_shows_every_row_of_the_operations_whose_filter_named_it(
    viewer: User, operator: User
) -> None:
    from dlqconsole.operations.planning import plan_operation
    from tests.factories import many

    mine = many(1, error="Request timed out after 3000ms")[0].pattern_id
    other = many(1, error="Connection refused by inventory", error_type="ConnectionError")[0].pattern_id
    alone = plan_operation(kind="archive", filter={"pattern": [mine]}, actor=operator)
    among_others = plan_operation(kind="archive", filter={"pattern": [other, mine]}, actor=operator)
    elsewhere = plan_operation(kind="archive", filter={"pattern": [other]}, actor=operator)
    # A row of the operation that does not repeat its filter (the runner's pause), and an operation on a pattern
    # whose id starts with the same digits.
    record_audit(actor=None, action="operation.pause", target=f"operation:{alone.pk}", detail="paused-alone")
    record_audit(
        actor=None, action="operation.archive.plan", target="operation:999999", filter={"pattern": [mine * 10]}
    )
    record_audit(actor=operator, action="pattern.status", target=f"pattern #{mine}", detail="triaged-mine")
    record_audit(actor=operator, action="pattern.status", target=f"pattern #{other}", detail="triaged-other")

    html = client_for(viewer).get("/audit/", {"target": f"pattern:{mine}"}).content.decode()

    linked = {pk for pk in (alone.pk, among_others.pk, elsewhere.pk, 999999) if f'href="/operations/{pk}/"' in html}
    assert linked == {alone.pk, among_others.pk}
    assert "paused-alone" in html and "triaged-mine" in html and "triaged-other" not in html
