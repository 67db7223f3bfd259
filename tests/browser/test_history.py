"""In a real browser: Back after filtering shows the fields of the address it returns to, so pressing Filter
again keeps that filter instead of silently dropping it."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from tests.browser.conftest import Watched, log_in
from tests.factories import parked

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def back(page: Page) -> None:
    """The browser's Back button. htmx answers it by loading the address again, which aborts the navigation
    Playwright's go_back waits for; the expectations that follow wait for the page instead."""
    page.evaluate("history.back()")


def test_back_restores_the_filter_fields_of_the_address(page: Page, viewer: User, watched: Watched) -> None:
    parked(2, queue="orders.dlq", reason="TIMEOUT")
    parked(1, queue="payments.dlq", message="card declined", error_type="CardError", reason="VALIDATION_FAILED")
    log_in(page, viewer)
    page.goto("/messages/")
    rows = page.locator('#results tbody tr:has(a[href^="/messages/"])')
    expect(rows).to_have_count(3)

    page.fill("#f-queue", "orders.dlq")
    page.press("#f-queue", "Enter")
    expect(page).to_have_url(re.compile(r"queue=orders\.dlq"))
    expect(rows).to_have_count(2)
    page.select_option("#f-reason", "VALIDATION_FAILED")
    expect(page).to_have_url(re.compile(r"reason=VALIDATION_FAILED"))
    expect(rows).to_have_count(0)

    back(page)

    expect(page).to_have_url(re.compile(r"/messages/\?queue=orders\.dlq$"))
    expect(page.locator("#f-queue")).to_have_value("orders.dlq")
    expect(page.locator("#f-reason")).to_have_value("")
    expect(rows).to_have_count(2)
    back(page)
    expect(page).to_have_url(re.compile(r"/messages/$"))
    expect(page.locator("#f-queue")).to_have_value("")
    expect(rows).to_have_count(3)
    assert watched.console_errors == [] and watched.page_errors == []
