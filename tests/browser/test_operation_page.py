"""The operation page in a real browser: a refused control's reason and what the operator typed outlive the
progress fragment's 1 s poll, until the next action or until dismissed."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from dlqconsole.operations.models import Operation, OperationStatus
from dlqconsole.operations.planning import plan_operation
from tests.browser.conftest import log_in
from tests.factories import many

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Three polls of the progress fragment (every 1 s): the reviewer saw the reason vanish after the first.
OUTLIVE_POLLS_MS = 3500


def polls_seen(page: Page) -> list[str]:
    """Record the progress polls the page makes from now on, so a test knows the fragment really was replaced."""
    seen: list[str] = []
    page.on("response", lambda response: seen.append(response.url) if response.request.method == "GET" else None)
    return seen


def test_a_wrong_purge_count_stays_visible_with_what_was_typed_until_dismissed(page: Page, admin_user: User) -> None:
    letters = many(3)
    operation = plan_operation(kind="purge", filter={"pattern": [letters[0].pattern_id]}, actor=admin_user)
    log_in(page, admin_user)
    page.goto(f"/operations/{operation.pk}/")

    page.get_by_test_id("typed-count").fill("5")
    page.get_by_role("button", name="Start: purge 3 messages").click()
    error = page.get_by_test_id("control-error")
    expect(error).to_contain_text("Nothing was deleted: you typed 5, but this purge deletes 3 messages.")
    polls = polls_seen(page)
    page.wait_for_timeout(OUTLIVE_POLLS_MS)

    assert len([url for url in polls if url.endswith(f"/operations/{operation.pk}/")]) >= 2
    expect(error).to_contain_text("Nothing was deleted: you typed 5")
    expect(page.get_by_test_id("typed-count")).to_have_value("5")
    page.get_by_role("link", name="Dismiss").click()
    expect(page.get_by_test_id("control-error")).to_have_count(0)
    # Dismissed by the script, not by a reload: the field still holds what was typed.
    expect(page.get_by_test_id("typed-count")).to_have_value("5")
    operation.refresh_from_db()
    assert operation.status == OperationStatus.PLANNED


def test_a_bad_rate_stays_visible_until_the_next_action_replaces_it(page: Page, operator: User) -> None:
    letters = many(2)
    operation = plan_operation(kind="retry", filter={"pattern": [letters[0].pattern_id]}, actor=operator, rate="1/1m")
    log_in(page, operator)
    page.goto(f"/operations/{operation.pk}/")

    page.get_by_test_id("rate-input").fill("garbage")
    page.get_by_role("button", name="Set rate").click()
    error = page.get_by_test_id("control-error")
    expect(error).to_contain_text("garbage")
    page.wait_for_timeout(OUTLIVE_POLLS_MS)

    expect(error).to_contain_text("garbage")
    expect(page.get_by_test_id("rate-input")).to_have_value("garbage")
    page.get_by_test_id("rate-input").fill("5/1s")
    page.get_by_role("button", name="Set rate").click()
    expect(page.get_by_test_id("control-error")).to_have_count(0)
    expect(page.locator("#progress")).to_contain_text("5/1s")
    assert Operation.objects.get(pk=operation.pk).rate == "5/1s"
