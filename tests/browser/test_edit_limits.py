"""In a real browser: an edited copy larger than the server takes in a form is stopped before it is sent, with
the reason beside the form (the server could only answer a bare 400, and the edit would be lost)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from dlqconsole.operations.models import Operation
from tests.browser.conftest import Watched, log_in
from tests.factories import EnvelopeFactory, store

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_an_edit_too_large_to_send_is_stopped_in_the_browser_with_the_reason(
    page: Page, operator: User, watched: Watched, settings: Any
) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 300 * 1024  # leaves 44 KB for an edit
    (stored,) = store(EnvelopeFactory.build(body=b'{"order": 7}'))
    log_in(page, operator)
    page.goto(f"/messages/{stored.pk}/edit/")
    warning = page.locator("[data-size-error]")
    expect(warning).to_be_hidden()

    page.fill("textarea[name=body]", '{"note": "' + "é" * 30_000 + '"}')  # 60 KB in UTF-8
    page.get_by_role("button", name="Show the changes").click()

    expect(warning).to_be_visible()
    expect(warning).to_contain_text("The edited copy is 59 KB, more than the 44 KB the console takes in a form")
    assert page.url.endswith(f"/messages/{stored.pk}/edit/")
    assert "é" * 100 in page.input_value("textarea[name=body]")  # what was typed is still there

    page.fill("textarea[name=body]", '{"order": 8}')
    page.get_by_role("button", name="Show the changes").click()
    expect(page.locator("#diff")).to_be_visible()
    expect(warning).to_be_hidden()
    assert Operation.objects.count() == 0
    assert watched.page_errors == []
