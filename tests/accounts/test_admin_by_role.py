"""The Django admin is entered by role, not by Django's staff flag: every console role signs in there, and what it
sees and changes follows the role (viewer reads, operator triages patterns, admin configures and manages users),
with no per-user model permissions to keep in step."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.deadletters.models import FailurePattern
from dlqconsole.operations.models import RetryPolicy
from tests.conftest import client_for
from tests.factories import many

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]


def status(client: Client, name: str, *args: object) -> int:
    return client.get(reverse(name, args=args)).status_code


def test_an_admin_without_the_staff_flag_configures_and_manages_users(admin_user: User) -> None:
    assert not admin_user.is_staff
    client = client_for(admin_user)

    assert status(client, "admin:index") == 200
    assert status(client, "admin:auth_user_changelist") == 200
    assert status(client, "admin:alerts_channel_changelist") == 200
    response = client.post(
        reverse("admin:operations_retrypolicy_add"),
        {
            "name": "orders timeouts",
            "queue": "orders.dlq",
            "delays": "60, 300",
            "max_attempts": 3,
            "enabled": "on",
        },
    )

    assert response.status_code == 302, response.content.decode()[:2000]
    assert RetryPolicy.objects.get(name="orders timeouts").delays == [60, 300]
    assert AuditEntry.objects.filter(action="retrypolicy.add", actor=admin_user).exists()


def test_an_operator_without_the_staff_flag_reads_and_triages_but_configures_nothing(operator: User) -> None:
    pattern = FailurePattern.objects.get(pk=many(2, queue="orders")[0].pattern_id)
    client = client_for(operator)

    assert status(client, "admin:index") == 200
    assert status(client, "admin:deadletters_deadletter_changelist") == 200
    assert status(client, "admin:deadletters_failurepattern_change", pattern.pk) == 200
    assert status(client, "admin:operations_retrypolicy_add") == 403
    assert status(client, "admin:auth_user_changelist") == 403
    assert status(client, "admin:alerts_channel_changelist") == 403
    # Alert rules are the admin role's, as on the console's rule pages: not even listed.
    assert status(client, "admin:alerts_alertrule_changelist") == 403
    assert status(client, "alerts:rules") == 403
    assert "Alert rules" not in client.get(reverse("admin:index")).content.decode()


def test_a_viewer_without_the_staff_flag_reads_only(viewer: User) -> None:
    pattern = FailurePattern.objects.get(pk=many(1, queue="orders")[0].pattern_id)
    client = client_for(viewer)

    assert status(client, "admin:index") == 200
    assert status(client, "admin:deadletters_deadletter_changelist") == 200
    response = client.post(
        reverse("admin:deadletters_failurepattern_change", args=[pattern.pk]), {"status": "ignored", "note": "x"}
    )
    assert response.status_code == 403
    pattern.refresh_from_db()
    assert pattern.status == "open"
    assert status(client, "admin:alerts_alertrule_add") == 403
    assert status(client, "admin:auth_user_changelist") == 403
    assert status(client, "admin:auth_group_changelist") == 403


@pytest.mark.parametrize("role", ["viewer", "operator", "admin"])
def test_every_role_signs_in_on_the_admin_login_page(role: str, viewer: User, operator: User, admin_user: User) -> None:
    # A session that expired on an admin page sends the user to /admin/login/: Django's own admin login form
    # refuses anyone without the staff flag, which would lock every console role out there.
    user = {"viewer": viewer, "operator": operator, "admin": admin_user}[role]
    assert not user.is_staff
    client = Client()

    response = client.post(
        reverse("admin:login") + "?next=" + reverse("admin:index"),
        {"username": user.username, "password": "pw-" + user.username, "next": reverse("admin:index")},
    )

    assert response.status_code == 302 and response["Location"] == reverse("admin:index")
    assert client.get(reverse("admin:index")).status_code == 200
    assert AuditEntry.objects.filter(action="accounts.login", actor=user).exists()


def test_the_admin_login_page_refuses_a_wrong_password_without_speaking_of_staff(viewer: User) -> None:
    response = Client().post(reverse("admin:login"), {"username": viewer.username, "password": "wrong"})

    assert response.status_code == 200
    assert "_auth_user_id" not in response.wsgi_request.session
    assert "correct username and password" in response.content.decode()
    assert "staff" not in response.content.decode()


def test_an_inactive_user_or_nobody_is_sent_to_the_admin_login(viewer: User) -> None:
    viewer.is_active = False
    viewer.save()

    for client in (Client(), client_for(viewer)):
        response = client.get(reverse("admin:index"))
        assert response.status_code == 302 and response["Location"].startswith(reverse("admin:login"))


@pytest.mark.parametrize(
    ("role", "offered"),
    [
        ("viewer", []),
        ("operator", ["retry_selected", "move_selected", "archive_selected", "restore_selected"]),
        ("admin", ["retry_selected", "move_selected", "archive_selected", "restore_selected", "purge_selected"]),
    ],
)
def test_the_dead_letter_actions_offered_follow_the_role(
    role: str, offered: list[str], viewer: User, operator: User, admin_user: User
) -> None:
    many(1, queue="orders")
    user = {"viewer": viewer, "operator": operator, "admin": admin_user}[role]

    html = client_for(user).get(reverse("admin:deadletters_deadletter_changelist")).content.decode()

    assert re.findall(r'<option value="([a-z_]+_selected)"', html) == offered


def test_every_role_finds_the_admin_in_the_console_navigation(viewer: User) -> None:
    html = client_for(viewer).get("/").content.decode()

    assert f'<a href="{reverse("admin:index")}">Admin</a>' in html


def test_a_password_changed_in_the_admin_is_audited(viewer: User) -> None:
    # Every role now reaches the admin's own password change page: the change is an operation like any other.
    viewer.set_password("old-pass-123")
    viewer.save()
    client = client_for(viewer)

    response = client.post(
        reverse("admin:password_change"),
        {"old_password": "old-pass-123", "new_password1": "n3w-pass-456!", "new_password2": "n3w-pass-456!"},
    )
    refused = client.post(
        reverse("admin:password_change"),
        {"old_password": "wrong", "new_password1": "an0ther-pass!", "new_password2": "an0ther-pass!"},
    )

    assert response.status_code == 302 and refused.status_code == 200
    entry = AuditEntry.objects.get(action="accounts.password.change")
    assert (entry.actor, entry.target) == (viewer, f"user:{viewer.username}")
    assert "n3w-pass" not in entry.detail
