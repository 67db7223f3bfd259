"""In a real browser with a real worker: a planned purge offers what it will delete as a download before the
count is typed, and once the worker has purged, the page offers the list of what it deleted."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from dlqconsole.deadletters.models import DeadLetter
from dlqconsole.operations.planning import plan_operation
from tests.browser.conftest import WORKER_WAIT_MS, Watched, log_in, screenshot
from tests.factories import EnvelopeFactory, store

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def downloaded(page: Page, link_name: str) -> list[dict[str, str]]:
    with page.expect_download() as download:
        page.get_by_role("link", name=link_name).click()
    return list(csv.DictReader(io.StringIO(Path(download.value.path()).read_text(encoding="utf-8"))))


def test_admin_downloads_what_a_purge_will_delete_then_what_it_deleted(
    page: Page, admin_user: User, celery_worker: Callable[..., object], watched: Watched
) -> None:
    stored = store(*(EnvelopeFactory.build(queue="refunds", error="refund rejected by provider") for _ in range(3)))
    ids = sorted(row.pk for row in stored)
    keys = {row.pk: row.dedupe_key for row in DeadLetter.objects.filter(pk__in=ids)}
    purge = plan_operation(kind="purge", filter={"ids": ids}, actor=admin_user)
    celery_worker(control=True)
    log_in(page, admin_user)
    page.goto(f"/operations/{purge.pk}/")

    expect(page.get_by_test_id("purge-export")).to_contain_text("Download what will be deleted")
    planned = downloaded(page, "CSV")
    screenshot(page, "purge-planned-export")
    page.fill("[data-testid=typed-count]", "3")
    page.get_by_role("button", name="Start: purge 3 messages").click()
    expect(page.locator("[data-testid=status]")).to_have_text("Done", timeout=WORKER_WAIT_MS)
    deleted = downloaded(page, "Download the list of the dead letters it deleted")

    assert sorted(int(row["id"]) for row in planned) == ids
    assert not DeadLetter.objects.filter(pk__in=ids).exists()
    assert {int(row["dead_letter_id"]): row["dedupe_key"] for row in deleted} == keys
    assert {row["source_queue"] for row in deleted} == {"refunds.dlq"}
    screenshot(page, "purge-done-record")
    assert not watched.page_errors
