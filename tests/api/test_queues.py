"""/api/v1/queues/: every dead-letter queue the console knows, with its counts per status and, where the console
samples it, its depth and consumers."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from rest_framework.test import APIClient

from dlqconsole.brokers.models import Broker
from dlqconsole.deadletters.counters import add_counts
from dlqconsole.deadletters.models import DeadLetter
from dlqconsole.ingest.models import QueueSample, WatchedQueue
from tests.factories import EnvelopeFactory, many, store

pytestmark = pytest.mark.django_db

URL = "/api/v1/queues/"
ApiFor = Callable[[User], APIClient]


@pytest.fixture
def client(api_for: ApiFor, viewer: User) -> APIClient:
    return api_for(viewer)


def test_queues_with_dead_letters_and_watched_ones_with_their_samples(client: APIClient) -> None:
    many(3, queue="orders")
    many(1, queue="billing")
    WatchedQueue.objects.create(name="orders", dead_letter_queue="orders.dlq", dead_letter_exchange="orders.dlx")
    WatchedQueue.objects.create(name="emails", dead_letter_queue="emails.dlq", dead_letter_exchange="emails.dlx")
    QueueSample.objects.create(queue="orders.dlq", messages=4, consumers=1, sampled_at=timezone.now() - dt.timedelta(1))
    QueueSample.objects.create(queue="orders.dlq", messages=12, consumers=2)
    QueueSample.objects.create(queue="orders", messages=500, consumers=3)

    data = client.get(URL).json()

    by_queue = {row["queue"]: row for row in data["results"]}
    assert [row["queue"] for row in data["results"]] == ["billing.dlq", "emails.dlq", "orders.dlq"]
    assert data["truncated"] is False
    orders = by_queue["orders.dlq"]
    assert (orders["broker"], orders["work_queue"], orders["watched"]) == ("default", "orders", True)
    assert (orders["depth"], orders["consumers"]) == (12, 2) and orders["sampled_at"]
    assert orders["counts"] == {"parked": 3, "scheduled": 0, "replayed": 0, "moved": 0, "archived": 0, "failed": 0}
    assert orders["waiting"] == 3
    assert orders["oldest_parked_at"] and orders["newest_parked_at"]
    assert orders["dead_letters"] == "http://testserver/api/v1/dead-letters/?broker=default&queue=orders.dlq"
    assert orders["page"] == "http://testserver/messages/?broker=default&queue=orders.dlq"
    emails = by_queue["emails.dlq"]
    assert (emails["depth"], emails["consumers"], emails["waiting"], emails["oldest_parked_at"]) == (
        None,
        None,
        0,
        None,
    )
    billing = by_queue["billing.dlq"]
    assert (billing["watched"], billing["work_queue"], billing["depth"], billing["waiting"]) == (False, None, None, 1)


def test_counts_per_status_follow_the_counters(client: APIClient) -> None:
    letter, *_ = many(3, queue="orders")
    # Archived by hand: the counters move as the services move them.
    DeadLetter.objects.filter(pk=letter.pk).update(status="archived")
    cell = (letter.broker_id or 0, "orders.dlq", letter.pattern_id, letter.failure_reason)
    add_counts([(*cell, "parked", -1), (*cell, "archived", 1)])

    (row,) = client.get(URL).json()["results"]

    assert (row["counts"]["parked"], row["counts"]["archived"], row["waiting"]) == (2, 1, 2)


def test_the_same_queue_on_two_brokers_is_two_rows_and_a_broker_narrows_them(client: APIClient) -> None:
    second = Broker.objects.create(name="second", url="amqp://second/")
    many(1, queue="orders")
    letter = EnvelopeFactory.build(queue="orders")
    letter.broker_id = second.pk
    store(letter)

    both = client.get(URL).json()["results"]
    one = client.get(URL, {"broker": "second"}).json()["results"]

    assert [(row["broker"], row["queue"]) for row in both] == [("default", "orders.dlq"), ("second", "orders.dlq")]
    assert [(row["broker"], row["queue"], row["waiting"]) for row in one] == [("second", "orders.dlq", 1)]


def test_an_unknown_broker_is_400_naming_the_known_ones(client: APIClient) -> None:
    many(1)

    response = client.get(URL, {"broker": "nowhere"})

    assert response.status_code == 400
    assert response.json()["code"] == "refused"
    assert "no broker named 'nowhere' (known: default" in response.json()["detail"]


def test_queues_are_read_only_and_need_a_token(api_for: ApiFor, admin_user: User) -> None:
    assert APIClient().get(URL).status_code == 401
    assert api_for(admin_user).post(URL, {}, format="json").status_code == 405


def test_the_schema_has_the_queue_list(client: APIClient) -> None:
    operation = client.get("/api/v1/openapi.json").json()["paths"]["/api/v1/queues/"]["get"]

    assert operation["operationId"] == "list_queues"
    assert [parameter["name"] for parameter in operation["parameters"]] == ["broker"]
