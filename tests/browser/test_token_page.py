"""The API tokens page on a phone (375 px) in a real browser: a read-only token made with the form, shown once (a
reload of the answer says it was made already, and shows it no more), the table of tokens inside its card with
nothing clipped and no state or date broken inside a word, and Revoke that asks first, after which the token gets
401 from the API. The top bar's "API tokens" link looks like the links beside it."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from playwright.sync_api import Browser, Page, expect

from dlqconsole.accounts.models import ApiToken
from dlqconsole.accounts.tokens import create_token, revoke_tokens
from tests.browser.conftest import DESKTOP, PHONE, SCREENSHOTS, Watched, accept_dialogs, log_in, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SHOWN = re.compile(r"^dlq_[0-9a-f]{8}_[A-Za-z0-9_-]{43}$")
SENT_AGAIN = "This token was created already; it is shown only once. Revoke it and create another if you lost it."
# A name with no space to break at (dots and digits): it wraps inside its cell rather than widening the table.
LONG_NAME = "ci.deploy.production.eu-west-1.nightly-reconciliation.v2"


def older_tokens(user: User) -> None:
    """Tokens in every state, used and not, as a page a while in use holds them."""
    now = timezone.now()
    create_token(user=user, name="runbook")
    used, _ = create_token(user=user, name="dashboard-ro", read_only=True)
    ApiToken.objects.filter(pk=used.pk).update(last_used_at=now - dt.timedelta(hours=3))
    expired, _ = create_token(user=user, name="short")
    ApiToken.objects.filter(pk=expired.pk).update(expires_at=now - dt.timedelta(minutes=5))
    revoked, _ = create_token(user=user, name="to-revoke")
    revoke_tokens([revoked], actor=user)
    create_token(user=user, name=LONG_NAME, expires_at=now + dt.timedelta(days=365))


def layout(page: Page) -> dict[str, Any]:
    """The tokens table at this width: its box's widths, the cells (and Revoke buttons) that stick out of the box,
    and the words of the name, state and date cells drawn on more than one line (but for a name too long for
    its column, which may break anywhere)."""
    return page.evaluate(
        """() => {
            const box = document.querySelector('.table-wrap');
            const right = box.getBoundingClientRect().right;
            const shown = [...box.querySelectorAll('th, td, button')].filter(e => e.offsetParent !== null);
            const broken = [];
            const cells = box.querySelectorAll('tbody td:nth-child(-n+2), tbody td.small');
            for (const cell of [...cells].filter(cell => cell.offsetParent !== null)) {
                const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
                for (let node = walker.nextNode(); node; node = walker.nextNode()) {
                    for (const word of node.data.matchAll(/\\S+/g)) {
                        const range = document.createRange();
                        range.setStart(node, word.index);
                        range.setEnd(node, word.index + word[0].length);
                        const tops = new Set([...range.getClientRects()].map(rect => Math.round(rect.top)));
                        if (tops.size > 1 && word[0].length <= 20) broken.push(word[0]);
                    }
                }
            }
            return {
                scrollWidth: box.scrollWidth,
                clientWidth: box.clientWidth,
                outside: shown.filter(e => e.getBoundingClientRect().right > right + 0.5)
                    .map(e => e.tagName + ' ' + e.textContent.trim().slice(0, 30)),
                broken: broken,
                page: document.documentElement.scrollWidth,
            };
        }"""
    )


def api_status(browser: Browser, base_url: str, token: str) -> int:
    """What /api/v1/ answers the token, from a browser context of its own (no session cookie)."""
    context = browser.new_context(base_url=base_url)
    try:
        return context.request.get("/api/v1/", headers={"Authorization": f"Bearer {token}"}).status
    finally:
        context.close()


def test_a_token_made_and_revoked_on_a_phone(
    page: Page, browser: Browser, live_server: Any, operator: User, watched: Watched
) -> None:
    older_tokens(operator)
    log_in(page, operator)
    page.set_viewport_size(PHONE)
    page.goto("/account/tokens/")

    # The top bar's link is as large as the links beside it, and the bar fits the phone.
    sizes = page.evaluate(
        """() => [...document.querySelectorAll('.topbar .nav a, .topbar .logout a, .topbar .logout button')]
            .map(e => getComputedStyle(e).fontSize)"""
    )
    assert len(set(sizes)) == 1, sizes
    expect(page.locator(".logout a", has_text="API tokens")).to_have_attribute("aria-current", "page")

    # The Read-only box sits before its word, on the same line; a click on the word ticks it.
    box, word = page.evaluate(
        """() => {
            const box = document.getElementById('t-read-only');
            const text = [...box.parentElement.childNodes].find(node => node.nodeType === 3 && node.data.trim());
            const range = document.createRange();
            range.selectNodeContents(text);
            const rects = [...range.getClientRects()].filter(rect => rect.width > 0);
            const [b, w] = [box.getBoundingClientRect(), rects[0]];
            return [{x: b.x, width: b.width, y: b.y, height: b.height, lines: 1},
                    {x: w.x, width: w.width, y: w.y, height: w.height, lines: rects.length}];
        }"""
    )
    assert word["lines"] == 1 and box["x"] + box["width"] <= word["x"], (box, word)
    assert abs((box["y"] + box["height"] / 2) - (word["y"] + word["height"] / 2)) < 3, (box, word)
    page.get_by_text("Read-only", exact=True).click()
    expect(page.locator("#t-read-only")).to_be_checked()

    page.fill("#t-name", "phone-bot")
    page.get_by_role("button", name="Create token").click()
    new = page.locator("#new-token")
    expect(new).to_be_visible()
    token = new.input_value()
    assert SHOWN.match(token)
    assert ApiToken.objects.get(user=operator, name="phone-bot").read_only
    assert api_status(browser, live_server.url, token) == 200
    row = page.locator("tbody tr", has_text="phone-bot")
    expect(row).to_contain_text("active")
    expect(row).to_contain_text("read-only")

    # The table fits its card: every column that shows is in view, Revoke whole, no state or date cut in a word.
    found = layout(page)
    assert found["scrollWidth"] <= found["clientWidth"], found
    assert found["outside"] == [] and found["broken"] == [] and found["page"] <= PHONE["width"], found
    expect(page.locator("th", has_text="Created")).to_be_hidden()
    expect(page.locator("th", has_text="Expires")).to_be_hidden()
    page.screenshot(path="/tmp/token-page-375.png", full_page=True)

    # A reload sends the form again: the page says the token was made already, and shows it no more.
    page.reload()
    expect(page.locator(".warn-box")).to_have_text(SENT_AGAIN)
    expect(page.locator("#new-token")).to_have_count(0)
    expect(page.locator(".error-box")).to_have_count(0)
    assert token not in page.content()
    assert ApiToken.objects.filter(user=operator, name="phone-bot").count() == 1
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "api-tokens-reloaded-375.png"), full_page=True)

    # Revoke asks first: a "no" leaves the token working.
    page.goto("/account/tokens/")
    row.get_by_role("button", name="Revoke").click()
    assert watched.dialogs == [
        "confirm: Revoke the API token phone-bot (dlq_"
        + token[4:12]
        + ")? Requests with it get 401 from then on; this cannot be undone."
    ]
    assert api_status(browser, live_server.url, token) == 200
    dialogs = accept_dialogs(page, watched)
    row.get_by_role("button", name="Revoke").click()
    expect(page.locator(".flash")).to_contain_text("Revoked API token phone-bot")
    assert len(dialogs) == 1
    expect(row.locator("[data-testid=state]")).to_have_text("revoked")
    expect(row.get_by_role("button", name="Revoke")).to_have_count(0)
    assert api_status(browser, live_server.url, token) == 401
    found = layout(page)
    assert found["scrollWidth"] <= found["clientWidth"] and found["broken"] == [], found

    # At desktop width every column shows; the shared screenshots (test artifacts) check the page fits a phone.
    page.set_viewport_size(DESKTOP)
    expect(page.locator("th", has_text="Expires")).to_be_visible()
    screenshot(page, "api-tokens")
    assert not watched.page_errors
