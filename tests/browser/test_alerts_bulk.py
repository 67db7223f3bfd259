"""In a real browser: ticked alerts survive the list's self-refresh and are acknowledged in one go; the rule form
shows only the fields the chosen kind uses."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.alerts.evaluation import evaluate_rules
from dlqconsole.alerts.models import Alert, AlertRule, AlertStatus
from tests.browser.conftest import Watched, log_in, screenshot
from tests.factories import parked, rule

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_bulk_acknowledge_and_rule_form_by_kind(page: Page, admin_user: User, watched: Watched) -> None:
    rule("dlq_not_empty")
    for queue in ("orders.dlq", "payments.dlq", "emails.dlq"):
        parked(1, queue=queue)
    evaluate_rules()
    first, second, third = Alert.objects.filter(status=AlertStatus.FIRING).order_by("pk")

    log_in(page, admin_user)
    page.goto("/alerts/")
    page.locator(f"#alert-{first.pk} input[name=ids]").check()
    page.locator(f"#alert-{second.pk} input[name=ids]").check()
    page.locator("h1").click()  # focus leaves the boxes: only the ticks hold the refresh back
    expect(page.locator("[data-bulk-paused]")).to_be_visible()
    # The list refreshes itself every 5 s, but not while alerts are ticked: the ticks survive.
    page.wait_for_timeout(6000)
    expect(page.locator(f"#alert-{first.pk} input[name=ids]")).to_be_checked()
    expect(page.locator(f"#alert-{second.pk} input[name=ids]")).to_be_checked()
    screenshot(page, "alerts-ticked")

    page.locator("#alert-bulk").get_by_role("button", name="Acknowledge").click()

    expect(page.locator("#flash")).to_contain_text("Acknowledged 2 alerts.")
    expect(page.locator(f"#alert-{first.pk}")).to_contain_text(f"by {admin_user.username}")
    expect(page.locator(f"#alert-{second.pk}")).to_contain_text(f"by {admin_user.username}")
    expect(page.locator(f"#alert-{third.pk}")).to_contain_text("Firing")
    statuses = [Alert.objects.get(pk=alert.pk).status for alert in (first, second, third)]
    assert statuses == [AlertStatus.ACKNOWLEDGED, AlertStatus.ACKNOWLEDGED, AlertStatus.FIRING]
    assert AuditEntry.objects.get(action="alerts.alert.bulk_acknowledge").filter["ids"] == [first.pk, second.pk]

    page.goto("/alerts/rules/new/")
    kind = page.locator("#id_kind")
    threshold, window, age, pattern = (
        page.locator(f"#id_{name}") for name in ("threshold", "window_seconds", "age", "pattern")
    )
    expect(kind).to_have_value("dlq_not_empty")
    expect(threshold).to_be_visible()
    expect(pattern).to_be_visible()
    expect(window).to_be_hidden()
    expect(age).to_be_hidden()
    screenshot(page, "alert-rule-form-not-empty")

    kind.select_option("dlq_growth")
    expect(window).to_be_visible()
    expect(window).to_have_value("1m")
    expect(threshold).to_have_value("100")  # the kind's default replaces the untouched one

    kind.select_option("queue_depth")
    expect(window).to_be_hidden()
    expect(pattern).to_be_hidden()
    expect(threshold).to_be_visible()
    expect(page.locator("li[data-kinds=queue_depth]").first).to_be_visible()
    expect(page.locator("li[data-kinds=dlq_growth]").first).to_be_hidden()

    kind.select_option("oldest_age")
    expect(age).to_be_visible()
    expect(age).to_have_value("1d")
    expect(threshold).to_be_hidden()

    kind.select_option("dlq_growth")
    page.fill("#id_name", "Orders growing <fast>")
    page.fill("#id_queue", "orders.dlq")
    window.fill("5m")
    page.get_by_role("button", name="Save").click()

    expect(page.locator("#flash")).to_contain_text("Rule “Orders growing <fast>” saved.")
    created = AlertRule.objects.get(name="Orders growing <fast>")
    assert (created.kind, created.threshold, created.window_seconds, created.queue) == (
        "dlq_growth",
        100,
        300,
        "orders.dlq",
    )
    assert not watched.page_errors and not watched.dialogs
