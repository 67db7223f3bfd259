"""The dashboard on the screens it is read on: a laptop's 1,400 px, where the top patterns' names must use the room
they have, and a phone's 375 px, which no card may widen."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from dlqconsole.brokers.models import Broker
from dlqconsole.deadletters.models import FailurePattern
from dlqconsole.ingest.models import QueueSample, WatchedQueue
from tests.browser.conftest import log_in, screenshot
from tests.factories import EnvelopeFactory, ParsedDeadLetterFactory, store

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# 60 characters with nothing the grouping masks (no number, id or address): the pattern's template is the text.
LONG_NAME = "NullPointerException at com.example.billing.InvoiceService.t"

# How many characters of a clipped link show: those whose box ends before the link's own right edge, less the
# room the ellipsis takes when the text is cut.
VISIBLE_CHARACTERS = """link => {
    const box = link.getBoundingClientRect();
    const cut = link.scrollWidth > link.clientWidth;
    const right = box.right - (cut ? 12 : 0);
    const text = link.firstChild;
    const range = document.createRange();
    let shown = 0;
    for (let index = 0; index < text.length; index++) {
        range.setStart(text, index);
        range.setEnd(text, index + 1);
        if (range.getBoundingClientRect().right <= right + 0.5) shown++;
    }
    return shown;
}"""


def test_a_long_pattern_name_shows_almost_whole_on_a_1400_px_screen(page: Page, viewer: User) -> None:
    store(
        *(EnvelopeFactory.build(queue="billing", error=LONG_NAME, error_type="NullPointerException") for _ in range(3))
    )
    store(EnvelopeFactory.build(queue="orders", error="gateway returned 502", error_type="GatewayError"))
    pattern = FailurePattern.objects.get(error_type="NullPointerException")
    assert len(pattern.template) == 60

    log_in(page, viewer)
    page.set_viewport_size({"width": 1400, "height": 900})
    page.goto("/")
    name = page.locator(f'#panels a.clip[href="/patterns/{pattern.pk}/"]')
    expect(name).to_have_text(LONG_NAME)

    assert name.evaluate(VISIBLE_CHARACTERS) >= 50
    # On a phone the card takes the screen's width, and the page is no wider than the screen.
    screenshot(page, "dashboard-long-pattern")


def test_queues_grouped_by_broker_fit_a_laptop_and_a_phone(page: Page, viewer: User) -> None:
    staging = Broker.objects.create(name="staging", url="amqp://ops@rabbit-staging.eu-west-1.example.internal/staging")
    store(*(EnvelopeFactory.build(queue="orders") for _ in range(2)))
    store(*ParsedDeadLetterFactory.build_batch(3, source_queue="orders.dlq", broker_id=staging.pk))
    for broker in (None, staging):
        owner = {"broker": broker} if broker is not None else {}
        WatchedQueue.objects.create(name="orders", dead_letter_queue="orders.dlq", dead_letter_exchange="x", **owner)
        QueueSample.objects.create(queue="orders", messages=7, consumers=1, **owner)

    log_in(page, viewer)
    page.set_viewport_size({"width": 1400, "height": 900})
    page.goto("/")

    brokers = page.get_by_role("region", name="Brokers")
    expect(brokers).to_contain_text("rabbit-staging.eu-west-1.example.internal")
    expect(page.locator("#panels tr.group-head")).to_have_count(4)  # two brokers, two queue tables
    screenshot(page, "dashboard-brokers")
