"""The alert pages in a real browser: a firing alert is seen and acknowledged, and an admin adds a webhook channel
and sends it a test that a real worker delivers to a real HTTP receiver."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from pika.adapters.blocking_connection import BlockingChannel
from playwright.sync_api import Page, expect

from dlqconsole.alerts.defaults import install_default_rules
from dlqconsole.alerts.evaluation import evaluate_rules
from dlqconsole.alerts.models import Alert, AlertRule, AlertStatus, Notification
from tests.alerts.conftest import Receiver
from tests.browser.conftest import WORKER_WAIT_MS, Watched, log_in, screenshot
from tests.factories import EnvelopeFactory, store

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def control_queue(amqp_channel: BlockingChannel) -> str:
    """Sends other tests left on the control queue must not reach this test's worker first."""
    amqp_channel.queue_declare(queue=settings.DLQ_CONTROL_QUEUE, durable=True)
    amqp_channel.queue_purge(queue=settings.DLQ_CONTROL_QUEUE)
    return settings.DLQ_CONTROL_QUEUE


def test_operator_sees_a_firing_alert_and_acknowledges_it(page: Page, operator: User, watched: Watched) -> None:
    install_default_rules(AlertRule)  # as the data migration does (a transactional test starts from a flush)
    store(EnvelopeFactory.build(queue="payments", error="card <b>declined</b> for customer 42"))
    evaluate_rules()
    alert = Alert.objects.get(rule__kind="dlq_not_empty")

    log_in(page, operator)
    page.goto("/alerts/")
    row = page.locator(f"#alert-{alert.pk}")
    expect(row).to_contain_text("payments.dlq")
    screenshot(page, "alerts")
    row.get_by_role("button", name="Acknowledge").click()

    expect(page.locator(f"#alert-{alert.pk}")).to_contain_text(f"by {operator.username}")
    alert.refresh_from_db()
    assert alert.status == AlertStatus.ACKNOWLEDGED and alert.acknowledged_by == operator
    # The list refreshes itself every 5 s, but not while a choice is being made in it.
    chooser = page.locator(f"#silence-{alert.pk}")
    chooser.focus()  # as a click on it does
    chooser.select_option(index=2)
    chosen = chooser.input_value()
    page.wait_for_timeout(6000)
    expect(page.locator(f"#silence-{alert.pk}")).to_have_value(chosen)
    page.goto(f"/alerts/{alert.pk}/")
    expect(page.locator("h1")).to_contain_text("payments.dlq")
    screenshot(page, "alert")
    page.goto("/alerts/queues/")
    expect(page.locator("h1")).to_have_text("Watched queues")
    screenshot(page, "watched-queues")
    assert not watched.page_errors


def test_admin_adds_a_webhook_channel_and_sends_it_a_test(
    page: Page,
    admin_user: User,
    receiver: Receiver,
    control_queue: str,
    celery_worker: Callable[..., object],
    watched: Watched,
) -> None:
    install_default_rules(AlertRule)
    celery_worker(control=True)

    log_in(page, admin_user)
    page.goto("/alerts/rules/")
    expect(page.locator("body")).to_contain_text("Dead letters waiting")
    screenshot(page, "alert-rules")
    page.goto("/alerts/rules/new/")
    expect(page.locator("h1")).to_have_text("New alert rule")
    screenshot(page, "alert-rule-form")
    page.goto("/alerts/channels/new/")
    page.fill("#id_name", "on-call <hook>")
    page.select_option("#id_kind", "webhook")
    page.fill("#id_target", receiver.url)
    page.get_by_role("button", name="Save").click()
    expect(page).to_have_url(re.compile(r"/alerts/channels/\d+/$"))
    expect(page.locator("h1")).to_have_text("Channel “on-call <hook>”")

    page.get_by_role("button", name="Send test").click()

    expect(page.locator("#test-result")).to_contain_text("Sent", timeout=WORKER_WAIT_MS)
    sent = receiver.wait_for(lambda item: item.body.get("event") == "test", timeout=5)
    assert sent is not None
    notification = Notification.objects.get()
    assert notification.status == "sent" and notification.channel.name == "on-call <hook>"
    screenshot(page, "channel")
    page.goto("/alerts/channels/")
    expect(page.locator("body")).to_contain_text("on-call <hook>")
    screenshot(page, "channels")
    assert not watched.page_errors
