"""/api/v1/alerts/: the alerts narrowed as the alerts page narrows them, one alert, and acknowledging and silencing
through the page's services (same roles, same audit rows, which name the token)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.alerts.models import Alert, AlertRule, AlertStatus
from dlqconsole.brokers.models import Broker
from tests.factories import rule

pytestmark = pytest.mark.django_db

ApiFor = Callable[[User], APIClient]


def make_alert(alert_rule: AlertRule, subject: str, *, status: str = AlertStatus.FIRING, **fields: Any) -> Alert:
    now = timezone.now()
    return Alert.objects.create(
        rule=alert_rule,
        subject=subject,
        subject_label=subject.partition(":")[2],
        severity=fields.pop("severity", alert_rule.severity),
        status=status,
        summary=f"{subject} has dead letters",
        started_at=now,
        fired_at=None if status == AlertStatus.PENDING else now,
        resolved_at=now if status == AlertStatus.RESOLVED else None,
        **fields,
    )


def ids(answer: dict[str, Any]) -> list[int]:
    return [row["id"] for row in answer["results"]]


@pytest.fixture
def noisy() -> AlertRule:
    return rule("dlq_not_empty", severity="warning")


@pytest.fixture
def firing(noisy: AlertRule) -> Alert:
    return make_alert(noisy, "queue:orders.dlq")


def test_the_list_is_newest_first_with_every_state_and_reads_like_the_alert(
    api_for: ApiFor, viewer: User, operator: User, noisy: AlertRule
) -> None:
    older = make_alert(noisy, "queue:a.dlq", status=AlertStatus.RESOLVED)
    newer = make_alert(
        noisy, "queue:b.dlq", status=AlertStatus.ACKNOWLEDGED, acknowledged_by=operator, acknowledged_at=timezone.now()
    )

    response = api_for(viewer).get("/api/v1/alerts/")

    assert response.status_code == 200
    answer = response.json()
    assert ids(answer) == [newer.pk, older.pk]
    assert answer["next"] is None
    row = answer["results"][0]
    assert row["rule"] == {
        "id": noisy.pk,
        "name": noisy.name,
        "kind": "dlq_not_empty",
        "severity": "warning",
        "silenced_until": None,
    }
    assert (row["subject"], row["subject_label"], row["broker"]) == ("queue:b.dlq", "b.dlq", "default")
    assert (row["status"], row["acknowledged_by"], row["silence_ends"]) == ("acknowledged", operator.username, None)
    assert row["summary"] == "queue:b.dlq has dead letters"


def test_state_narrows_as_the_pages_sections_do(api_for: ApiFor, viewer: User, noisy: AlertRule) -> None:
    quiet = rule("dlq_growth", severity="critical", silenced_until=timezone.now() + dt.timedelta(hours=1))
    pending = make_alert(noisy, "queue:p.dlq", status=AlertStatus.PENDING)
    firing = make_alert(noisy, "queue:f.dlq")
    acknowledged = make_alert(noisy, "queue:k.dlq", status=AlertStatus.ACKNOWLEDGED)
    resolved = make_alert(noisy, "queue:r.dlq", status=AlertStatus.RESOLVED)
    silenced = make_alert(noisy, "queue:s.dlq", silenced_until=timezone.now() + dt.timedelta(hours=1))
    lapsed = make_alert(noisy, "queue:l.dlq", silenced_until=timezone.now() - dt.timedelta(minutes=1))
    of_silenced_rule = make_alert(quiet, "queue:q.dlq")
    make_alert(quiet, "queue:old.dlq", status=AlertStatus.RESOLVED)  # its rule is silenced, but it is over
    client = api_for(viewer)

    def listed(state: str) -> set[int]:
        response = client.get("/api/v1/alerts/", {"state": state})
        assert response.status_code == 200
        return set(ids(response.json()))

    firing_ones = {firing.pk, silenced.pk, lapsed.pk, of_silenced_rule.pk}
    assert listed("pending") == {pending.pk}
    assert listed("firing") == firing_ones
    assert listed("acknowledged") == {acknowledged.pk}
    assert resolved.pk in listed("resolved") and listed("resolved").isdisjoint(firing_ones)
    assert listed("active") == firing_ones | {acknowledged.pk}
    assert listed("open") == firing_ones | {acknowledged.pk, pending.pk}
    assert listed("silenced") == {silenced.pk, of_silenced_rule.pk}


def test_rule_severity_broker_and_subject_narrow(api_for: ApiFor, viewer: User, noisy: AlertRule) -> None:
    Broker.objects.create(name="staging", url="amqp://ops@rabbit.staging.example:5672/staging")
    other = rule("dlq_growth", severity="critical")
    default_queue = make_alert(noisy, "queue:orders.dlq")
    staging_queue = make_alert(noisy, "queue@staging:orders.dlq")
    critical = make_alert(other, "queue:payments.dlq")
    client = api_for(viewer)

    def listed(**query: Any) -> list[int]:
        response = client.get("/api/v1/alerts/", query)
        assert response.status_code == 200, response.json()
        return ids(response.json())

    assert listed(rule=noisy.pk) == [staging_queue.pk, default_queue.pk]
    assert listed(severity="critical") == [critical.pk]
    assert listed(broker="staging") == [staging_queue.pk]
    assert listed(broker="default") == [critical.pk, default_queue.pk]
    assert listed(subject="queue:orders.dlq") == [default_queue.pk]
    assert listed(rule=noisy.pk, broker="default", state="firing") == [default_queue.pk]
    assert client.get("/api/v1/alerts/", {"broker": "staging"}).json()["results"][0]["broker"] == "staging"


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"state": "burning"}, "state"),
        ({"rule": "abc"}, "rule"),
        ({"severity": "loud"}, "severity"),
        ({"broker": "no such/broker"}, "broker"),
        ({"subject": "queue:\x00"}, "subject"),
    ],
)
def test_a_bad_filter_is_refused_with_the_field_named(
    api_for: ApiFor, viewer: User, query: dict[str, str], field: str
) -> None:
    response = api_for(viewer).get("/api/v1/alerts/", query)

    assert response.status_code == 400
    assert response["Content-Type"] == "application/json"
    assert response.json()["code"] == "invalid"
    assert field in response.json()["errors"]


def test_pages_follow_the_cursor_and_cost_the_same_whatever_their_size(
    api_for: ApiFor, viewer: User, noisy: AlertRule
) -> None:
    made = [make_alert(noisy, f"queue:q{index}.dlq") for index in range(5)]
    client = api_for(viewer)
    client.get("/api/v1/")  # the token's first use writes its last use

    seen: list[int] = []
    url: str | None = "/api/v1/alerts/?limit=2"
    while url:
        answer = client.get(url).json()
        seen += ids(answer)
        url = answer["next"]
    with CaptureQueriesContext(connection) as small:
        client.get("/api/v1/alerts/?limit=1")
    with CaptureQueriesContext(connection) as large:
        client.get("/api/v1/alerts/?limit=5")

    assert seen == [alert.pk for alert in reversed(made)]
    assert len(large) == len(small)


def test_one_alert_and_json_404s(api_for: ApiFor, viewer: User, firing: Alert) -> None:
    client = api_for(viewer)

    answer = client.get(f"/api/v1/alerts/{firing.pk}/").json()
    missing = client.get(f"/api/v1/alerts/{firing.pk + 1000}/")

    assert (answer["id"], answer["status"], answer["link"]) == (firing.pk, "firing", "")
    assert missing.status_code == 404 and missing["Content-Type"] == "application/json"
    assert client.get("/api/v1/alerts/x/").status_code == 404


def test_an_operator_acknowledges_and_the_audit_row_names_the_token(
    api_for: ApiFor, operator: User, firing: Alert
) -> None:
    client = api_for(operator)

    response = client.post(f"/api/v1/alerts/{firing.pk}/acknowledge/")
    again = client.post(f"/api/v1/alerts/{firing.pk}/acknowledge/")

    assert response.status_code == 200
    assert (response.json()["status"], response.json()["acknowledged_by"]) == ("acknowledged", operator.username)
    assert response.json()["acknowledged_at"] is not None
    entry = AuditEntry.objects.get(action="alerts.alert.acknowledge", target=f"alert:{firing.pk}")
    assert entry.actor == operator and entry.via.startswith("API token tests-1 (dlq_")
    assert again.status_code == 400
    assert again.json() == {"detail": "Only a firing alert can be acknowledged.", "code": "refused"}


@pytest.mark.parametrize("path", ["acknowledge", "silence"])
def test_a_viewer_changes_nothing(api_for: ApiFor, viewer: User, firing: Alert, path: str) -> None:
    response = api_for(viewer).post(f"/api/v1/alerts/{firing.pk}/{path}/", {"for": "1h"}, format="json")

    assert response.status_code == 403
    assert response.json() == {"detail": "This needs the operator role.", "code": "permission_denied"}
    firing.refresh_from_db()
    assert (firing.status, firing.silenced_until) == (AlertStatus.FIRING, None)
    assert not AuditEntry.objects.filter(action__startswith="alerts.alert").exists()


def test_silence_for_a_duration_until_a_moment_and_lifted(api_for: ApiFor, operator: User, firing: Alert) -> None:
    client = api_for(operator)
    url = f"/api/v1/alerts/{firing.pk}/silence/"
    moment = (timezone.now() + dt.timedelta(days=2)).replace(microsecond=0)

    for_two_hours = client.post(url, {"for": "2h"}, format="json")
    firing.refresh_from_db()
    assert for_two_hours.status_code == 200
    assert firing.silenced_until is not None
    assert dt.timedelta(minutes=119) < firing.silenced_until - timezone.now() <= dt.timedelta(hours=2)
    assert for_two_hours.json()["silence_ends"] is not None

    until = client.post(url, {"until": moment.isoformat()}, format="json")
    assert until.status_code == 200
    assert dt.datetime.fromisoformat(until.json()["silenced_until"]) == moment

    lifted = client.post(url, {"for": "0"}, format="json")
    assert lifted.status_code == 200
    assert (lifted.json()["silenced_until"], lifted.json()["silence_ends"]) == (None, None)
    details = AuditEntry.objects.filter(action="alerts.alert.silence").order_by("id").values_list("detail", flat=True)
    assert len(details) == 3 and details[2].endswith("silence lifted")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "non_field_errors"),
        ({"for": "2h", "until": "2099-01-01T00:00:00Z"}, "non_field_errors"),
        ({"for": "soon"}, "for"),
        ({"for": "400d"}, "for"),
        ({"until": "2001-01-01T00:00:00Z"}, "until"),
        ({"until": "2999-01-01T00:00:00Z"}, "until"),
        ({"until": "tomorrow"}, "until"),
    ],
)
def test_a_bad_silence_is_refused_and_changes_nothing(
    api_for: ApiFor, operator: User, firing: Alert, body: dict[str, str], field: str
) -> None:
    response = api_for(operator).post(f"/api/v1/alerts/{firing.pk}/silence/", body, format="json")

    assert response.status_code == 400
    assert response.json()["code"] == "invalid" and field in response.json()["errors"]
    firing.refresh_from_db()
    assert firing.silenced_until is None


def test_a_resolved_alert_cannot_be_silenced(api_for: ApiFor, operator: User, noisy: AlertRule) -> None:
    resolved = make_alert(noisy, "queue:r.dlq", status=AlertStatus.RESOLVED)

    response = api_for(operator).post(f"/api/v1/alerts/{resolved.pk}/silence/", {"for": "1h"}, format="json")

    assert response.status_code == 400
    assert response.json() == {"detail": "A resolved alert cannot be silenced.", "code": "refused"}


def test_a_broker_no_one_has_is_refused_naming_those_there_are(api_for: Any, viewer: User) -> None:
    response = api_for(viewer).get("/api/v1/alerts/", {"broker": "nope"})
    assert response.status_code == 400
    assert "no broker named 'nope' (known: default" in response.json()["detail"]
