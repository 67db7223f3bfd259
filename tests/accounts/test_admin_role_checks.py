"""The Django admin checks the console's roles, not only Django's model permissions: a viewer or operator who was
given staff access and model permissions (by hand, or every permission at once) still cannot change what their
role may not change on the console's pages (rules, channels, users and groups: admins), nor read channel targets
or sign-in audit rows."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.test import Client
from django.urls import reverse

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.accounts.services import record_audit
from dlqconsole.alerts.models import AlertRule, Channel
from dlqconsole.deadletters.models import FailurePattern
from tests.factories import EnvelopeFactory, store

pytestmark = [pytest.mark.django_db]


def staff_with_every_permission(user: User) -> Client:
    user.is_staff = True
    user.save()
    user.user_permissions.set(Permission.objects.all())
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.parametrize("role", ["viewer", "operator"])
def test_a_staff_viewer_or_operator_cannot_write_rules_channels_users_or_groups(
    role: str, viewer: User, operator: User
) -> None:
    user = viewer if role == "viewer" else operator
    client = staff_with_every_permission(user)
    rule = AlertRule.objects.first()
    assert rule is not None
    channel = Channel.objects.create(name="ops", kind="webhook", target="https://hooks.example.com/secret-token")

    pages = [
        reverse("admin:alerts_alertrule_add"),
        reverse("admin:alerts_alertrule_delete", args=[rule.pk]),
        reverse("admin:alerts_channel_add"),
        reverse("admin:alerts_channel_change", args=[channel.pk]),
        reverse("admin:auth_user_add"),
        reverse("admin:auth_group_add"),
    ]
    for page in pages:
        assert client.get(page).status_code == 403, page
    # A rule can be read (its change page shows it without a Save button); a save is refused.
    assert client.post(reverse("admin:alerts_alertrule_change", args=[rule.pk]), {"name": "renamed"}).status_code == 403
    assert AlertRule.objects.get(pk=rule.pk).name == rule.name
    assert client.post(reverse("admin:alerts_alertrule_delete", args=[rule.pk]), {"post": "yes"}).status_code == 403
    assert AlertRule.objects.filter(pk=rule.pk).exists()

    # Promoting oneself: the change form's POST is refused too.
    admin_group = Group.objects.get_or_create(name="admin")[0]
    response = client.post(
        reverse("admin:auth_user_change", args=[user.pk]),
        {
            "username": user.username,
            "groups": [admin_group.pk],
            "role": "admin",
            "is_active": "on",
            "is_staff": "on",
            "date_joined_0": "2026-01-01",
            "date_joined_1": "00:00:00",
        },
    )
    assert response.status_code == 403
    assert not user.groups.filter(name="admin").exists()
    # A channel's target (webhook URLs carry tokens) is for admins, as on the console's channel pages.
    assert "secret-token" not in client.get(reverse("admin:alerts_channel_changelist")).content.decode()


def test_a_staff_operator_still_triages_patterns_in_the_admin(operator: User) -> None:
    store(EnvelopeFactory.build())
    pattern = FailurePattern.objects.get()
    client = staff_with_every_permission(operator)

    assert client.get(reverse("admin:deadletters_failurepattern_change", args=[pattern.pk])).status_code == 200


def test_sign_in_audit_rows_stay_out_of_a_staff_viewers_admin(viewer: User, admin_user: User) -> None:
    record_audit(actor=None, action="accounts.login.failed", target="hunter2-typed-as-a-name")
    record_audit(actor=None, action="pattern.status", target="pattern #1")
    client = staff_with_every_permission(viewer)

    html = client.get(reverse("admin:accounts_auditentry_changelist")).content.decode()

    assert "pattern.status" in html and "hunter2" not in html
    entry = AuditEntry.objects.get(action="accounts.login.failed")
    assert client.get(reverse("admin:accounts_auditentry_change", args=[entry.pk])).status_code in (302, 404)
    admin_client = staff_with_every_permission(admin_user)
    assert "hunter2" in admin_client.get(reverse("admin:accounts_auditentry_changelist")).content.decode()
