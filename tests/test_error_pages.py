"""Error pages are console pages: the navigation, the reason, a phone's width; never a bare line of text."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client, override_settings

from tests.conftest import client_for

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]


def test_forbidden_page_says_which_role_is_needed_and_keeps_the_navigation(viewer: User) -> None:
    response = client_for(viewer).get("/alerts/rules/")

    html = response.content.decode()
    assert response.status_code == 403
    assert "This needs the admin role." in html and "Nothing was changed." in html
    assert 'name="viewport"' in html and 'href="/patterns/"' in html


def test_not_found_page_names_the_address_and_keeps_the_navigation(viewer: User) -> None:
    response = client_for(viewer).get("/messages/987654321/")

    html = response.content.decode()
    assert response.status_code == 404
    assert "/messages/987654321/" in html and 'name="viewport"' in html and 'href="/messages/"' in html


@override_settings(DATA_UPLOAD_MAX_NUMBER_FIELDS=5)
def test_bad_request_page_is_a_console_page(operator: User) -> None:
    response = client_for(operator).post("/patterns/merge/", {f"field{index}": "x" for index in range(10)})

    html = response.content.decode()
    assert response.status_code == 400
    assert "Bad request" in html and "Nothing was changed." in html and 'name="viewport"' in html


def test_a_form_with_an_out_of_date_token_gets_a_console_page(operator: User) -> None:
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(operator)

    response = strict.post("/patterns/merge/", {"csrfmiddlewaretoken": "x" * 64, "target": "1"})

    html = response.content.decode()
    assert response.status_code == 403
    assert "Form expired" in html and "Nothing was changed." in html
    assert 'name="viewport"' in html and 'href="/patterns/"' in html


def test_back_onto_the_merge_preview_goes_to_the_patterns_page(operator: User) -> None:
    response = client_for(operator).get("/patterns/merge/", follow=True)

    assert response.redirect_chain == [("/patterns/", 302)]
    assert "Tick the patterns to merge again" in response.content.decode()


def test_a_viewer_cannot_reach_the_merge_even_by_get(viewer: User) -> None:
    assert client_for(viewer).get("/patterns/merge/").status_code == 403


def test_signed_out_merge_get_goes_to_the_login() -> None:
    assert Client().get("/patterns/merge/")["Location"].startswith("/login/")


def test_template_comments_never_reach_the_page(viewer: User) -> None:
    # Django's {# #} comment is one line only; a longer one is printed as text.
    html = client_for(viewer).get("/").content.decode()

    assert "{#" not in html and "#}" not in html and "{% comment" not in html


@override_settings(ALLOWED_HOSTS=["console.example"])
def test_a_bad_host_header_gets_the_400_page_not_a_server_error() -> None:
    response = Client(raise_request_exception=False).get("/", headers={"Host": "evil.example"})

    assert response.status_code == 400 and "Bad request" in response.content.decode()
