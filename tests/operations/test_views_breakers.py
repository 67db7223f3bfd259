"""Circuit breakers on the pages: an operation waiting for one, the list of open ones with the admin's close button,
the watched queues, and the admin's thresholds."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.core.breaker import CLOSED, NACK, OPEN, BreakerConfig, Event, get_breakers
from dlqconsole.operations.breaker_views import MAX_LISTED
from dlqconsole.operations.breakers import BreakerSetting
from dlqconsole.operations.models import Operation, OperationKind, OperationStatus
from tests.conftest import client_for

pytestmark = pytest.mark.django_db

HX = {"HX-Request": "true"}


@pytest.fixture
def open_key() -> Iterator[str]:
    """An open breaker of a queue of this test, closed afterwards."""
    key = f"queue:orders-{uuid.uuid4().hex[:8]}"
    get_breakers().record(key, [Event(NACK, reason="refused by the broker")] * 50, config=BreakerConfig.from_settings())
    yield key
    get_breakers().close(key)


def waiting_operation(operator: User) -> Operation:
    return Operation.objects.create(
        kind=OperationKind.RETRY,
        status=OperationStatus.RUNNING,
        created_by=operator,
        total=10,
        breaker_wait="circuit open for queue orders <b>, probing at 07:45:10 UTC",
        breaker_wait_until=timezone.now(),
    )


def test_an_operation_waiting_for_a_breaker_says_so_on_its_page_and_fragment(viewer: User, operator: User) -> None:
    operation = waiting_operation(operator)
    client = client_for(viewer)

    for response in (
        client.get(f"/operations/{operation.pk}/"),
        client.get(f"/operations/{operation.pk}/", headers=HX),
    ):
        html = response.content.decode()
        assert response.status_code == 200
        assert 'data-testid="breaker-wait"' in html
        assert "Waiting: circuit open for queue orders &lt;b&gt;, probing at 07:45:10 UTC" in html


def test_a_finished_operation_says_nothing_of_a_breaker(viewer: User, operator: User) -> None:
    operation = waiting_operation(operator)
    Operation.objects.filter(pk=operation.pk).update(status=OperationStatus.DONE)

    html = client_for(viewer).get(f"/operations/{operation.pk}/").content.decode()

    assert 'data-testid="breaker-wait"' not in html


def test_open_breakers_are_listed_and_only_an_admin_may_close_one(
    viewer: User, admin_user: User, open_key: str
) -> None:
    name = open_key.removeprefix("queue:")
    for response in (client_for(viewer).get("/operations/"), client_for(viewer).get("/operations/", headers=HX)):
        html = response.content.decode()
        assert f"queue {name}: 20 failures in a row; the last: refused by the broker." in html
        assert "circuit open" in html and "Probing at" in html
        assert "Close by hand" not in html

    html = client_for(admin_user).get("/operations/").content.decode()
    assert "Close by hand" in html and f'value="{open_key}"' in html


def test_the_breaker_an_operation_waits_for_is_listed_before_forged_ones(
    viewer: User, operator: User, open_key: str
) -> None:
    config = BreakerConfig.from_settings()
    for number in range(MAX_LISTED + 3):
        get_breakers().record(f"queue:!forged-{number:03d}", [Event(NACK)] * config.failures, config=config)
    name = open_key.removeprefix("queue:")
    Operation.objects.create(
        kind=OperationKind.RETRY,
        status=OperationStatus.RUNNING,
        created_by=operator,
        total=10,
        breaker_wait=f"circuit open for queue {name}, probing at 07:45:10 UTC",
        breaker_wait_until=timezone.now(),
    )

    html = client_for(viewer).get("/operations/").content.decode()

    assert f"queue {name}: 20 failures in a row" in html
    assert html.count('data-testid="breaker"') == MAX_LISTED
    assert "4 more not closed, not shown" in html


def test_an_admin_closes_a_breaker_by_hand_audited(admin_user: User, open_key: str) -> None:
    response = client_for(admin_user).post("/operations/breakers/close/", {"key": open_key, "next": "/alerts/queues/"})

    assert (response.status_code, response["Location"]) == (302, "/alerts/queues/")
    assert get_breakers().peek(open_key).state == CLOSED
    entry = AuditEntry.objects.get(action="breaker.close")
    assert (entry.actor_name, entry.target) == (admin_user.username, f"breaker:{open_key}")


def test_closing_a_breaker_is_refused_to_an_operator_without_csrf_and_by_get(
    operator: User, admin_user: User, open_key: str
) -> None:
    assert client_for(operator).post("/operations/breakers/close/", {"key": open_key}).status_code == 403
    forged = client_for(admin_user, enforce_csrf_checks=True).post("/operations/breakers/close/", {"key": open_key})
    assert forged.status_code == 403
    assert client_for(admin_user).get("/operations/breakers/close/").status_code == 405
    assert client_for(admin_user).post("/operations/breakers/close/", {"key": "queue:unknown"}).status_code == 404
    assert get_breakers().peek(open_key).state == OPEN
    assert not AuditEntry.objects.filter(action="breaker.close").exists()


def test_closing_sends_nowhere_else(admin_user: User, open_key: str) -> None:
    response = client_for(admin_user).post(
        "/operations/breakers/close/", {"key": open_key, "next": "https://elsewhere.example/"}
    )

    assert response["Location"] == "/operations/"


def test_the_watched_queues_page_shows_open_breakers(viewer: User, open_key: str) -> None:
    html = client_for(viewer).get("/alerts/queues/").content.decode()

    assert f"queue {open_key.removeprefix('queue:')}: 20 failures in a row" in html


def test_the_admin_keeps_thresholds_per_destination_and_closes_one(admin_user: User, open_key: str) -> None:
    client = client_for(admin_user)
    name = open_key.removeprefix("queue:")
    response = client.post(
        "/admin/operations/breakersetting/add/",
        {"broker": BreakerSetting._meta.get_field("broker").get_default(), "queue": name, "probe_size": "2"},
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    setting = BreakerSetting.objects.get(queue=name)
    assert setting.config.probe == 2 and setting.config.failures == BreakerConfig.from_settings().failures
    assert setting.destination.limit_key == open_key
    assert AuditEntry.objects.filter(action__startswith="admin.operations.breakersetting.add").exists()
    assert "open: 20 failures in a row" in client.get("/admin/operations/breakersetting/").content.decode()

    response = client.post(
        "/admin/operations/breakersetting/",
        {"action": "close_selected_breakers", "_selected_action": [setting.pk]},
    )

    assert response.status_code == 302
    assert get_breakers().peek(open_key).state == CLOSED
    assert AuditEntry.objects.filter(action="breaker.close", target=f"breaker:{open_key}").exists()


def test_a_destination_names_a_queue_or_an_exchange_not_both(admin_user: User) -> None:
    response = client_for(admin_user).post(
        "/admin/operations/breakersetting/add/",
        {
            "broker": BreakerSetting._meta.get_field("broker").get_default(),
            "queue": "orders",
            "exchange": "orders.x",
            "routing_key": "created",
        },
    )

    assert response.status_code == 200
    assert "Name a queue or an exchange and routing key, not both." in response.content.decode()
    assert not BreakerSetting.objects.exists()
