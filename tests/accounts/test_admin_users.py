"""Users in the Django admin are managed by role: the user form shows the console role (viewer, operator, admin) and
none of Django's staff flag, superuser flag, groups or per-user permissions, which the console does not read for
roles; the user list shows each user's role; a role change is audited and only admins make one."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.urls import reverse

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.accounts.roles import role_of
from tests.conftest import client_for

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]

JOINED = {"date_joined_0": "2026-01-01", "date_joined_1": "00:00:00"}


def change(client: Client, user: User, **fields: str) -> int:
    data = {"username": user.username, "is_active": "on", **JOINED, **fields}
    return client.post(reverse("admin:auth_user_change", args=[user.pk]), data).status_code


def reloaded(user: User) -> User:
    # A fresh object: role_of keeps the role it found on the object it was given.
    return User.objects.get(pk=user.pk)


def test_the_user_form_shows_the_role_and_none_of_what_the_console_ignores(admin_user: User, viewer: User) -> None:
    html = client_for(admin_user).get(reverse("admin:auth_user_change", args=[viewer.pk])).content.decode()

    assert 'name="role"' in html and '<option value="viewer" selected>' in html
    for ignored in ("is_staff", "is_superuser", "groups", "user_permissions"):
        assert f'name="{ignored}"' not in html


def test_an_admin_changes_a_role_and_the_change_is_audited_with_the_new_role(admin_user: User, viewer: User) -> None:
    oncall = Group.objects.create(name="oncall")
    viewer.groups.add(oncall)

    assert change(client_for(admin_user), viewer, role="operator") == 302

    assert role_of(reloaded(viewer)) == "operator"
    # The other role group goes, a group that is no role stays.
    assert set(viewer.groups.values_list("name", flat=True)) == {"operator", "oncall"}
    entry = AuditEntry.objects.get(action="admin.auth.user.change")
    assert entry.actor == admin_user and entry.target == f"user:{viewer.pk}"
    assert "Changed Role" in entry.detail and "role=operator" in entry.detail


def test_saving_a_user_without_a_role_group_makes_them_a_viewer_on_record(admin_user: User) -> None:
    nobody = User.objects.create_user("nora-norole", password="pw-nora")

    assert change(client_for(admin_user), nobody, role="viewer") == 302

    assert list(nobody.groups.values_list("name", flat=True)) == ["viewer"]
    assert "role=viewer" in AuditEntry.objects.get(action="admin.auth.user.change").detail


def test_adding_a_user_gives_them_the_role_chosen(admin_user: User) -> None:
    response = client_for(admin_user).post(
        reverse("admin:auth_user_add"),
        {
            "username": "newbie",
            "usable_password": "true",
            "password1": "Long-pass-4711",
            "password2": "Long-pass-4711",
            "role": "operator",
        },
    )

    assert response.status_code == 302
    assert role_of(User.objects.get(username="newbie")) == "operator"
    assert "role=operator" in AuditEntry.objects.get(action="admin.auth.user.add").detail


def test_the_user_list_shows_each_users_role(admin_user: User, operator: User, viewer: User) -> None:
    nobody = User.objects.create_user("nora-norole", password="pw-nora")
    root = User.objects.create_superuser("root", password="pw-root")

    html = client_for(admin_user).get(reverse("admin:auth_user_changelist")).content.decode()

    def role_cell(user: User) -> str:
        row = html.split(f'href="/admin/auth/user/{user.pk}/change/"', 1)[1].split("</tr>", 1)[0]
        return row.split('class="field-role">', 1)[1].split("<", 1)[0]

    assert [role_cell(user) for user in (admin_user, operator, viewer, nobody, root)] == [
        "admin",
        "operator",
        "viewer",
        "viewer (no role)",
        "admin (superuser)",
    ]
    assert "Staff status" not in html


def test_the_user_list_filters_by_role(admin_user: User, operator: User, viewer: User) -> None:
    nobody = User.objects.create_user("nora-norole", password="pw-nora")
    root = User.objects.create_superuser("root", password="pw-root")
    client = client_for(admin_user)

    def listed(role: str) -> set[str]:
        html = client.get(reverse("admin:auth_user_changelist"), {"role": role}).content.decode()
        users = (admin_user, operator, viewer, nobody, root)
        return {user.username for user in users if f'href="/admin/auth/user/{user.pk}/change/?' in html}

    assert listed("viewer") == {viewer.username, nobody.username}
    assert listed("operator") == {operator.username}
    assert listed("admin") == {admin_user.username, root.username}


def test_a_superusers_role_is_shown_and_not_changed_by_the_form(admin_user: User) -> None:
    root = User.objects.create_superuser("root", password="pw-root")
    client = client_for(admin_user)

    html = client.get(reverse("admin:auth_user_change", args=[root.pk])).content.decode()
    status = change(client, root, role="viewer")

    assert "superuser" in html and 'name="role"' in html and "disabled" in html.split('name="role"', 1)[1][:200]
    assert status == 302
    root.refresh_from_db()
    assert root.is_superuser and role_of(reloaded(root)) == "admin"
    assert not root.groups.filter(name="viewer").exists()


def test_an_operator_cannot_give_themselves_a_role(operator: User) -> None:
    assert change(client_for(operator), operator, role="admin") == 403

    assert role_of(reloaded(operator)) == "operator"


def test_the_last_active_admin_cannot_be_demoted_or_deactivated(admin_user: User, viewer: User) -> None:
    client = client_for(admin_user)

    demoted = client.post(
        reverse("admin:auth_user_change", args=[admin_user.pk]),
        {"username": admin_user.username, "is_active": "on", **JOINED, "role": "operator"},
    )
    deactivated = client.post(
        reverse("admin:auth_user_change", args=[admin_user.pk]),
        {"username": admin_user.username, **JOINED, "role": "admin"},
    )

    for response in (demoted, deactivated):
        assert response.status_code == 200
        assert "is the last active admin" in response.content.decode()
    admin_user.refresh_from_db()
    assert admin_user.is_active and role_of(reloaded(admin_user)) == "admin"
    assert not AuditEntry.objects.filter(action="admin.auth.user.change").exists()


def test_an_admin_can_be_demoted_once_another_is_active(admin_user: User, viewer: User) -> None:
    client = client_for(admin_user)
    assert change(client, viewer, role="admin") == 302

    assert change(client, admin_user, role="operator") == 302

    assert role_of(reloaded(admin_user)) == "operator"


def test_deleting_the_last_active_admin_is_refused(admin_user: User, viewer: User) -> None:
    root = User.objects.create_superuser("root", password="pw-root", is_active=False)
    client = client_for(admin_user)
    url = reverse("admin:auth_user_delete", args=[admin_user.pk])

    page = client.get(url).content.decode()
    response = client.post(url, {"post": "yes"})

    assert "the last active admin" in page
    assert response.status_code == 200 and "the last active admin" in response.content.decode()
    assert User.objects.filter(pk=admin_user.pk).exists()
    # With another active admin, the same delete goes through.
    root.is_active = True
    root.save()
    assert client.post(url, {"post": "yes"}).status_code == 302
    assert not User.objects.filter(pk=admin_user.pk).exists()
