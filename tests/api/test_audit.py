"""/api/v1/audit/: the audit log newest first, with the audit page's filter (the same parameters select the same
rows) and its rule that only admins read the sign-in rows."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from rest_framework.test import APIClient

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.accounts.services import acting_via, record_audit
from tests.conftest import client_for

pytestmark = pytest.mark.django_db

ApiFor = Callable[[User], APIClient]


def details(client: APIClient, **query: Any) -> list[str]:
    response = client.get("/api/v1/audit/", query)
    assert response.status_code == 200, response.json()
    return [row["detail"] for row in response.json()["results"] if row["action"] != "accounts.token.create"]


def test_an_entry_reads_as_the_page_shows_it(api_for: ApiFor, viewer: User, operator: User) -> None:
    with acting_via("API token ci (dlq_0123abcd)"):
        entry = record_audit(
            actor=operator,
            action="operation.retry.plan",
            target="operation:12",
            filter={"queue": ["orders.dlq"], "reason": "TIMEOUT"},
            count=2000,
            detail="planned",
        )
    record_audit(actor=None, action="channel.disable", detail="<script>alert(1)</script>")

    response = api_for(viewer).get("/api/v1/audit/")

    assert response.status_code == 200
    rows = [row for row in response.json()["results"] if row["action"] != "accounts.token.create"]
    assert [row["action"] for row in rows] == ["channel.disable", "operation.retry.plan"]
    assert rows[0]["actor"] == "system" and rows[0]["detail"] == "<script>alert(1)</script>"
    assert rows[1] == {
        "id": entry.pk,
        "created_at": rows[1]["created_at"],
        "actor": operator.username,
        "action": "operation.retry.plan",
        "target": "operation:12",
        "filter": {"queue": ["orders.dlq"], "reason": "TIMEOUT"},
        "count": 2000,
        "detail": "planned",
        "via": "API token ci (dlq_0123abcd)",
    }
    assert dt.datetime.fromisoformat(rows[1]["created_at"]) == entry.created_at


def test_the_page_and_the_api_select_the_same_rows(
    api_for: ApiFor, viewer: User, operator: User, admin_user: User
) -> None:
    record_audit(actor=operator, action="operation.retry.plan", target="operation:1", detail="d-retry")
    record_audit(actor=admin_user, action="operation.purge.plan", target="operation:2", detail="d-purge")
    record_audit(actor=operator, action="pattern.status", target="pattern #3", detail="d-status")
    record_audit(actor=None, action="operation.archive.plan", target="operation:4", filter={"pattern": [3]})
    record_audit(actor=None, action="operation.pause", target="operation:4", detail="d-paused")
    old = record_audit(actor=operator, action="pattern.assign", target="pattern #3", detail="d-ancient")
    AuditEntry.objects.filter(pk=old.pk).update(created_at=timezone.now() - dt.timedelta(days=30))
    api, page = api_for(viewer), client_for(viewer)

    def both(**query: str) -> set[str]:
        shown = {detail for detail in details(api, **query) if detail.startswith("d-")}
        html = page.get("/audit/", query).content.decode()
        assert shown == {
            detail for detail in ("d-retry", "d-purge", "d-status", "d-paused", "d-ancient") if detail in html
        }
        return shown

    assert both(actor=operator.username.upper()) == {"d-retry", "d-status", "d-ancient"}
    assert both(action="PURGE") == {"d-purge"}
    # A pattern also finds the rows of the operations whose filter named it.
    assert both(target="pattern 3") == {"d-status", "d-ancient", "d-paused"}
    assert both(target="pattern:3", since="1d") == {"d-status", "d-paused"}
    assert both(until=(timezone.now() - dt.timedelta(days=1)).date().isoformat()) == {"d-ancient"}


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"since": "last tuesday"}, "since"),
        ({"until": "2026-02-30T10:00"}, "until"),
        ({"until": "99999999w"}, "until"),
        ({"actor": "ada\x00"}, "actor"),
        ({"target": "\x00"}, "target"),
    ],
)
def test_a_filter_that_cannot_be_read_is_refused_with_the_field_named(
    api_for: ApiFor, viewer: User, query: dict[str, str], field: str
) -> None:
    response = api_for(viewer).get("/api/v1/audit/", query)

    assert response.status_code == 400
    assert response["Content-Type"] == "application/json"
    assert response.json()["code"] == "invalid" and list(response.json()["errors"]) == [field]


def test_only_admins_read_the_sign_in_rows(api_for: ApiFor, viewer: User, operator: User, admin_user: User) -> None:
    record_audit(actor=operator, action="accounts.login", target=f"user:{operator.username}", detail="from 10.0.0.1")
    record_audit(actor=None, action="accounts.login.failed", target="user:hunter2", detail="from 10.0.0.2")
    record_audit(actor=operator, action="pattern.status", target="pattern #3", detail="triaged")

    for reader in (viewer, operator):
        assert details(api_for(reader)) == ["triaged"]
        assert details(api_for(reader), action="accounts.login") == []
    assert details(api_for(admin_user)) == ["triaged", "from 10.0.0.2", "from 10.0.0.1"]
    assert set(details(api_for(admin_user), action="accounts.login")) == {"from 10.0.0.1", "from 10.0.0.2"}


def test_pages_follow_the_cursor_newest_first(api_for: ApiFor, viewer: User) -> None:
    made = [record_audit(actor=None, action="export", target=f"export:{n}") for n in range(7)]
    client = api_for(viewer)

    seen: list[int] = []
    url: str | None = "/api/v1/audit/?action=export&limit=3"
    while url:
        answer = client.get(url).json()
        assert len(answer["results"]) <= 3
        seen += [row["id"] for row in answer["results"]]
        url = answer["next"]

    assert seen == [entry.pk for entry in reversed(made)]


def test_the_api_writes_no_audit_row_of_its_own_reading(api_for: ApiFor, viewer: User) -> None:
    client = api_for(viewer)
    before = AuditEntry.objects.count()

    client.get("/api/v1/audit/")

    assert AuditEntry.objects.count() == before
