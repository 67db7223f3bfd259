"""The alerts list's "current" section: what still fires comes first, and it narrows to a rule or a severity (a
bookmarkable address that the self-refresh and the bulk actions keep), so the noisy ones can be acknowledged
together."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from dlqconsole.alerts.models import Alert, AlertRule, AlertStatus
from tests.factories import rule

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]

HTMX = {"HX-Request": "true"}


def make_alert(alert_rule: AlertRule, subject: str, *, minutes_ago: int, status: str = AlertStatus.FIRING) -> Alert:
    fired = timezone.now() - dt.timedelta(minutes=minutes_ago)
    return Alert.objects.create(
        rule=alert_rule,
        subject=f"queue:{subject}",
        subject_label=subject,
        severity=alert_rule.severity,
        status=status,
        summary=f"{subject} has dead letters",
        started_at=fired,
        fired_at=fired,
    )


def row_ids(html: str) -> list[int]:
    return [int(pk) for pk in re.findall(r'<tr id="alert-(\d+)"', html)]


@pytest.fixture
def noisy() -> AlertRule:
    return rule("dlq_not_empty", severity="warning")


@pytest.fixture
def quiet() -> AlertRule:
    return rule("dlq_growth", severity="critical")


def test_firing_alerts_come_before_acknowledged_ones_newest_first(
    client: Client, viewer: User, noisy: AlertRule
) -> None:
    # Acknowledged alerts sorted before firing ones alphabetically: after acknowledging most of an incident, the
    # few still firing sat at the bottom of the list.
    old_acknowledged = make_alert(noisy, "a.dlq", minutes_ago=1, status=AlertStatus.ACKNOWLEDGED)
    old_firing = make_alert(noisy, "b.dlq", minutes_ago=30)
    new_acknowledged = make_alert(noisy, "c.dlq", minutes_ago=0, status=AlertStatus.ACKNOWLEDGED)
    new_firing = make_alert(noisy, "d.dlq", minutes_ago=5)
    client.force_login(viewer)

    for response in (client.get(reverse("alerts:list")), client.get(reverse("alerts:list"), headers=HTMX)):
        assert row_ids(response.content.decode()) == [
            new_firing.pk,
            old_firing.pk,
            new_acknowledged.pk,
            old_acknowledged.pk,
        ]


def test_current_list_narrows_to_a_rule_and_keeps_the_filter_when_it_refreshes(
    client: Client, operator: User, noisy: AlertRule, quiet: AlertRule
) -> None:
    mine = [make_alert(noisy, f"q{index}.dlq", minutes_ago=index) for index in range(3)]
    other = make_alert(quiet, "payments.dlq", minutes_ago=1)
    client.force_login(operator)

    page = client.get(reverse("alerts:list"), {"rule": noisy.pk}).content.decode()
    fragment = client.get(reverse("alerts:list"), {"rule": noisy.pk}, headers=HTMX).content.decode()

    assert row_ids(page) == row_ids(fragment) == [alert.pk for alert in mine]
    assert other.pk not in row_ids(page)
    # The filter form shows the choice and sends itself on change (static/js/forms.js).
    assert re.search(r"<form[^>]*data-autosubmit", page)
    assert f'<option value="{noisy.pk}" selected>{noisy.name}</option>' in page
    # The 5 s refresh asks for the same filtered list; the bulk form posts to an address carrying the filter.
    query = f"?rule={noisy.pk}"
    assert f'hx-get="{reverse("alerts:list")}{query}" hx-trigger="click, every 5s"' in fragment
    assert f'action="{reverse("alerts:bulk")}{query}"' in fragment
    assert "all 3 firing shown" in fragment
    assert sorted(int(pk) for pk in re.findall(r'name="shown" value="(\d+)"', fragment)) == [a.pk for a in mine]


def test_current_list_narrows_to_a_severity(client: Client, viewer: User, noisy: AlertRule, quiet: AlertRule) -> None:
    make_alert(noisy, "orders.dlq", minutes_ago=1)
    critical = make_alert(quiet, "payments.dlq", minutes_ago=2)
    client.force_login(viewer)

    body = client.get(reverse("alerts:list"), {"severity": "critical"}, headers=HTMX).content.decode()

    assert row_ids(body) == [critical.pk]


def test_a_filter_that_matches_nothing_says_so(client: Client, viewer: User, noisy: AlertRule) -> None:
    make_alert(noisy, "orders.dlq", minutes_ago=1)
    client.force_login(viewer)

    body = client.get(reverse("alerts:list"), {"severity": "emergency"}).content.decode()

    assert row_ids(body) == []
    assert "Nothing is firing that matches this filter" in body


def test_unknown_filter_values_are_ignored(client: Client, viewer: User, noisy: AlertRule) -> None:
    alert = make_alert(noisy, "orders.dlq", minutes_ago=1)
    client.force_login(viewer)

    response = client.get(reverse("alerts:list"), {"rule": "²", "severity": "<b>loud</b>"})

    assert response.status_code == 200
    assert row_ids(response.content.decode()) == [alert.pk]
    assert "<b>loud</b>" not in response.content.decode()


def test_acknowledging_all_shown_under_a_rule_filter_leaves_other_rules_firing(
    client: Client, operator: User, noisy: AlertRule, quiet: AlertRule
) -> None:
    mine = [make_alert(noisy, f"q{index}.dlq", minutes_ago=index) for index in range(3)]
    other = make_alert(quiet, "payments.dlq", minutes_ago=1)
    client.force_login(operator)
    page = client.get(reverse("alerts:list"), {"rule": noisy.pk}).content.decode()
    shown = re.findall(r'name="shown" value="(\d+)"', page)
    action = re.search(r'<form id="alert-bulk"[^>]* action="([^"]+)"', page)
    assert action is not None

    response = client.post(
        action.group(1).replace("&amp;", "&"),
        {"action": "acknowledge", "scope": "firing", "shown": shown},
        headers=HTMX,
    )

    body = response.content.decode()
    assert "Acknowledged 3 alerts." in body
    assert {Alert.objects.get(pk=alert.pk).status for alert in mine} == {AlertStatus.ACKNOWLEDGED}
    assert Alert.objects.get(pk=other.pk).status == AlertStatus.FIRING
    # The section that comes back is still the filtered one.
    assert row_ids(body) == [alert.pk for alert in mine] and other.pk not in row_ids(body)


def test_bulk_without_javascript_returns_to_the_filtered_list(client: Client, operator: User, noisy: AlertRule) -> None:
    alert = make_alert(noisy, "orders.dlq", minutes_ago=1)
    client.force_login(operator)

    response = client.post(
        f"{reverse('alerts:bulk')}?rule={noisy.pk}",
        {"action": "acknowledge", "scope": "selected", "ids": [str(alert.pk)]},
    )

    assert response.status_code == 302 and response["Location"] == f"{reverse('alerts:list')}?rule={noisy.pk}"


def test_acknowledging_one_row_without_javascript_returns_to_the_filtered_list(
    client: Client, operator: User, noisy: AlertRule
) -> None:
    alert = make_alert(noisy, "orders.dlq", minutes_ago=1)
    client.force_login(operator)
    page = client.get(reverse("alerts:list"), {"rule": noisy.pk}).content.decode()
    back = re.search(r'name="next" value="([^"]+)"', page)
    assert back is not None and back.group(1) == f"{reverse('alerts:list')}?rule={noisy.pk}"

    response = client.post(reverse("alerts:acknowledge", args=[alert.pk]), {"next": back.group(1)})

    assert response.status_code == 302 and response["Location"] == back.group(1)


def test_current_list_counts_alerts_by_rule_with_a_link_to_each(
    client: Client, viewer: User, noisy: AlertRule, quiet: AlertRule
) -> None:
    for index in range(4):
        make_alert(noisy, f"q{index}.dlq", minutes_ago=index)
    make_alert(noisy, "acked.dlq", minutes_ago=1, status=AlertStatus.ACKNOWLEDGED)
    make_alert(quiet, "payments.dlq", minutes_ago=1)
    client.force_login(viewer)

    for response in (client.get(reverse("alerts:list")), client.get(reverse("alerts:list"), headers=HTMX)):
        text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", response.content.decode()))
        # Most firing first, each a link that narrows the list to its rule.
        assert f"By rule: {noisy.name} 4 firing, 1 acknowledged · {quiet.name} 1 firing" in text
        assert f'href="{reverse("alerts:list")}?rule={noisy.pk}"' in response.content.decode()
    # Narrowed to one rule, the breakdown has nothing to add.
    narrowed = client.get(reverse("alerts:list"), {"rule": noisy.pk}).content.decode()
    assert "By rule:" not in narrowed
