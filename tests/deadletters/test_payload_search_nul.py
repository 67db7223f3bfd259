"""A payload search may hold a NUL (bodies are bytes), but PostgreSQL's jsonb refuses one: the filter is stored in
audit rows and operations, which failed with a 500."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.operations.models import Operation
from tests.conftest import client_for
from tests.factories import EnvelopeFactory, store

pytestmark = [pytest.mark.django_db]


def test_export_with_a_nul_in_the_payload_search_streams_and_is_audited(viewer: User) -> None:
    store(EnvelopeFactory.build(body=b'{"a": "x\x00y"}'), EnvelopeFactory.build(body=b'{"a": "plain"}'))

    response = client_for(viewer).get("/messages/export/", {"format": "csv", "payload": "x\x00y"})

    assert response.status_code == 200
    rows = b"".join(response.streaming_content).decode().splitlines()  # type: ignore[attr-defined]
    assert len(rows) == 2  # the header and the one match
    entry = AuditEntry.objects.get(action="export")
    assert "\x00" not in entry.filter["payload"] and entry.filter["payload"].startswith("x")


def test_planning_from_a_payload_search_with_a_nul_is_refused_with_the_reason(operator: User) -> None:
    store(EnvelopeFactory.build(body=b'{"a": "x\x00y"}'))

    response = client_for(operator).post("/operations/plan/", {"kind": "archive", "payload": "x\x00y", "scope": "all"})

    assert response.status_code == 400
    assert "NUL" in response.content.decode()
    assert not Operation.objects.exists()
