"""In a real browser: text from dead letters that is built to disturb the page. A 255-character host, queue or error
type without a space cannot widen the messages table, and a right-to-left override in a template ends at the
element that holds it instead of reordering the console's own words."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from dlqconsole.alerts.evaluation import evaluate_rules
from tests.browser.conftest import Watched, log_in
from tests.factories import EnvelopeFactory, rule, store

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

OVERRIDE = "\u202e"


def test_long_unbroken_values_do_not_widen_the_messages_table(page: Page, viewer: User, watched: Watched) -> None:
    store(
        EnvelopeFactory.build(host="h" * 255, queue="q" * 200, error_type="E" * 250 + "Error"),
        EnvelopeFactory.build(host="payments-service-6c7f8b9d5-p3v6c"),
    )
    page.set_viewport_size({"width": 1366, "height": 900})
    log_in(page, viewer)
    page.goto("/messages/")
    expect(page.locator("#results tbody tr")).to_have_count(2)

    wrap = page.locator("#results .table-wrap")
    scroll, visible = wrap.evaluate("box => [box.scrollWidth, box.clientWidth]")
    host_lines = page.locator("a.clip.host", has_text="payments-service").evaluate(
        "link => Math.round(link.getBoundingClientRect().height / parseFloat(getComputedStyle(link).lineHeight))"
    )

    assert scroll <= visible + 1, f"the table scrolls sideways: {scroll} px in {visible} px"
    assert host_lines == 1
    expect(page.locator('a.clip.host[title="only messages from ' + "h" * 255 + '"]')).to_have_count(1)
    assert watched.console_errors == [] and watched.page_errors == []


def test_a_right_to_left_override_cannot_reorder_an_alert_summary(page: Page, viewer: User) -> None:
    rule("new_pattern")
    store(EnvelopeFactory.build(error=f"invoice {OVERRIDE}exe.txt overdue", error_type="BillingError"))
    evaluate_rules()
    log_in(page, viewer)
    page.goto("/alerts/")
    summary = page.locator("td", has_text="parked").first
    expect(summary).to_contain_text("parked")

    # Where the browser draws the sender's text and the console's last word: with the override loose, "parked."
    # is reversed into the sender's run and drawn to the left of it.
    own, console = summary.evaluate(
        """cell => {
            const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
            const left = word => {
                for (let node = walker.nextNode(); node; node = walker.nextNode()) {
                    const at = node.data.indexOf(word);
                    if (at >= 0) {
                        const range = document.createRange();
                        range.setStart(node, at);
                        range.setEnd(node, at + word.length);
                        return range.getBoundingClientRect().left;
                    }
                }
                return null;
            };
            const sender = left("overdue");
            walker.currentNode = cell;
            return [sender, left("parked")];
        }"""
    )

    assert own is not None and console is not None
    assert own < console
