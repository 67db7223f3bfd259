"""The Django admin's own pages of the console, in a real browser, entered by a console role without the staff
flag: the confirmation page of a bulk action (our template) fits a phone."""

from __future__ import annotations

from collections.abc import Callable

import pika
import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from tests.browser.conftest import Watched, log_in, screenshot
from tests.factories import EnvelopeFactory, store

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# An error whose template keeps a long unbroken run (a module path), as real ones do.
LONG_PATH_ERROR = "Customer 42 does not exist at orders/handlers.py:handle_order_created_with_reservation_and_pricing"


def test_the_retry_confirmation_page_fits_a_phone(
    page: Page,
    operator: User,
    watched: Watched,
    amqp_connection: pika.BlockingConnection,
    queue_name: Callable[[str], str],
) -> None:
    # Their queue exists, so the plan can replay them and the page offers Start.
    work = queue_name("orders")
    amqp_connection.channel().queue_declare(queue=work)
    store(
        *(
            EnvelopeFactory.build(
                queue=work, exchange="", routing_key=work, error_type="CustomerDoesNotExist", error=LONG_PATH_ERROR
            )
            for _ in range(2)
        )
    )
    log_in(page, operator)

    page.goto("/admin/deadletters/deadletter/")
    page.check("#action-toggle")
    page.select_option("select[name=action]", "retry_selected")
    page.click("button[name=index]")

    expect(page.locator("h1")).to_have_text("Retry 2 selected dead letters")
    expect(page.get_by_role("button", name="Start: retry 2 dead letters")).to_be_visible()
    screenshot(page, "admin-retry-confirm")
    assert watched.console_errors == [] and watched.page_errors == []
