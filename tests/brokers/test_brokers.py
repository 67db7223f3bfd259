"""Brokers: DLQ_BROKERS, credentials encrypted at rest and never shown back, the admin (roles, the environment's
brokers read-only, the outbound guard on the management URL)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.core.exceptions import ImproperlyConfigured
from django.test import Client
from django.urls import reverse
from django.views.debug import get_default_exception_reporter_filter

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.brokers import registry, secrets
from dlqconsole.brokers.models import Broker
from dlqconsole.brokers.services import set_urls
from dlqconsole.core.broker_urls import without_password
from dlqconsole.core.env import env_mapping
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db
PASSWORD = "s3cret-Pa55"
URL = f"amqp://ops:{PASSWORD}@127.0.0.1:5672/staging"


def staff(client: Client, role: str) -> Client:
    user = UserFactory.create(username=f"staff-{role}", is_staff=True, role=role)
    user.user_permissions.add(*Permission.objects.filter(codename__endswith="_broker"))
    client.force_login(user)
    return client


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ("staging", "has no value"),
        ("staging=", "has no value"),
        ("bad name=amqp://x", "not a valid name"),
        ("a=amqp://x;a=amqp://y", "names 'a' twice"),
    ],
)
def test_dlq_brokers_refuses_what_it_cannot_read(raw: str, problem: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DLQ_BROKERS", raw)
    with pytest.raises(ImproperlyConfigured, match=problem):
        env_mapping("DLQ_BROKERS", name_pattern=r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def test_dlq_brokers_reads_several(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DLQ_BROKERS", " staging=amqp://a/s ; eu-west.2=amqps://b/%2F;")
    assert env_mapping("DLQ_BROKERS", name_pattern=r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}") == {
        "staging": "amqp://a/s",
        "eu-west.2": "amqps://b/%2F",
    }


def test_the_shown_url_keeps_the_user_and_drops_password_and_query() -> None:
    assert without_password(URL + "?heartbeat=5") == "amqp://ops@127.0.0.1:5672/staging"
    assert without_password("not a url") == "(not a URL)"


def test_credentials_round_trip_rotate_and_refuse_a_wrong_key(settings: Any) -> None:
    settings.DLQ_CREDENTIALS_KEY = "old key"
    token = secrets.encrypt(URL)
    assert PASSWORD not in token
    settings.DLQ_CREDENTIALS_KEY = "new key,old key"
    assert secrets.decrypt(token) == URL
    rotated = secrets.rotate(token)
    settings.DLQ_CREDENTIALS_KEY = "new key"
    assert secrets.decrypt(rotated) == URL
    with pytest.raises(secrets.CredentialsError, match="do not decrypt"):
        secrets.decrypt(token)
    settings.DLQ_CREDENTIALS_KEY = ""
    with pytest.raises(secrets.CredentialsError, match="DLQ_CREDENTIALS_KEY is not set"):
        secrets.encrypt(URL)


def test_environment_brokers_are_synced_and_a_process_without_one_leaves_it_alone(settings: Any) -> None:
    settings.DLQ_BROKERS = {"staging": URL}
    registry.forget()
    assert [broker.name for broker in registry.brokers()] == ["default", "staging"]
    staging = registry.get("staging")
    assert (staging.managed, staging.url, staging.url_secret) == (True, "amqp://ops@127.0.0.1:5672/staging", "")
    assert registry.amqp_url(staging) == URL

    # A process started without DLQ_BROKERS (a shell beside the running console) neither disables the broker for
    # the others nor tries to reach it.
    settings.DLQ_BROKERS = {}
    registry.forget()
    assert [broker.name for broker in registry.brokers()] == ["default"]
    staging.refresh_from_db()
    assert (staging.managed, staging.enabled) == (True, True)
    with pytest.raises(registry.NoUrl, match="give every console process the same DLQ_BROKERS"):
        registry.amqp_url(staging)


def test_dlq_brokers_never_takes_over_a_broker_added_in_the_admin(
    settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    settings.DLQ_CREDENTIALS_KEY = "the key"
    added = Broker(name="staging")
    set_urls(added, amqp_url=URL)
    added.save()
    settings.DLQ_BROKERS = {"staging": "amqp://guest:guest@127.0.0.1:5672/other"}
    registry.forget()

    assert registry.amqp_url(registry.get("staging")) == URL
    added.refresh_from_db()
    assert (added.managed, added.url_secret != "") == (False, True)
    assert "DLQ_BROKERS names staging, a broker added in the admin" in caplog.text


def test_a_broker_with_no_stored_url_says_so() -> None:
    bare = Broker.objects.create(name="bare", url="amqp://ops@mq/x")
    with pytest.raises(registry.NoUrl, match="broker bare has no stored AMQP URL"):
        registry.connect(bare)


def test_an_admin_adds_a_broker_whose_password_is_never_shown_back(client: Client, settings: Any) -> None:
    settings.DLQ_CREDENTIALS_KEY = "the key"
    admin = staff(client, "admin")

    response = admin.post(
        reverse("admin:brokers_broker_add"),
        {
            "name": "staging",
            "amqp_url": URL,
            "management_url": "",
            "tls_ca_certificate": "",
            "tls_verify": "on",
            "enabled": "on",
        },
    )

    assert response.status_code == 302, response.content.decode()[:2000]
    broker = Broker.objects.get(name="staging")
    assert broker.url == "amqp://ops@127.0.0.1:5672/staging"
    assert registry.amqp_url(broker) == URL
    assert PASSWORD not in broker.url_secret
    for page in (
        reverse("admin:brokers_broker_changelist"),
        reverse("admin:brokers_broker_change", args=[broker.pk]),
    ):
        html = admin.get(page).content.decode()
        assert PASSWORD not in html and "amqp://ops@127.0.0.1:5672/staging" in html
    entry = AuditEntry.objects.get(action="admin.brokers.broker.add")
    assert PASSWORD not in f"{entry.detail} {entry.target} {entry.filter}"

    # Saved again with the URL field left empty: the stored URL stays.
    admin.post(
        reverse("admin:brokers_broker_change", args=[broker.pk]),
        {"amqp_url": "", "management_url": "", "tls_ca_certificate": "", "enabled": "on"},
    )
    broker.refresh_from_db()
    assert (registry.amqp_url(broker), broker.tls_verify) == (URL, False)


def test_without_a_credentials_key_the_form_says_what_to_set(client: Client, settings: Any) -> None:
    settings.DLQ_CREDENTIALS_KEY = ""
    response = staff(client, "admin").post(
        reverse("admin:brokers_broker_add"), {"name": "staging", "amqp_url": URL, "enabled": "on"}
    )
    assert response.status_code == 200
    assert "DLQ_CREDENTIALS_KEY is not set" in response.content.decode()
    assert not Broker.objects.filter(name="staging").exists()


def test_a_management_url_to_a_denied_address_is_refused(client: Client, settings: Any) -> None:
    settings.DLQ_CREDENTIALS_KEY = "the key"
    response = staff(client, "admin").post(
        reverse("admin:brokers_broker_add"),
        {"name": "staging", "amqp_url": URL, "management_url": "http://u:p@169.254.169.254/", "enabled": "on"},
    )
    assert response.status_code == 200
    assert "Refused" in response.content.decode()
    assert not Broker.objects.filter(name="staging").exists()


def test_the_environments_brokers_are_read_only_and_kept(client: Client) -> None:
    default = registry.default_broker()
    admin = staff(client, "admin")
    change = reverse("admin:brokers_broker_change", args=[default.pk])

    assert admin.get(change).status_code == 200
    assert admin.post(change, {"enabled": ""}).status_code == 403
    assert admin.post(reverse("admin:brokers_broker_delete", args=[default.pk]), {"post": "yes"}).status_code == 403
    default.refresh_from_db()
    assert default.enabled


def test_an_operator_cannot_add_a_broker(client: Client, settings: Any) -> None:
    settings.DLQ_CREDENTIALS_KEY = "the key"
    response = staff(client, "operator").post(
        reverse("admin:brokers_broker_add"), {"name": "staging", "amqp_url": URL, "enabled": "on"}
    )
    assert response.status_code == 403
    assert not Broker.objects.filter(name="staging").exists()


def test_error_reports_hide_broker_urls(settings: Any) -> None:
    settings.DLQ_BROKERS = {"staging": URL}
    shown = get_default_exception_reporter_filter().get_safe_settings()
    assert PASSWORD not in repr(shown["DLQ_BROKERS"]) and PASSWORD not in repr(shown)
    assert shown["AMQP_URL"] == shown["DLQ_BROKERS"] == "********************"
