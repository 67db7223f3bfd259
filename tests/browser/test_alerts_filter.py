"""In a real browser: during an alert storm the operator narrows the current alerts to the noisy rule (the address
follows, the 5 s refresh keeps the filter), takes all firing ones shown and acknowledges them; the other rule's
alert keeps firing, at the top of an unfiltered list."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from playwright.sync_api import Page, expect

from dlqconsole.alerts.models import Alert, AlertRule, AlertStatus
from tests.browser.conftest import Watched, log_in, screenshot
from tests.factories import rule

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def make_alert(alert_rule: AlertRule, subject: str, *, minutes_ago: int) -> Alert:
    fired = timezone.now() - dt.timedelta(minutes=minutes_ago)
    return Alert.objects.create(
        rule=alert_rule,
        subject=f"queue:{subject}",
        subject_label=subject,
        severity=alert_rule.severity,
        status=AlertStatus.FIRING,
        summary=f"{subject} has dead letters",
        started_at=fired,
        fired_at=fired,
    )


def test_filter_by_rule_then_acknowledge_all_shown(page: Page, operator: User, watched: Watched) -> None:
    noisy = rule("dlq_not_empty", severity="warning")
    quiet = rule("dlq_growth", severity="critical")
    mine = [make_alert(noisy, f"q{index}.dlq", minutes_ago=index + 1) for index in range(3)]
    other = make_alert(quiet, "payments.dlq", minutes_ago=30)

    log_in(page, operator)
    page.goto("/alerts/")
    expect(page.locator("#alert-current tbody tr")).to_have_count(4)
    page.select_option("#alert-rule", str(noisy.pk))

    expect(page).to_have_url(re.compile(rf"/alerts/\?rule={noisy.pk}$"))
    expect(page.locator("#alert-current tbody tr")).to_have_count(3)
    expect(page.locator(f"#alert-{other.pk}")).to_have_count(0)
    page.locator("h1").click()  # focus leaves the select: the refresh may run
    page.wait_for_timeout(6000)
    expect(page.locator("#alert-current tbody tr")).to_have_count(3)
    expect(page.locator("#alert-current")).to_contain_text("all 3 firing shown")
    screenshot(page, "alerts-filtered")

    page.locator("#alert-bulk input[name=scope][value=firing]").check()
    page.locator("#alert-bulk").get_by_role("button", name="Acknowledge").click()

    expect(page.locator("#flash")).to_contain_text("Acknowledged 3 alerts.")
    expect(page.locator("#alert-current tbody tr")).to_have_count(3)
    assert {Alert.objects.get(pk=alert.pk).status for alert in mine} == {AlertStatus.ACKNOWLEDGED}
    assert Alert.objects.get(pk=other.pk).status == AlertStatus.FIRING

    page.goto("/alerts/")
    # Firing first: the one alert left firing leads the list, above the three just acknowledged.
    expect(page.locator("#alert-current tbody tr").first).to_have_id(f"alert-{other.pk}")
    assert watched.page_errors == [] and watched.dialogs == []
