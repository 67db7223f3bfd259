"""What a plan or a triage form takes from the user ends in text columns: a NUL (PostgreSQL refuses it) or a name
longer than the column (and than AMQP's 255-byte names) was a 500; it is refused with the reason."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from dlqconsole.deadletters.models import FailurePattern
from dlqconsole.operations.models import Operation
from tests.conftest import client_for
from tests.factories import EnvelopeFactory, store

pytestmark = [pytest.mark.django_db]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("target_queue", "orders\x00x"),
        ("target_queue", "q" * 256),
        ("target_queue", "é" * 128),  # 128 characters, 256 bytes: too long for AMQP
        ("target_exchange", "ex\x00"),
        ("target_exchange", "e" * 300),
        ("target_routing_key", "k" * 300),
    ],
)
def test_a_move_target_with_a_nul_or_too_long_is_refused(operator: User, field: str, value: str) -> None:
    store(EnvelopeFactory.build())
    data = {"kind": "move", "queue": "orders.dlq", "scope": "all", field: value}
    if field == "target_routing_key":
        data["target_exchange"] = "shop"
    elif field == "target_exchange":
        data["target_routing_key"] = "orders.created"

    response = client_for(operator).post("/operations/plan/", data)

    assert response.status_code == 400
    assert "255" in response.content.decode() or "NUL" in response.content.decode()
    assert not Operation.objects.exists()


def test_a_note_with_a_nul_is_refused_with_the_reason(operator: User) -> None:
    store(EnvelopeFactory.build())
    pattern = FailurePattern.objects.get()
    client = client_for(operator)

    response = client.post(f"/patterns/{pattern.pk}/assign/", {"owner": "", "note": "look\x00here"}, follow=True)

    assert response.status_code == 200
    assert "NUL" in response.content.decode()
    pattern.refresh_from_db()
    assert pattern.note == ""
