"""In a real browser: the API's docs page (Swagger UI from drf-spectacular-sidecar's static files) renders the schema's
operations under the Content Security Policy, with nothing refused and nothing asked of another host; a signed-in
operator tries a read and a change with the page's session (the change carries the CSRF header); signed out, the
page sends to the login."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from playwright.sync_api import Page, Response, expect

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.alerts.models import Alert, AlertStatus
from tests.browser.conftest import Watched, log_in
from tests.factories import rule

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_signed_out_the_docs_page_sends_to_the_login(page: Page) -> None:
    page.goto("/api/v1/docs/")

    expect(page).to_have_url("/login/?next=/api/v1/docs/")


def test_the_docs_page_renders_the_schema_and_tries_calls_with_the_session(
    page: Page, live_server: Any, operator: User, watched: Watched
) -> None:
    now = timezone.now()
    firing = Alert.objects.create(
        rule=rule("dlq_not_empty"),
        subject="queue:orders.dlq",
        subject_label="orders.dlq",
        severity="warning",
        status=AlertStatus.FIRING,
        summary="orders.dlq has dead letters",
        started_at=now,
        fired_at=now,
    )
    ours = urlsplit(live_server.url).netloc
    elsewhere: list[str] = []
    failed: list[str] = []
    page.on("request", lambda request: None if urlsplit(request.url).netloc == ours else elsewhere.append(request.url))

    def on_response(response: Response) -> None:
        if response.status >= 400:
            failed.append(f"{response.status} {response.url}")

    page.on("response", on_response)
    log_in(page, operator)

    page.goto("/api/v1/docs/")
    audit = page.locator(".opblock-get", has=page.locator(".opblock-summary-path", has_text="/api/v1/audit/"))
    expect(audit).to_have_count(1)
    expect(page.locator(".opblock-tag", has_text="alerts")).to_have_count(1)
    audit.locator(".opblock-summary").click()
    audit.get_by_role("button", name="Try it out").click()
    audit.get_by_role("button", name="Execute").click()
    expect(audit.locator(".live-responses-table tr.response .response-col_status").first).to_have_text("200")
    expect(audit.locator(".live-responses-table .microlight").first).to_contain_text('"results"')

    acknowledge = page.locator(
        ".opblock-post", has=page.locator(".opblock-summary-path", has_text="/api/v1/alerts/{id}/acknowledge/")
    )
    acknowledge.locator(".opblock-summary").click()
    acknowledge.get_by_role("button", name="Try it out").click()
    acknowledge.locator("input[placeholder=id]").fill(str(firing.pk))
    acknowledge.get_by_role("button", name="Execute").click()
    expect(acknowledge.locator(".live-responses-table tr.response .response-col_status").first).to_have_text("200")
    expect(acknowledge.locator(".live-responses-table .microlight").first).to_contain_text('"acknowledged"')

    firing.refresh_from_db()
    assert firing.status == AlertStatus.ACKNOWLEDGED and firing.acknowledged_by == operator
    entry = AuditEntry.objects.get(action="alerts.alert.acknowledge")
    assert (entry.actor, entry.via) == (operator, "")  # the session is the user, through no token
    assert elsewhere == []
    assert failed == []
    assert watched.console_errors == [] and watched.page_errors == []
