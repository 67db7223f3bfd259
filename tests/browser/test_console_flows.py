"""Key flows in a real browser: sign in, find a pattern, plan and run a rate-limited retry, watch it reach
100%, see the messages back on RabbitMQ, edit and retry one message; hostile payloads stay text."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator

import pytest
from django.contrib.auth.models import User
from pika.adapters.blocking_connection import BlockingChannel
from playwright.sync_api import Page, expect

from dlqconsole.deadletters.models import DeadLetter, DeadLetterStatus
from dlqconsole.operations.models import Operation, OperationStatus
from tests.browser.conftest import WORKER_WAIT_MS, Watched, log_in, screenshot
from tests.factories import EnvelopeFactory, store
from tests.support import declare_with_dlq, die_on_broker, drain, ingest_from

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def orders(amqp_channel: BlockingChannel, queue_name: Callable[[str], str]) -> Iterator[str]:
    queue = queue_name("orders")
    declare_with_dlq(amqp_channel, queue)
    yield queue


def test_sign_in_is_required_and_a_wrong_password_is_refused(page: Page, viewer: User, watched: Watched) -> None:
    page.goto("/patterns/")
    expect(page).to_have_url(re.compile(r"/login/\?next=/patterns/"))
    screenshot(page, "login")

    page.fill("#id_username", viewer.username)
    page.fill("#id_password", "wrong")
    page.click("button[type=submit]")
    expect(page.locator("h1")).to_have_text("Sign in")

    page.fill("#id_username", viewer.username)
    page.fill("#id_password", "pw-" + viewer.username)
    page.click("button[type=submit]")
    expect(page).to_have_url(re.compile(r"/patterns/$"))
    assert not watched.page_errors


def test_operator_finds_a_pattern_and_runs_a_rate_limited_retry(
    page: Page,
    operator: User,
    orders: str,
    amqp_channel: BlockingChannel,
    celery_worker: Callable[..., object],
    watched: Watched,
) -> None:
    bodies = [json.dumps({"order": number}).encode() for number in range(12)]
    die_on_broker(
        amqp_channel,
        orders,
        bodies,
        headers={"x-exception-type": "TimeoutError", "x-exception-message": "inventory timed out after 3000ms"},
    )
    stored = ingest_from(amqp_channel, orders + ".dlq", expect=12)
    # Unrelated failures the retry must not touch.
    store(EnvelopeFactory.build(queue="billing", error="card declined for customer 9", error_type="CardError"))
    celery_worker(control=True)

    log_in(page, operator)
    screenshot(page, "dashboard")
    page.click("nav >> text=Patterns")
    page.fill("#f-q", "inventory timed out")
    page.press("#f-q", "Enter")
    page.wait_for_load_state("networkidle")
    row = page.locator("#patterns tbody tr", has_text="inventory timed out after")
    expect(row).to_have_count(1)
    expect(page.locator("#patterns tbody tr")).to_have_count(1)
    # Triage in place: the row is swapped by htmx, the page is not reloaded.
    page.evaluate("window.__sameDocument = true")
    row.locator("button", has_text="Acknowledge").click()
    expect(row.get_by_test_id("triage")).to_have_text("Acknowledged")
    # Choosing in a select filters at once (no submit button needed).
    page.select_option("#f-status", "resolved")
    expect(page.locator("#patterns")).to_contain_text("No pattern matches.")
    page.select_option("#f-status", "acknowledged")
    expect(row).to_have_count(1)
    assert page.evaluate("window.__sameDocument") is True
    screenshot(page, "patterns")

    row.locator("a", has_text="inventory timed out").click()
    expect(page.locator("h1")).to_contain_text("Pattern #")
    screenshot(page, "pattern")
    page.click("text=Retry all")
    expect(page.locator("h1")).to_have_text("Retry: plan")
    expect(page.locator("text=12 dead letters now")).to_be_visible()
    # A worker takes about two seconds of work per chunk: at 2/1s the bar moves in steps of four.
    page.fill("#p-rate", "2/1s")
    screenshot(page, "plan")
    page.click("button:has-text('Make the plan')")

    expect(page.locator("h1")).to_contain_text("Retry #")
    operation = Operation.objects.get(kind="retry")
    assert (operation.total, operation.rate, operation.status) == (12, "2/1s", OperationStatus.PLANNED)
    expect(page.locator("#progress")).to_contain_text("Planned")
    screenshot(page, "operation-planned")
    page.click("button:has-text('Start: retry 12 messages')")

    # The fragment polls every second: watch the bar move without reloading the page.
    expect(page.locator("[data-testid=status]")).to_have_text(re.compile("Running|Done"), timeout=WORKER_WAIT_MS)
    seen = set()
    for _ in range(40):
        seen.add(page.locator("[data-testid=progress]").get_attribute("aria-valuenow"))
        if "100" in seen:
            break
        page.wait_for_timeout(250)
    expect(page.locator("[data-testid=progress]")).to_have_attribute("aria-valuenow", "100", timeout=WORKER_WAIT_MS)
    expect(page.locator("[data-testid=status]")).to_have_text("Done")
    assert len(seen - {"0", "100"}) >= 1, f"the bar jumped straight to the end: {seen}"
    screenshot(page, "operation-done")

    back = drain(amqp_channel, orders)
    assert sorted(body for _, body in back) == sorted(bodies)
    for properties, _ in back:
        assert not any(
            name.lower().startswith(("x-death", "x-first-death", "x-last-death")) for name in properties.headers
        )
    assert set(DeadLetter.objects.filter(pk__in=[row.pk for row in stored]).values_list("status", flat=True)) == {
        DeadLetterStatus.REPLAYED
    }
    assert DeadLetter.objects.filter(source_queue="billing.dlq", status=DeadLetterStatus.PARKED).count() == 1

    page.click("nav >> text=Operations")
    expect(page.locator("#operations")).to_contain_text(f"Retry #{operation.pk}")
    screenshot(page, "operations")
    assert not watched.dialogs and not watched.page_errors


def test_operator_edits_and_retries_one_message(
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
        [b'{"order": 41, "currency": "EUX"}'],
        headers={"x-exception-type": "ValidationError", "x-exception-message": "unknown currency 'EUX'"},
    )
    (stored,) = ingest_from(amqp_channel, orders + ".dlq", expect=1)
    celery_worker(control=True)

    log_in(page, operator)
    page.click("nav >> text=Messages")
    page.fill("#f-text", "unknown currency")
    page.click("button:has-text('Filter')")
    expect(page.locator("#results tbody tr")).to_have_count(1)
    screenshot(page, "messages")
    page.click(f"#results >> text=#{stored.pk}")
    expect(page.locator("h1")).to_contain_text(f"Dead letter #{stored.pk}")
    expect(page.locator("[data-testid=payload]")).to_contain_text('"currency": "EUX"')
    screenshot(page, "message")

    page.click("text=Edit and retry…")
    page.fill("#id_body", '{"order": 41, "currency": "EUR"}')
    page.click("button:has-text('Show the changes')")
    # The member that changed, one line each (the failed attempt's error headers show as left out, too).
    expect(page.locator("#diff .del", has_text='"currency"')).to_have_text('-  "currency": "EUX"')
    expect(page.locator("#diff .add", has_text='"currency"')).to_have_text('+  "currency": "EUR"')
    screenshot(page, "edit-and-retry")
    page.click("button:has-text('Send the edited copy')")

    expect(page.locator("h1")).to_contain_text("Edit and retry #")
    expect(page.locator("[data-testid=status]")).to_have_text("Done", timeout=WORKER_WAIT_MS)
    back = drain(amqp_channel, orders)
    assert [body for _, body in back] == [b'{"order": 41, "currency": "EUR"}']
    stored.refresh_from_db()
    assert bytes(stored.body) == b'{"order": 41, "currency": "EUX"}'
    copy = DeadLetter.objects.get(edited_from=stored)
    assert copy.status == DeadLetterStatus.REPLAYED

    page.goto(f"/messages/{stored.pk}/")
    expect(page.locator("#history")).to_contain_text(f"#{copy.pk}")
    assert not watched.dialogs and not watched.page_errors


def test_hostile_payload_header_and_error_are_shown_as_text(page: Page, viewer: User, watched: Watched) -> None:
    (stored,) = store(
        EnvelopeFactory.build(
            body=b"<script>alert('body')</script><img src=x onerror=\"alert('img')\">",
            error="<script>alert('error')</script>",
            error_type="<b>Bold</b>Error",
            headers={"x-note": "<img src=x onerror=alert('header')>", "<svg onload=alert(1)>": "name"},
            content_type="text/html",
        )
    )

    log_in(page, viewer)
    for path in ("/", "/patterns/", "/messages/", f"/messages/{stored.pk}/", f"/patterns/{stored.pattern_id}/"):
        page.goto(path)
        page.wait_for_load_state("networkidle")
    page.goto(f"/messages/{stored.pk}/")

    expect(page.locator("[data-testid=payload]")).to_have_text(
        "<script>alert('body')</script><img src=x onerror=\"alert('img')\">"
    )
    expect(page.locator("[data-testid=header-value]", has_text="onerror=alert('header')")).to_be_visible()
    expect(page.locator("pre", has_text="<script>alert('error')</script>")).to_be_visible()
    assert page.locator("script", has_text="alert(").count() == 0
    assert page.locator("img[src=x]").count() == 0
    screenshot(page, "hostile-message")
    assert watched.dialogs == []
    assert not watched.page_errors


def test_viewer_sees_no_recovery_controls(page: Page, viewer: User) -> None:
    (stored,) = store(EnvelopeFactory.build())

    log_in(page, viewer)
    page.goto(f"/messages/{stored.pk}/")
    expect(page.locator("h1")).to_contain_text(f"Dead letter #{stored.pk}")
    assert page.locator("a:has-text('Retry…'), a:has-text('Purge…'), a:has-text('Edit and retry…')").count() == 0
    page.goto("/patterns/")
    assert page.locator("#patterns button, #patterns a:has-text('Retry all')").count() == 0
    response = page.goto("/operations/plan/?kind=purge&pattern=1")
    assert response is not None and response.status == 403
    expect(page.locator("h1")).to_have_text("Not allowed")
    expect(page.locator("main")).to_contain_text("This needs the admin role.")


def test_dashboard_refreshes_itself_without_a_reload(page: Page, viewer: User) -> None:
    log_in(page, viewer)
    page.evaluate("window.__sameDocument = true")
    expect(page.locator("#panels")).to_contain_text("No dead letters parked.")

    store(EnvelopeFactory.build(queue="payments", error="gateway returned 502"))
    page.locator("#panels .refresh a").click()

    expect(page.locator("#panels")).to_contain_text("payments.dlq")
    assert page.evaluate("window.__sameDocument") is True


def test_a_refused_control_says_why_in_place(page: Page, operator: User, watched: Watched) -> None:
    """htmx swaps the 409 fragment that explains a refused control (it swaps only 2xx replies by default)."""
    from dlqconsole.operations.planning import plan_operation

    (stored,) = store(EnvelopeFactory.build(queue="payments"))
    operation = plan_operation(kind="retry", filter={"queue": [stored.source_queue]}, actor=operator)

    log_in(page, operator)
    page.goto(f"/operations/{operation.pk}/")
    page.evaluate("window.__sameDocument = true")
    page.fill(f"#rate-{operation.pk}", "bogus")
    page.get_by_role("button", name="Set rate").click()

    expect(page.locator("#progress .error-box", has_text="bogus")).to_contain_text("N/period")
    assert page.evaluate("window.__sameDocument") is True
    assert not watched.page_errors


def test_admin_types_the_count_to_start_a_purge_and_discards_a_plan_after_a_confirm(
    page: Page, admin_user: User, celery_worker: Callable[..., object], watched: Watched
) -> None:
    """Start on a purge deletes for good: the number of messages must be typed first (a wrong one is refused in
    place, nothing deleted). Discarding a plan asks in its own words."""
    from dlqconsole.operations.planning import plan_operation

    stored = store(*(EnvelopeFactory.build(queue="refunds", error="refund rejected by provider") for _ in range(3)))
    ids = [row.pk for row in stored]
    purge = plan_operation(kind="purge", filter={"ids": ids}, actor=admin_user)
    other = plan_operation(kind="archive", filter={"ids": ids}, actor=admin_user)
    celery_worker(control=True)

    log_in(page, admin_user)
    page.goto(f"/operations/{other.pk}/")
    page.get_by_role("button", name="Discard the plan").click()
    expect(page.locator("[data-testid=status]")).to_have_text("Planned")
    assert watched.dialogs == ["confirm: Discard this plan? Nothing has been done yet."]

    page.goto(f"/operations/{purge.pk}/")
    page.evaluate("window.__sameDocument = true")
    start = page.get_by_role("button", name="Start: purge 3 messages")
    start.click()  # the field is required: the browser sends nothing
    expect(page.locator("[data-testid=status]")).to_have_text("Planned")
    page.fill("[data-testid=typed-count]", "30")
    start.click()
    expect(page.locator("#progress .error-box")).to_contain_text("Nothing was deleted: you typed 30")
    assert DeadLetter.objects.filter(pk__in=ids).count() == 3
    screenshot(page, "purge-refused")

    page.fill("[data-testid=typed-count]", "3")
    page.get_by_role("button", name="Start: purge 3 messages").click()
    expect(page.locator("[data-testid=status]")).to_have_text("Done", timeout=WORKER_WAIT_MS)
    assert page.evaluate("window.__sameDocument") is True
    assert not DeadLetter.objects.filter(pk__in=ids).exists()
    assert Operation.objects.get(pk=other.pk).status == OperationStatus.PLANNED
    assert not watched.page_errors
