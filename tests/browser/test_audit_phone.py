"""In a real browser at 375 px: the audit log's Who column keeps a short user name whole ("operator", not
"operat/or"), while long targets and details still wrap inside the page."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page

from dlqconsole.accounts.models import AuditEntry
from tests.browser.conftest import log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_short_user_name_is_not_broken_inside_the_word_on_a_phone(page: Page, admin_user: User) -> None:
    AuditEntry.objects.create(
        actor_name="operator",
        action="operation.start",
        target="operation #" + "9" * 60,
        detail="retry of " + "x" * 300,
    )
    log_in(page, admin_user)
    page.set_viewport_size({"width": 375, "height": 800})

    page.goto("/audit/?action=operation.start")
    page.wait_for_load_state("networkidle")

    lines = page.evaluate(
        """() => {
            const cell = [...document.querySelectorAll('tbody tr td:nth-child(2)')]
                .find(td => td.textContent.trim() === 'operator');
            const range = document.createRange();
            range.selectNodeContents(cell);
            return new Set([...range.getClientRects()].map(rect => Math.round(rect.top))).size;
        }"""
    )
    assert lines == 1
    assert page.evaluate("document.documentElement.scrollWidth") <= 375
