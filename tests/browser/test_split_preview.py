"""In a real browser: the split preview is a POST from the pattern page's form, answered in place by htmx, and as
the whole page (scrolled to the card) without JavaScript; the Split button then splits."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Browser, Page, expect

from dlqconsole.deadletters.models import DeadLetter, FailurePattern
from tests.browser.conftest import DESKTOP, Watched, log_in
from tests.factories import parked

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def timeouts() -> int:
    parked(3, message="Request timed out after 3000ms")
    (short, _) = parked(2, message="Request timed out after 1500ms")
    return short.pattern_id


def test_operator_previews_a_split_in_place_then_splits(page: Page, operator: User, watched: Watched) -> None:
    pattern_id = timeouts()
    log_in(page, operator)
    page.goto(f"/patterns/{pattern_id}/")
    page.evaluate("window.notReloaded = true")

    page.fill("#s-name", "Short timeouts")
    page.fill("#s-regex", "after 1500ms")
    page.press("#s-regex", "Enter")

    preview = page.get_by_test_id("split-preview")
    expect(preview).to_contain_text("The rule takes 2 of the 5 dead letters of this pattern")
    assert page.evaluate("window.notReloaded") is True  # answered in place, not by a page load
    expect(page).to_have_url(re.compile(rf"/patterns/{pattern_id}/(#split)?$"))
    page.click("#split button[value=split]")

    part = FailurePattern.objects.get(template="Short timeouts")
    expect(page).to_have_url(re.compile(rf"/patterns/{part.pk}/$"))
    assert DeadLetter.objects.filter(pattern=part).count() == 2
    assert watched.console_errors == [] and watched.page_errors == []


def test_the_split_preview_works_without_javascript(browser: Browser, live_server: Any, operator: User) -> None:
    pattern_id = timeouts()
    context = browser.new_context(viewport=DESKTOP, base_url=live_server.url, java_script_enabled=False)
    page = context.new_page()
    log_in(page, operator)
    page.goto(f"/patterns/{pattern_id}/")

    page.fill("#s-name", "Short timeouts")
    page.fill("#s-regex", "after 1500ms")
    page.click("#split button[value=preview]")

    expect(page).to_have_url(re.compile(rf"/patterns/{pattern_id}/split/#split$"))
    expect(page.get_by_test_id("split-preview")).to_contain_text("The rule takes 2 of the 5")
    expect(page.locator("#s-regex")).to_have_value("after 1500ms")
    context.close()
