"""Personal tokens through the API: who they act as, when they stop, and how changes name them."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from rest_framework.test import APIClient

from dlqconsole.accounts.models import ApiToken, AuditEntry
from dlqconsole.accounts.services import record_audit, set_role
from dlqconsole.accounts.tokens import create_token, digest, revoke_tokens
from tests.api.conftest import api_client, token_for

pytestmark = pytest.mark.django_db


def test_anonymous_gets_401_json_with_the_scheme() -> None:
    response = api_client().get("/api/v1/")
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert response.json()["detail"]


def test_a_token_acts_as_its_user_with_the_current_role(operator: User) -> None:
    client = api_client(token_for(operator))
    assert client.get("/api/v1/").json()["role"] == "operator"
    set_role(user=operator, role="viewer")
    assert client.get("/api/v1/").json()["role"] == "viewer"


def test_only_the_hash_is_kept(viewer: User) -> None:
    token, plaintext = create_token(user=viewer, name="ci")
    stored = ApiToken.objects.get(pk=token.pk)
    assert plaintext not in {stored.prefix, stored.digest, stored.name}
    assert stored.digest == digest(plaintext)
    assert api_client(plaintext).get("/api/v1/").status_code == 200


@pytest.mark.parametrize(
    "spoil",
    [
        lambda token, user: revoke_tokens([token], actor=user),
        lambda token, user: ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now()),
        lambda token, user: User.objects.filter(pk=user.pk).update(is_active=False),
    ],
    ids=["revoked", "expired", "user-deactivated"],
)
def test_a_stopped_token_gets_401(viewer: User, spoil: Callable[[ApiToken, User], object]) -> None:
    token, plaintext = create_token(user=viewer, name="ci", expires_at=timezone.now() + dt.timedelta(days=1))
    client = api_client(plaintext)
    assert client.get("/api/v1/").status_code == 200
    spoil(token, viewer)
    response = client.get("/api/v1/")
    assert response.status_code == 401
    assert response.json()["code"] == "authentication_failed"


@pytest.mark.parametrize("header", ["Bearer dlq_nothing", "Bearer", "Bearer a b", "Token dlq_00000000_" + "x" * 43])
def test_a_bad_token_gets_401(header: str) -> None:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)
    assert client.get("/api/v1/").status_code == 401


def test_last_used_is_written(viewer: User) -> None:
    token, plaintext = create_token(user=viewer, name="ci")
    assert token.last_used_at is None
    api_client(plaintext).get("/api/v1/")
    token.refresh_from_db()
    assert token.last_used_at is not None


def test_unknown_api_paths_are_json_404(viewer: User) -> None:
    for client in (api_client(), api_client(token_for(viewer))):
        response = client.get("/api/v1/no-such-thing/")
        assert response.status_code == 404
        assert response["Content-Type"] == "application/json"
        assert "/api/v1/docs/" in response.json()["detail"]


def test_the_rate_is_per_token_with_retry_after(viewer: User, settings: object) -> None:
    settings.DLQ_API_TOKEN_RATE = "2/1h"  # type: ignore[attr-defined]
    first, second = api_client(token_for(viewer, "one")), api_client(token_for(viewer, "two"))
    assert first.get("/api/v1/").status_code == 200
    refused = first.get("/api/v1/")
    assert refused.status_code == 429
    assert int(refused["Retry-After"]) > 1000
    assert refused.json()["code"] == "throttled"
    assert second.get("/api/v1/").status_code == 200


def test_audit_rows_written_during_a_token_request_name_the_token(operator: User) -> None:
    record_audit(actor=operator, action="outside")
    assert AuditEntry.objects.get(action="outside").via == ""


def test_the_token_is_named_only_inside_its_request(operator: User) -> None:
    """The scope closes when the request ends, even when it ends in an unexpected error."""
    from dlqconsole.accounts.services import _via
    from dlqconsole.api.base import ApiView

    class Boom(ApiView):
        def post(self, request: object) -> None:
            record_audit(actor=operator, action="inside")
            raise RuntimeError("unexpected")

    token, plaintext = create_token(user=operator, name="boom")
    from rest_framework.test import APIRequestFactory

    request = APIRequestFactory().post("/api/v1/boom/", {}, format="json", HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    with pytest.raises(RuntimeError):
        Boom.as_view()(request)
    assert _via.get() == ""
    assert AuditEntry.objects.get(action="inside").via == f"API token boom (dlq_{token.prefix})"
    record_audit(actor=operator, action="after")
    assert AuditEntry.objects.get(action="after").via == ""


def test_a_read_only_token_reads_and_changes_nothing(admin_user: User) -> None:
    _, plaintext = create_token(user=admin_user, name="dashboard", read_only=True)
    client = api_client(plaintext)
    root = client.get("/api/v1/").json()
    assert root["role"] == "admin"
    assert root["token"] == {
        "name": "dashboard",
        "prefix": f"dlq_{plaintext[4:12]}",
        "read_only": True,
        "expires_at": None,
    }
    refused = client.post("/api/v1/patterns/merge/", {"target": 1, "sources": [2]}, format="json")
    assert refused.status_code == 403
    assert refused.json()["detail"] == "This API token is read-only."


def test_a_new_token_may_take_the_name_of_an_expired_one(viewer: User) -> None:
    old, _ = create_token(user=viewer, name="nightly", expires_at=timezone.now() + dt.timedelta(days=1))
    ApiToken.objects.filter(pk=old.pk).update(expires_at=timezone.now() - dt.timedelta(seconds=1))

    new, plaintext = create_token(user=viewer, name="nightly")

    old.refresh_from_db()
    assert old.state() == "revoked" and new.state() == "active"
    assert api_client(plaintext).get("/api/v1/").status_code == 200
    assert AuditEntry.objects.filter(action="accounts.token.revoke", detail__contains=old.prefix).exists()
