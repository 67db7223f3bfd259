"""The audit rows of sign-ins (accounts.login, .failed, .refused) are for admins only: a failed sign-in records
the user name typed, often a password typed into the wrong field, and where people sign in from. Viewers and
operators see neither the rows nor their actions among the filter's choices."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.accounts.services import record_audit
from tests.conftest import client_for

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]

TYPED_PASSWORD = "correct-horse-battery-staple"


@pytest.fixture
def sign_in_rows(viewer: User, operator: User) -> None:
    # A password typed into the user name field, then the right sign-in.
    Client(REMOTE_ADDR="10.4.4.4").post("/login/", {"username": TYPED_PASSWORD, "password": "x"})
    Client(REMOTE_ADDR="10.4.4.4").post("/login/", {"username": viewer.username, "password": "pw-vera-viewer"})
    record_audit(actor=operator, action="pattern.merge", target="pattern #7", detail="merged #3 into #7")
    assert set(AuditEntry.objects.values_list("action", flat=True)) == {
        "accounts.login.failed",
        "accounts.login",
        "pattern.merge",
    }


@pytest.mark.parametrize("role", ["viewer", "operator"])
@pytest.mark.usefixtures("sign_in_rows")
def test_viewers_and_operators_do_not_see_sign_in_rows(role: str, request: pytest.FixtureRequest) -> None:
    client = client_for(request.getfixturevalue(role))

    html = client.get("/audit/").content.decode()
    assert TYPED_PASSWORD not in html and "10.4.4.4" not in html and "accounts.login" not in html
    for query in ("?action=accounts.login", "?actor=anonymous", f"?target={TYPED_PASSWORD}"):
        response = client.get(f"/audit/{query}")
        assert response.context["entries"] == []
        assert "10.4.4.4" not in response.content.decode()
    assert "pattern.merge" in client.get("/audit/").content.decode()


@pytest.mark.usefixtures("sign_in_rows")
def test_admins_see_sign_in_rows_with_the_name_tried(admin_user: User) -> None:
    html = client_for(admin_user).get("/audit/").content.decode()

    assert f"user:{TYPED_PASSWORD}" in html and "10.4.4.4" in html
    assert '<option value="accounts.login.failed">' in html and "pattern.merge" in html
