"""The browser test world: Debian's chromium driven by Playwright against pytest-django's live server, with what
each page did (dialogs, console errors) kept for the test, and screenshots at desktop and phone width. Workers,
queues and dead letters come from tests/conftest.py, tests/support.py and tests/factories.py."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Browser, ConsoleMessage, Dialog, Page, ViewportSize, sync_playwright

from tests.alerts.conftest import receiver  # noqa: F401  (the webhook receiver fixture, for the alert flows)
from tests.support import ROOT

SCREENSHOTS = ROOT / "var" / "artifacts" / "screenshots"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
DESKTOP: ViewportSize = {"width": 1366, "height": 900}
PHONE: ViewportSize = {"width": 375, "height": 812}

# How long a page may wait for a Celery worker to take and finish its work: generous, since a worker that
# starts on a loaded 2-core machine takes seconds to import Django (a ceiling for correctness, not a speed test).
WORKER_WAIT_MS = 60_000


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    # Playwright's sync API runs an asyncio loop in this thread; the test's own ORM calls are still synchronous.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        yield launched
        launched.close()
    if previous is None:
        os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    else:
        os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


class Watched:
    """Everything a page did that a test must see: dialogs (an injected alert() would open one), console
    errors and uncaught exceptions."""

    def __init__(self) -> None:
        self.dialogs: list[str] = []
        self.console_errors: list[str] = []
        self.page_errors: list[str] = []

    def on_dialog(self, dialog: Dialog) -> None:
        self.dialogs.append(f"{dialog.type}: {dialog.message}")
        dialog.dismiss()

    def on_console(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            self.console_errors.append(message.text)


@pytest.fixture
def watched() -> Watched:
    return Watched()


@pytest.fixture
def page(browser: Browser, live_server: Any, watched: Watched) -> Iterator[Page]:
    context = browser.new_context(viewport=DESKTOP, base_url=live_server.url)
    opened = context.new_page()
    opened.on("dialog", watched.on_dialog)
    opened.on("console", watched.on_console)
    opened.on("pageerror", lambda error: watched.page_errors.append(str(error)))
    opened.set_default_timeout(15000)
    yield opened
    context.close()
    # Every page works under the Content Security Policy: nothing the console serves is refused.
    assert [error for error in watched.console_errors if "Content Security Policy" in error] == []


def accept_dialogs(page: Page, watched: Watched) -> list[str]:
    """Accept confirm dialogs (the shared page dismisses them) and keep their text."""
    messages: list[str] = []

    def accept(dialog: Dialog) -> None:
        messages.append(dialog.message)
        dialog.accept()

    page.remove_listener("dialog", watched.on_dialog)
    page.on("dialog", accept)
    return messages


def log_in(page: Page, user: User) -> None:
    page.goto("/login/")
    page.fill("#id_username", user.username)
    page.fill("#id_password", "pw-" + user.username)
    page.click("button[type=submit]")
    page.wait_for_url("**/")


def screenshot(page: Page, name: str) -> None:
    """Save the page at desktop width and at 375 px (test artifacts), and check it does not overflow a phone."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}-desktop.png"), full_page=True)
    page.set_viewport_size(PHONE)
    page.wait_for_timeout(100)
    overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    # The outermost elements that stick out, to say what to fix.
    culprits = page.evaluate(
        """() => [...document.querySelectorAll('body *')]
            .filter(e => e.getBoundingClientRect().right > document.documentElement.clientWidth + 1)
            .filter(e => !e.parentElement.closest('.table-wrap'))
            .slice(0, 5).map(e => e.tagName.toLowerCase() + (e.className ? '.' + e.className : '')
                + ' right=' + Math.round(e.getBoundingClientRect().right))"""
    )
    page.screenshot(path=str(SCREENSHOTS / f"{name}-375.png"), full_page=True)
    page.set_viewport_size(DESKTOP)
    assert overflow <= 0, f"{name} is {overflow}px wider than a 375px screen: {culprits}"
