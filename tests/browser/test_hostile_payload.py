"""In a real browser: a 64 KB body that would lay out into 57 MB (900 nested arrays around 31,000 numbers) opens
as text, with a notice saying why, and the raw body one click away."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from tests.browser.conftest import Watched, log_in
from tests.factories import EnvelopeFactory, store
from tests.hostile import HOSTILE_BODIES

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_indent_bomb_opens_as_text_with_a_notice_and_the_raw_download(
    page: Page, viewer: User, watched: Watched
) -> None:
    (bomb,) = [hostile for hostile in HOSTILE_BODIES if hostile.name == "indent-bomb-64k"]
    (stored,) = store(EnvelopeFactory.build(body=bomb.body))
    log_in(page, viewer)

    response = page.goto(f"/messages/{stored.pk}/")

    assert response is not None and response.ok
    assert len(response.body()) < 5 * 1024 * 1024
    notice = page.get_by_test_id("payload-shown")
    expect(notice).to_contain_text("shown as text: nested deeper than 100 levels")
    expect(page.get_by_test_id("payload")).to_contain_text("[" * 900 + "0,0,0")
    with page.expect_download() as download:
        notice.get_by_role("link", name="download raw").click()
    assert download.value.suggested_filename == f"dead-letter-{stored.pk}.bin"
    with open(download.value.path(), "rb") as raw:
        assert raw.read() == bomb.body
    assert watched.page_errors == []
