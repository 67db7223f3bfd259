"""The helpers every app's views share: where a form may send the browser back to, ids read from an address,
keyset pages."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import RequestFactory

from dlqconsole.core.views import keyset_page, parse_id, safe_next


@pytest.mark.parametrize("target", ["/patterns/", "/patterns/?sort=total&status=open", "/alerts/12/#history"])
def test_a_path_on_this_site_is_where_a_form_returns(target: str) -> None:
    request = RequestFactory().post("/alerts/1/acknowledge/")

    assert safe_next(request, target) == target


@pytest.mark.parametrize(
    "target",
    [
        "",
        None,
        "patterns/",
        " /patterns/",
        "//evil.example/",
        "/\\evil.example/",
        "https://evil.example/",
        "javascript:alert(1)",
        # This site, but not as a path: an address that names a host or a scheme is refused even when they are
        # this site's, so that no form can send the browser from HTTPS to HTTP.
        "http://testserver/alerts/",
        "//testserver/alerts/",
    ],
)
def test_anything_but_a_path_on_this_site_is_refused(target: str | None) -> None:
    request = RequestFactory().post("/alerts/1/acknowledge/")

    assert safe_next(request, target) == ""


def test_a_path_is_kept_on_https_too() -> None:
    request = RequestFactory().post("/alerts/1/acknowledge/", secure=True)

    assert safe_next(request, "/alerts/") == "/alerts/"
    assert safe_next(request, "http://testserver/alerts/") == ""


@pytest.mark.parametrize(("value", "expected"), [("12", 12), ("1", 1), ("9" * 18, int("9" * 18))])
def test_an_id_is_read_from_ascii_digits(value: str, expected: int) -> None:
    assert parse_id(value) == expected


@pytest.mark.parametrize("value", [None, "", "0", "-1", "+1", " 1", "1_000", "1.0", "²", "١", "9" * 19, "12abc"])
def test_anything_else_is_no_id(value: str | None) -> None:
    assert parse_id(value) is None


@pytest.mark.django_db
@pytest.mark.sqlite
def test_keyset_pages_walk_older_and_back_newer() -> None:
    ids = [User.objects.create(username=f"user-{number}").pk for number in range(5)]
    users = User.objects.all()

    first, first_newer, first_older = keyset_page(users, size=2)
    second, second_newer, second_older = keyset_page(users, size=2, before=first[-1].pk)
    last, last_newer, last_older = keyset_page(users, size=2, before=second[-1].pk)
    back, back_newer, back_older = keyset_page(users, size=2, after=last[0].pk, columns=["username"])

    assert [user.pk for user in first] == ids[:2:-1] and (first_newer, first_older) == (False, True)
    assert [user.pk for user in second] == ids[2:0:-1] and (second_newer, second_older) == (True, True)
    assert [user.pk for user in last] == ids[:1] and (last_newer, last_older) == (True, False)
    assert back == second and (back_newer, back_older) == (True, True)
    assert [user.username for user in back] == ["user-2", "user-1"]
