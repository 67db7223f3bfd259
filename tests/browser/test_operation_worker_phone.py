"""The operation pages on a phone (375 px) with the lines this issue added: a long "waiting for a worker" warning,
a stale heartbeat, and "came back" with a reason per boomerang kind, each a link."""

from __future__ import annotations

import datetime as dt

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from playwright.sync_api import Page

from dlqconsole.operations.models import ItemStatus, Operation, OperationItem, OperationKind, OperationStatus
from tests.browser.conftest import Watched, log_in
from tests.browser.test_phone_layout import check_phone_page
from tests.factories import ParsedDeadLetterFactory, parked, store

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

REASONS = ["REJECTED", "MAXLEN", "EXPIRED", "DELIVERY_LIMIT", "VALIDATION_FAILED"]


def test_the_worker_line_and_the_reasons_they_came_back_fit_a_phone(
    page: Page, operator: User, watched: Watched
) -> None:
    long_ago = timezone.now() - dt.timedelta(minutes=10)
    waiting = Operation.objects.create(
        kind=OperationKind.RETRY,
        status=OperationStatus.RUNNING,
        total=12_000,
        started_at=long_ago,
        heartbeat_at=long_ago,
    )
    quiet = Operation.objects.create(
        kind=OperationKind.RETRY,
        status=OperationStatus.RUNNING,
        total=12_000,
        succeeded=4_000,
        started_at=long_ago,
        heartbeat_at=long_ago,
        runner="worker-gone",
    )
    letters = parked(len(REASONS) * 3)
    paused = Operation.objects.create(
        kind=OperationKind.RETRY,
        status=OperationStatus.PAUSED,
        total=len(letters) + 1000,
        succeeded=len(letters),
        started_at=long_ago,
        canary_size=len(letters),
        canary_failed=True,
        pause_reason="canary of 15: 1 came back to a dead-letter queue within 60s (1 rejected)",
    )
    OperationItem.objects.bulk_create(
        OperationItem(operation=paused, dead_letter=letter, status=ItemStatus.PUBLISHED) for letter in letters
    )
    store(
        *(
            ParsedDeadLetterFactory.build(replayed_from=letter.pk, failure_reason=REASONS[n % len(REASONS)])
            for n, letter in enumerate(letters)
        )
    )

    log_in(page, operator)
    problems: list[str] = []
    for operation, name in ((waiting, "waiting"), (quiet, "quiet"), (paused, "came-back")):
        problems += check_phone_page(page, f"/operations/{operation.pk}/", f"operation-{name}")
    problems += check_phone_page(page, "/operations/", "operations-waiting")

    assert not problems, "\n".join(problems)
    page.goto(f"/operations/{paused.pk}/")
    assert "15 to a dead-letter queue" in page.get_by_test_id("came-back").inner_text()
    assert page.get_by_test_id("came-back-REJECTED").inner_text() == "3 rejected"
    page.goto(f"/operations/{waiting.pk}/")
    assert page.get_by_test_id("worker").inner_text().startswith("Waiting for a worker since ")
    assert watched.dialogs == []
