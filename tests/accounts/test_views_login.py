"""Signing in and out, and the role shown in the header."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from tests.conftest import client_for

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]


def test_login_page_renders_without_a_session(client: Client) -> None:
    response = client.get("/login/")

    assert response.status_code == 200
    assert 'name="username"' in response.content.decode() and "csrfmiddlewaretoken" in response.content.decode()


def test_login_needs_the_csrf_token() -> None:
    User.objects.create_user(username="carol", password="pw-carol-123")
    strict = Client(enforce_csrf_checks=True)

    response = strict.post("/login/", {"username": "carol", "password": "pw-carol-123"})

    assert response.status_code == 403


def test_login_with_the_right_password_lands_on_the_page_asked_for(client: Client, viewer: User) -> None:
    response = client.post("/login/", {"username": viewer.username, "password": "pw-vera-viewer", "next": "/patterns/"})

    assert response.status_code == 302 and response["Location"] == "/patterns/"
    assert "vera-viewer · viewer" in client.get("/patterns/").content.decode()


def test_login_with_a_wrong_password_is_refused(client: Client, viewer: User) -> None:
    response = client.post("/login/", {"username": viewer.username, "password": "nope"})

    assert response.status_code == 200
    assert client.get("/").status_code == 302
    # Shown as an error, and announced to a screen reader.
    assert (
        '<p class="error-box" role="alert">Please enter a correct username and password.' in response.content.decode()
    )


def test_sign_out_is_a_post_and_ends_the_session(client: Client, operator: User) -> None:
    client.force_login(operator)

    assert "otto-operator · operator" in client.get("/").content.decode()
    assert client.post("/logout/").status_code == 302
    assert client.get("/").status_code == 302


def test_signing_out_lands_on_the_login_page_saying_so(viewer: User) -> None:
    client = client_for(viewer)

    response = client.post(reverse("logout"), follow=True)

    assert response.redirect_chain[-1][0] == reverse("login")
    assert "Signed out." in response.content.decode()
    assert client.get("/").status_code == 302
