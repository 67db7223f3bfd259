"""A lost login during an htmx request sends the whole window to the login page and back, instead of swapping
the login page into a fragment."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from tests.conftest import client_for

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]

HTMX = {"HX-Request": "true", "HX-Current-URL": "http://testserver/patterns/?status=open"}


def test_signed_out_htmx_poll_redirects_the_window_to_the_login_and_back() -> None:
    response = Client().get("/?fragment=panels", headers=HTMX)

    assert response.status_code == 200
    assert response["HX-Redirect"] == "/login/?next=%2Fpatterns%2F%3Fstatus%3Dopen"
    assert b"<form" not in response.content


def test_signed_out_htmx_post_is_not_acted_on_and_redirects_to_the_login(operator: User) -> None:
    client = client_for(operator)
    client.logout()

    response = client.post("/patterns/1/status/", {"status": "acknowledged"}, headers=HTMX)

    assert response["HX-Redirect"].startswith("/login/?next=")


def test_a_current_url_on_another_host_is_not_followed_after_login() -> None:
    response = Client().get("/", headers={"HX-Request": "true", "HX-Current-URL": "https://evil.example/phish"})

    assert response["HX-Redirect"] == "/login/?next=%2F"


def test_signed_out_full_page_still_gets_the_plain_redirect() -> None:
    response = Client().get("/patterns/")

    assert response.status_code == 302 and response["Location"].startswith("/login/?next=")


def test_signed_in_htmx_requests_are_untouched(viewer: User) -> None:
    response = client_for(viewer).get("/patterns/", headers=HTMX)

    assert response.status_code == 200 and "HX-Redirect" not in response
