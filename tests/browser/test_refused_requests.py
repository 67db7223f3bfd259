"""In a real browser: a control sent by htmx that the server refuses (an expired form, a role it lacks) says so
on the page; htmx leaves the page as it was on an error, so without this a click did nothing visible."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from dlqconsole.deadletters.models import FailurePattern
from tests.browser.conftest import Watched, log_in
from tests.factories import parked

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_triage_click_refused_for_an_expired_form_says_so(
    page: Page, live_server: Any, operator: User, watched: Watched
) -> None:
    (letter,) = parked(1)
    log_in(page, operator)
    page.goto(f"/patterns/{letter.pattern_id}/")
    # Another tab signed out and in again: the session's token changed, the one this page holds is out of date.
    page.context.add_cookies([{"name": "csrftoken", "value": "x" * 32, "url": live_server.url}])

    page.click("#pattern-summary button:has-text('Acknowledge')")

    notice = page.locator("#flash [role=alert]")
    expect(notice).to_contain_text("could not accept this form")
    expect(notice).to_contain_text("Nothing was changed.")
    assert FailurePattern.objects.get(pk=letter.pattern_id).status == "open"
    assert watched.page_errors == []
