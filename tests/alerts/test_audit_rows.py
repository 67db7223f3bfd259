"""The alerts' rows on the audit page read as what happened: '2 alerts' (not '2 alerts · 2 messages'), the ids
once, rule names rather than bare 'rule:6', and times to the second with their zone (not ISO with microseconds)."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.contrib.auth.models import User
from django.test import Client, override_settings
from django.urls import reverse

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.accounts.services import record_audit
from dlqconsole.alerts.changes import silence_alert, silence_alerts, silence_rule
from dlqconsole.alerts.evaluation import evaluate_rules
from dlqconsole.alerts.models import Alert, AlertStatus
from tests.factories import parked, rule

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]

UNTIL = dt.datetime(2099, 11, 26, 8, 23, 0, 123456, tzinfo=dt.UTC)


@pytest.fixture
def firing(db: None) -> list[Alert]:
    rule("dlq_not_empty")
    for queue in ("orders.dlq", "payments.dlq"):
        parked(1, queue=queue)
    evaluate_rules()
    return list(Alert.objects.filter(status=AlertStatus.FIRING).select_related("rule").order_by("pk"))


def audit_row(client: Client, action: str) -> str:
    html = client.get(reverse("accounts:audit"), {"action": action}).content.decode()
    rows = re.findall(r"<tr>\s*<td class=\"small[^\"]*\">.*?</tr>", html, re.S)
    assert len(rows) == 1, rows
    return re.sub(r"\s+", " ", rows[0])


def test_bulk_acknowledge_row_counts_alerts_not_messages_and_names_ids_once(
    client: Client, operator: User, firing: list[Alert]
) -> None:
    client.force_login(operator)
    ids = [str(alert.pk) for alert in firing]
    client.post(reverse("alerts:bulk"), {"action": "acknowledge", "scope": "selected", "ids": ids})

    row = audit_row(client, "alerts.alert.bulk_acknowledge")

    assert "2 alerts" in row and "message" not in row
    assert f"acknowledged: {firing[0].rule.name} (2)" in row
    assert row.count(f"{firing[0].pk},{firing[1].pk}") == 1 and f"#{firing[0].pk}" not in row
    assert "skipped" not in row


@override_settings(TIME_ZONE="Europe/Berlin")
def test_silence_rows_name_the_rule_and_a_zoned_time_to_the_second(
    client: Client, operator: User, firing: list[Alert]
) -> None:
    alert_rule = firing[0].rule
    silence_rule(rule=alert_rule, actor=operator, until=UNTIL)
    silence_alert(alert=firing[0], actor=operator, until=UNTIL)
    silence_alerts(alerts=firing, actor=operator, until=UNTIL)
    silence_rule(rule=alert_rule, actor=operator, until=None)

    details = list(
        AuditEntry.objects.filter(action__startswith="alerts.").order_by("pk").values_list("detail", flat=True)
    )

    assert details == [
        f"{alert_rule.name}: silenced until 2099-11-26 09:23:00 CET",
        f"{alert_rule.name} · orders.dlq: silenced until 2099-11-26 09:23:00 CET",
        f"silenced until 2099-11-26 09:23:00 CET: {alert_rule.name} (2)",
        f"{alert_rule.name}: silence lifted",
    ]


def test_rows_about_messages_still_count_messages(client: Client, operator: User) -> None:
    record_audit(actor=operator, action="pattern.merge", target="pattern #7", count=5, detail="merged #3 into #7")
    record_audit(actor=None, action="archive.retention", count=1, detail="deleted old archives")
    client.force_login(operator)

    assert "· 5 messages" in audit_row(client, "pattern.merge")
    assert "· 1 message<" in audit_row(client, "archive.retention")
