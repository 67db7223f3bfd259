"""The list pages on a phone (375 px) and the filters, in a real browser, with the data an on-call engineer meets:
long templates, long queue names, hostile strings. No page may be wider than the screen, and a table that scrolls
inside its own box must still show its essential columns; the filter selects of the messages page filter at once
into a URL that can be bookmarked."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from playwright.sync_api import Page, ViewportSize, expect

from dlqconsole.alerts.defaults import install_default_rules
from dlqconsole.alerts.evaluation import evaluate_rules
from dlqconsole.alerts.models import (
    Alert,
    AlertRule,
    AlertStatus,
    Channel,
    Notification,
    NotificationKind,
    NotificationStatus,
)
from dlqconsole.deadletters.models import DeadLetter, FailurePattern
from dlqconsole.ingest.models import QueueSample, WatchedQueue
from dlqconsole.operations.models import Operation
from dlqconsole.operations.planning import plan_operation
from tests.browser.conftest import SCREENSHOTS, Watched, log_in
from tests.factories import EnvelopeFactory, store

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PHONE: ViewportSize = {"width": 375, "height": 800}
WIDE: ViewportSize = {"width": 1440, "height": 900}
FULL_HD: ViewportSize = {"width": 1920, "height": 1080}

LONG_QUEUE = "com.example.payments.settlement-reconciliation-batch-processor.eu-west-1.priority-high"
HOSTILE = "\"><img src=x onerror=alert(1)><script>alert('xss')</script>\u202egnp.exe"
LONG_URL = (
    "https://inventory-service.internal.example.com/api/v2/warehouses/eu-west-1/items/stock-reservations"
    "?include=pricing,availability,reservations&expand=all&trace=0af7651916cd43dd8448eb211c80319c"
)
# Errors of distinct shapes, so that each becomes a pattern of its own (a busy patterns page).
ERRORS = [
    ("TimeoutError", f"Request to {LONG_URL} timed out after 3000ms"),
    ("ValidationError", "field customer.billing_address.line1 failed: " + "A" * 180),
    ("XSSProbe", HOSTILE),
    ("com.example.platform.messaging.consumer.UnrecoverableDeserializationException", "cannot decode envelope"),
    ("ConnectionRefusedError", "connection refused by postgres-primary.db.internal:5432"),
    ("RateLimited", "upstream answered 429 Too Many Requests, retry after 30 s"),
    ("KeyError", "missing key 'customer_id' in order payload"),
    ("PermissionDenied", "token expired for service account billing-sync"),
    ("NotFound", "order 9182 not found in catalogue"),
    ("IntegrityError", "duplicate key value violates unique constraint order_pkey"),
    ("SSLError", "certificate verify failed: unable to get local issuer certificate"),
    ("DNSError", "name resolution failed for api.partner.example"),
    ("JSONDecodeError", "Expecting value: line 1 column 1 (char 0)"),
    ("MemoryError", "worker ran out of memory while resizing image"),
    ("OSError", "disk quota exceeded writing export file"),
    ("ZeroDivisionError", "division by zero in discount calculation"),
    ("UnicodeDecodeError", "utf-8 codec can't decode byte 0xff in position 0"),
    ("Conflict", "version mismatch: expected 7 got 8"),
    ("SMTPError", "mail relay rejected recipient address"),
    ("PaymentDeclined", "card declined by issuing bank"),
    ("InventoryShortage", "sku out of stock at every warehouse"),
    ("AssertionError", "invariant broken: total below zero"),
    ("LockTimeout", "could not obtain lock on row in relation invoices"),
    ("S3Error", "access denied writing bucket archive"),
    ("GatewayError", "bad gateway from shipping provider"),
    ("SchemaError", "unknown event version in header"),
    ("CircuitOpen", "breaker open for recommendations service"),
    ("QuotaExceeded", "daily quota used up for geocoding"),
    ("StaleRead", "replica lag above limit for accounts"),
    ("WebhookError", "partner endpoint answered 500"),
]


def build_world(admin: User) -> None:
    """Dead letters of 30 patterns over three queues (one with a very long name), two planned operations, watched
    work queues and alerts (firing and resolved) about those queues."""
    install_default_rules(AlertRule)
    # A rule name with no space to break at: shown on the alerts page's by-rule line and the rules page.
    named = AlertRule.objects.order_by("pk").first()
    assert named is not None
    AlertRule.objects.filter(pk=named.pk).update(name="N" * 120)
    queues = ["orders", LONG_QUEUE, "billing"]
    letters = [
        EnvelopeFactory.build(
            queue=queues[number % 3], error=error, error_type=error_type, host=f"worker-{number}.eu-west-1"
        )
        for number, (error_type, error) in enumerate(ERRORS)
        for _copy in range(1 + (len(ERRORS) - number) // 10)
    ]
    store(*letters)
    plan_operation(kind="move", filter={"queue": [LONG_QUEUE + ".dlq"]}, actor=admin, target_queue=LONG_QUEUE)
    plan_operation(kind="retry", filter={}, actor=admin, rate="2/1s")
    # Finished ones with the longest labels of the operations list: a run cancelled part way (its Done cell says
    # how many were skipped or not attempted) and a run whose every message failed.
    now = timezone.now()
    cancelled = plan_operation(kind="retry", filter={"queue": ["orders.dlq"]}, actor=admin, rate="1/1s")
    Operation.objects.filter(pk=cancelled.pk).update(
        status="cancelled", total=81, succeeded=5, skipped=76, started_at=now, finished_at=now
    )
    failed = plan_operation(kind="retry", filter={"queue": ["billing.dlq"]}, actor=admin, rate="1/1s")
    Operation.objects.filter(pk=failed.pk).update(status="done", total=2, failed=2, started_at=now, finished_at=now)
    # Work queues under backpressure: the widest cells of the dashboard (an emergency without consumers).
    for name, depth, consumers in [(LONG_QUEUE, 120_000, 0), ("orders", 12, 3)]:
        WatchedQueue.objects.create(name=name, dead_letter_queue=name + ".dlq", dead_letter_exchange=name + ".dlx")
        QueueSample.objects.create(queue=name, messages=depth, consumers=consumers)
    evaluate_rules()
    rule = AlertRule.objects.filter(enabled=True).first()
    assert rule is not None
    Alert.objects.create(
        rule=rule,
        subject=f"queue:{LONG_QUEUE}.dlq:old",
        subject_label=f"{LONG_QUEUE}.dlq",
        severity="critical",
        status=AlertStatus.RESOLVED,
        summary=f"{HOSTILE} {LONG_URL}",
        fired_at=timezone.now(),
        resolved_at=timezone.now(),
    )
    # A channel with a long address, a digest that failed with a long error, a notice that went in it and one
    # still held: the alert's, the channel's and the notification's pages show them.
    hook = Channel.objects.create(name=f"ops hook {HOSTILE}", kind="webhook", target=LONG_URL)
    resolved = Alert.objects.get(subject=f"queue:{LONG_QUEUE}.dlq:old")
    digest = Notification.objects.create(
        channel=hook,
        kind=NotificationKind.DIGEST,
        status=NotificationStatus.FAILED,
        attempts=3,
        error=f"HTTP 500 from {LONG_URL}: {HOSTILE} " * 4,
        context={"event": "digest", "count": 2, "counts": {"firing": 1, "resolved": 1}, "notices": []},
    )
    for status in (NotificationStatus.DIGESTED, NotificationStatus.HELD):
        Notification.objects.create(
            channel=hook,
            alert=resolved,
            kind=NotificationKind.FIRING,
            status=status,
            digest=digest if status == NotificationStatus.DIGESTED else None,
            context={"event": "firing", "summary": HOSTILE},
            next_attempt_at=timezone.now() + dt.timedelta(minutes=5) if status == NotificationStatus.HELD else None,
        )


def overflow_report(page: Page) -> dict[str, Any]:
    """How wide the page is, and each table box whose table is wider than the box, with the columns a reader
    sees in it without scrolling."""
    return page.evaluate(
        """() => ({
            width: document.documentElement.scrollWidth,
            outside: [...document.querySelectorAll('body *')]
                .filter(e => e.getBoundingClientRect().right > document.documentElement.clientWidth + 1)
                .filter(e => !e.parentElement.closest('.table-wrap'))
                .slice(0, 5).map(e => e.tagName.toLowerCase() + '.' + e.className),
            scrolling: [...document.querySelectorAll('.table-wrap')]
                .filter(box => box.scrollWidth > box.clientWidth + 1 && box.offsetParent !== null)
                .map(box => {
                    const right = box.getBoundingClientRect().right;
                    // The header cells, or a body row's cells in a table without a header.
                    const cells = [...box.querySelector('tr').children].filter(cell => cell.offsetParent !== null);
                    return cells.filter(cell => cell.getBoundingClientRect().right > right + 1)
                        .map(cell => cell.textContent.trim().slice(0, 40));
                }),
        })"""
    )


def check_phone_page(page: Page, path: str, name: str) -> list[str]:
    """Open PATH at 375 px and at 1440 px (screenshots of both) and say what sticks out."""
    page.set_viewport_size(PHONE)
    page.goto(path)
    page.wait_for_load_state("networkidle")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"phone-{name}-375.png"), full_page=True)
    report = overflow_report(page)
    problems = []
    if report["width"] > 375:
        problems.append(f"{name} is {report['width']}px wide at 375px: {report['outside']}")
    # A table may scroll in its own box, but only past secondary columns: every column that shows at this
    # width is an essential one and must be in view.
    if any(report["scrolling"]):
        problems.append(f"{name}: columns off-screen {report['scrolling']}")
    page.set_viewport_size(WIDE)
    page.screenshot(path=str(SCREENSHOTS / f"phone-{name}-1440.png"), full_page=True)
    # On a desktop screen no table hides a column behind a scroll bar (the dashboard's cards once did).
    wide = overflow_report(page)
    if any(wide["scrolling"]):
        problems.append(f"{name} at 1440px: columns off-screen {wide['scrolling']}")
    return problems


def test_every_list_page_fits_a_phone(page: Page, admin_user: User, watched: Watched) -> None:
    build_world(admin_user)
    long_pattern = FailurePattern.objects.get(error_type="TimeoutError")
    hostile_pattern = FailurePattern.objects.get(error_type="XSSProbe")
    long_queue_pattern = FailurePattern.objects.get(error_type="ValidationError")
    hostile_letter = DeadLetter.objects.filter(error_type="XSSProbe").first()
    assert hostile_letter is not None

    log_in(page, admin_user)
    problems: list[str] = []
    for path, name in [
        ("/", "dashboard"),
        ("/patterns/", "patterns"),
        ("/messages/", "messages"),
        (f"/messages/?queue={LONG_QUEUE}.dlq&reason=TIMEOUT&text=timed", "messages-filtered"),
        (f"/patterns/{long_pattern.pk}/", "pattern-long"),
        (f"/patterns/{hostile_pattern.pk}/", "pattern-hostile"),
        (f"/patterns/{long_queue_pattern.pk}/", "pattern-long-queue"),
        ("/operations/", "operations"),
        ("/alerts/", "alerts"),
        ("/audit/", "audit"),
        (f"/messages/{hostile_letter.pk}/", "message-hostile"),
        *[
            (f"/operations/{pk}/", f"operation-{n}")
            for n, pk in enumerate(Operation.objects.values_list("pk", flat=True))
        ],
        (f"/operations/plan/?kind=retry&pattern={long_pattern.pk}", "plan"),
        ("/alerts/rules/", "alert-rules"),
        ("/alerts/rules/new/", "alert-rule-new"),
        ("/alerts/channels/", "alert-channels"),
        ("/alerts/queues/", "watched-queues"),
        (f"/alerts/{Alert.objects.get(subject=f'queue:{LONG_QUEUE}.dlq:old').pk}/", "alert-digested"),
        # Its heading holds the pattern's template, a run of 'A's with no place to break.
        (f"/alerts/{Alert.objects.get(subject=f'pattern:{long_queue_pattern.pk}').pk}/", "alert-long-pattern"),
        (f"/alerts/channels/{Channel.objects.get().pk}/", "alert-channel"),
        (f"/alerts/notifications/{Notification.objects.get(kind='digest').pk}/", "notification-digest"),
        (f"/alerts/channels/{Channel.objects.get().pk}/edit/", "alert-channel-edit"),
        (f"/messages/{hostile_letter.pk}/edit/", "message-edit-hostile"),
    ]:
        problems += check_phone_page(page, path, name)
    assert not problems, "\n".join(problems)
    # The hostile strings stayed text everywhere.
    assert watched.dialogs == []
    assert not watched.page_errors


def test_patterns_page_shows_25_patterns_on_a_full_hd_screen(page: Page, admin_user: User) -> None:
    build_world(admin_user)
    log_in(page, admin_user)
    page.set_viewport_size(FULL_HD)
    page.goto("/patterns/")
    rows = page.locator("#patterns tbody tr")
    expect(rows).to_have_count(30)
    # The browser's own toolbars take about 100 px of a 1080 px screen.
    in_view = page.evaluate(
        "[...document.querySelectorAll('#patterns tbody tr')].filter(r => r.getBoundingClientRect().bottom <= 980)"
        ".length"
    )
    page.screenshot(path=str(SCREENSHOTS / "phone-patterns-1080p.png"))
    assert in_view >= 25
    # The recovery links open over the rows: the row keeps its height, and they can be clicked.
    row = rows.nth(1)
    height = row.bounding_box()["height"]  # type: ignore[index]
    row.locator("summary", has_text="Recover").click()
    expect(row.get_by_role("link", name="Retry all")).to_be_visible()
    assert row.bounding_box()["height"] == height  # type: ignore[index]
    page.screenshot(path=str(SCREENSHOTS / "phone-patterns-menu.png"))
    row.get_by_role("link", name="Retry all").click()
    expect(page.locator("h1")).to_have_text("Retry: plan")


def test_a_filter_select_on_the_messages_page_filters_at_once(page: Page, operator: User, watched: Watched) -> None:
    store(
        EnvelopeFactory.build(queue="orders", error="Request timed out after 3000ms", error_type="TimeoutError"),
        EnvelopeFactory.build(queue="orders", error="field email is not valid", error_type="ValidationError"),
    )
    log_in(page, operator)
    page.goto("/messages/")
    rows = page.locator("#results tbody tr")
    expect(rows).to_have_count(2)
    page.evaluate("window.__sameDocument = true")

    page.focus("#f-reason")  # as a click on it does
    page.select_option("#f-reason", "VALIDATION_FAILED")
    expect(page).to_have_url(re.compile(r"/messages/\?(.*&)?reason=VALIDATION_FAILED"))
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("field email is not valid")
    expect(page.locator("#filter-count")).to_contain_text("1 active")
    # Filtered in place, and the keyboard stays where it was.
    assert page.evaluate("window.__sameDocument") is True
    assert page.evaluate("document.activeElement.id") == "f-reason"
    # Empty fields stay out of the address: it is short enough to read and to bookmark.
    assert "text=" not in page.url and "since=" not in page.url

    # With the keyboard alone: an arrow key in a select filters too.
    page.focus("#f-status")
    page.keyboard.press("ArrowDown")
    expect(page).to_have_url(re.compile(r"status=parked"))
    expect(page.locator("#filter-count")).to_contain_text("2 active")
    page.keyboard.press("ArrowUp")
    expect(page).not_to_have_url(re.compile(r"status="))
    expect(page.locator("#filter-count")).to_contain_text("1 active")

    # Text fields filter on Enter, not on every key.
    page.fill("#f-text", "email")
    page.press("#f-text", "Enter")
    expect(page).to_have_url(re.compile(r"text=email"))
    expect(page.locator("#filter-count")).to_contain_text("2 active")

    # The address is the filter: opened again, it shows the same choice and the same rows.
    page.goto(page.url)
    expect(page.locator("#f-reason")).to_have_value("VALIDATION_FAILED")
    expect(rows).to_have_count(1)

    # On a phone the filters fold away under a summary that says how many are in use.
    page.set_viewport_size(PHONE)
    page.reload()
    summary = page.locator(".filter-panel > summary")
    expect(summary).to_contain_text("2 active")
    expect(page.locator("#f-reason")).to_be_hidden()
    summary.click()
    expect(page.locator("#f-reason")).to_be_visible()
    summary.click()
    # On a wider screen (a phone turned sideways, a window made wider) they are open again.
    page.set_viewport_size(WIDE)
    expect(page.locator("#f-reason")).to_be_visible()

    # The patterns page folds its filters the same way, and its count follows the choices.
    page.set_viewport_size(PHONE)
    page.goto("/patterns/?reason=VALIDATION_FAILED&sort=waiting")
    summary = page.locator(".filter-panel > summary")
    expect(summary).to_contain_text("1 active")
    expect(page.locator("#f-owner")).to_be_hidden()
    summary.click()
    page.focus("#f-owner")
    page.select_option("#f-owner", "none")
    expect(page).to_have_url(re.compile(r"owner=none"))
    expect(summary).to_contain_text("2 active")
    assert not watched.page_errors


def test_the_messages_table_shows_every_column_on_a_1366_px_laptop(page: Page, admin_user: User) -> None:
    # The most common laptop width: the error column gives way (it clips), not the host column at the right.
    build_world(admin_user)
    log_in(page, admin_user)
    page.set_viewport_size({"width": 1366, "height": 768})

    page.goto("/messages/")
    page.wait_for_load_state("networkidle")

    report = overflow_report(page)
    assert report["width"] <= 1366 and not any(report["scrolling"]), report
