"""Custom fingerprint rules edited in the admin: through the services, audited, for admins only."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.deadletters.models import FingerprintRule
from tests.deadletters.conftest import Ingest
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def staff(client: Client, role: str) -> Client:
    user = UserFactory.create(username=f"staff-{role}", is_staff=True, role=role)
    user.user_permissions.add(*Permission.objects.filter(codename__endswith="_fingerprintrule"))
    client.force_login(user)
    return client


def test_admin_adds_a_rule_that_files_new_arrivals_and_is_audited(client: Client, ingest: Ingest) -> None:
    admin = staff(client, "admin")

    response = admin.post(
        reverse("admin:deadletters_fingerprintrule_add"),
        {"name": "Legacy ERP down", "regex": "legacy-erp", "header": "", "scope": "", "position": 10, "enabled": "on"},
    )

    assert response.status_code == 302
    rule = FingerprintRule.objects.get()
    assert rule.pattern is not None and rule.pattern.template == "Legacy ERP down"
    assert rule.created_by is not None and rule.created_by.username == "staff-admin"
    assert AuditEntry.objects.filter(action="fingerprint_rule.create", target=f"rule #{rule.pk}").exists()
    assert ingest("connect to legacy-erp.corp refused")[0].pattern_id == rule.pattern_id
    listing = admin.get(reverse("admin:deadletters_fingerprintrule_changelist"))
    assert listing.status_code == 200 and "Legacy ERP down" in listing.content.decode()


def test_admin_form_refuses_an_expression_that_does_not_compile(client: Client) -> None:
    admin = staff(client, "admin")

    response = admin.post(
        reverse("admin:deadletters_fingerprintrule_add"),
        {"name": "broken", "regex": "legacy-(erp", "header": "", "scope": "", "position": 10, "enabled": "on"},
    )

    assert response.status_code == 200
    assert "does not compile" in response.content.decode()
    assert not FingerprintRule.objects.exists()


def test_admin_edits_a_rule_keeping_its_name_and_refuses_a_taken_name(client: Client) -> None:
    admin = staff(client, "admin")
    form = {"name": "Disk", "regex": "disk full", "header": "", "scope": "", "position": 10, "enabled": "on"}
    admin.post(reverse("admin:deadletters_fingerprintrule_add"), form)
    admin.post(reverse("admin:deadletters_fingerprintrule_add"), {**form, "name": "Quota", "regex": "quota"})
    disk = FingerprintRule.objects.get(name="Disk")

    edited = admin.post(
        reverse("admin:deadletters_fingerprintrule_change", args=[disk.pk]), {**form, "regex": "disk (full|gone)"}
    )
    taken = admin.post(reverse("admin:deadletters_fingerprintrule_change", args=[disk.pk]), {**form, "name": "quota"})

    assert edited.status_code == 302
    disk.refresh_from_db()
    assert (disk.name, disk.regex) == ("Disk", "disk (full|gone)")
    assert taken.status_code == 200 and "is already named" in taken.content.decode()


def test_admin_deletes_a_rule_with_an_audit_row(client: Client) -> None:
    admin = staff(client, "admin")
    admin.post(
        reverse("admin:deadletters_fingerprintrule_add"),
        {"name": "Disk", "regex": "disk full", "header": "", "scope": "", "position": 10, "enabled": "on"},
    )
    rule = FingerprintRule.objects.get()

    response = admin.post(reverse("admin:deadletters_fingerprintrule_delete", args=[rule.pk]), {"post": "yes"})

    assert response.status_code == 302
    assert not FingerprintRule.objects.exists()
    assert AuditEntry.objects.filter(action="fingerprint_rule.delete").exists()


def test_operator_can_read_rules_but_not_add_them(client: Client) -> None:
    operator = staff(client, "operator")

    listing = operator.get(reverse("admin:deadletters_fingerprintrule_changelist"))
    refused = operator.post(
        reverse("admin:deadletters_fingerprintrule_add"),
        {"name": "x", "regex": "x", "header": "", "scope": "", "position": 1, "enabled": "on"},
    )

    assert listing.status_code == 200
    assert refused.status_code == 403
    assert not FingerprintRule.objects.exists()


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("name", "n" * 300, "Ensure this value has at most 200 characters (it has 300)."),
        ("regex", "r" * 1500, "Ensure this value has at most 1000 characters (it has 1500)."),
    ],
)
def test_admin_form_gives_one_reason_for_an_over_long_field(
    client: Client, field: str, value: str, message: str
) -> None:
    admin = staff(client, "admin")
    form = {"name": "Long", "regex": "long", "header": "", "scope": "", "position": 10, "enabled": "on"}

    response = admin.post(reverse("admin:deadletters_fingerprintrule_add"), {**form, field: value})

    page = response.content.decode()
    assert response.status_code == 200 and message in page
    assert "Give the rule a name" not in page and "needs a regular expression, a header, or both" not in page
    assert not FingerprintRule.objects.exists()
