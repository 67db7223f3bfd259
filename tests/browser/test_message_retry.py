"""Retry one message from its page in a real browser: the Retry button, its confirm dialog naming the destination,
the operation page it opens, the message back on RabbitMQ; then the warning that it was replayed already."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from django.contrib.auth.models import User
from pika.adapters.blocking_connection import BlockingChannel
from playwright.sync_api import Page, expect

from dlqconsole.deadletters.models import DeadLetter, DeadLetterStatus
from dlqconsole.operations.models import Operation
from tests.browser.conftest import WORKER_WAIT_MS, Watched, accept_dialogs, log_in, screenshot
from tests.support import declare_with_dlq, die_on_broker, drain, ingest_from

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def orders(amqp_channel: BlockingChannel, queue_name: Callable[[str], str]) -> Iterator[str]:
    queue = queue_name("orders")
    declare_with_dlq(amqp_channel, queue)
    yield queue


def test_operator_retries_one_message_in_two_clicks(
    page: Page,
    operator: User,
    orders: str,
    amqp_channel: BlockingChannel,
    celery_worker: Callable[..., object],
    watched: Watched,
) -> None:
    die_on_broker(
        amqp_channel,
        orders,
        [b'{"order": 77}'],
        headers={"x-exception-type": "TimeoutError", "x-exception-message": "upstream timed out"},
    )
    (stored,) = ingest_from(amqp_channel, orders + ".dlq", expect=1)
    celery_worker(control=True)
    dialogs = accept_dialogs(page, watched)

    log_in(page, operator)
    page.goto(f"/messages/{stored.pk}/")
    screenshot(page, "message-retry")
    page.get_by_role("button", name="Retry", exact=True).click()

    expect(page.locator("h1")).to_contain_text("Retry #")
    assert dialogs == [f"Retry dead letter #{stored.pk}: publish it again to queue {orders}?"]
    expect(page.locator("[data-testid=status]")).to_have_text("Done", timeout=WORKER_WAIT_MS)
    operation = Operation.objects.get()
    assert page.url.endswith(f"/operations/{operation.pk}/")
    assert [body for _, body in drain(amqp_channel, orders)] == [b'{"order": 77}']
    assert DeadLetter.objects.get(pk=stored.pk).status == DeadLetterStatus.REPLAYED

    # Back on the message: it says it was replayed, and so does the dialog of a second retry.
    page.goto(f"/messages/{stored.pk}/")
    warning = page.locator("[data-testid=sent-warning]")
    expect(warning).to_contain_text("Already replayed at ")
    expect(warning).to_contain_text(f"by operation #{operation.pk}; retrying sends it again.")
    screenshot(page, "message-replayed")
    page.get_by_role("button", name="Retry", exact=True).click()
    expect(page.locator("[data-testid=status]")).to_have_text("Done", timeout=WORKER_WAIT_MS)
    assert dialogs[1].startswith("Already replayed at ")
    assert f"by operation #{operation.pk}; retrying sends it again." in dialogs[1]
    assert [body for _, body in drain(amqp_channel, orders)] == [b'{"order": 77}']
    assert Operation.objects.count() == 2
    assert not watched.page_errors
