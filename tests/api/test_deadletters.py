"""/api/v1/dead-letters/: the messages page's filters, keyset cursors, one dead letter whole with its body, and the
schema of both."""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.db.models.functions import Left
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.test import APIClient, APIRequestFactory

from dlqconsole.api.deadletter_serializers import (
    ERROR_EXCERPT_CHARS,
    FILTER_HELP,
    ROW_COLUMNS,
    DeadLetterRowSerializer,
)
from dlqconsole.brokers.models import Broker
from dlqconsole.deadletters.filters import DeadLetterFilter
from dlqconsole.deadletters.models import DeadLetter
from tests.factories import EnvelopeFactory, many, store

pytestmark = pytest.mark.django_db

LIST = "/api/v1/dead-letters/"
ApiFor = Callable[[User], APIClient]


@pytest.fixture
def client(api_for: ApiFor, viewer: User) -> APIClient:
    return api_for(viewer)


@pytest.fixture
def pair() -> dict[str, DeadLetter]:
    """Two dead letters that differ in every field a filter reads: `a` arrived now on the broker default, `b` three
    days ago on the broker second."""
    second = Broker.objects.create(name="second", url="amqp://second/")
    a = EnvelopeFactory.build(queue="orders", priority=9, host="web-7", version="2.0.0", body=b'{"sku": "ABC-123"}')
    b = EnvelopeFactory.build(
        queue="billing", error="card declined", error_type="CardError", priority=1, host="web-1", version="1.4.2"
    )
    b.broker_id = second.pk
    (first,) = store(a)
    (other,) = store(b, now=timezone.now() - dt.timedelta(days=3))
    DeadLetter.objects.filter(pk=first.pk).update(correlation_id="checkout-1")
    DeadLetter.objects.filter(pk=other.pk).update(correlation_id="checkout-2", status="failed")
    return {"a": DeadLetter.objects.get(pk=first.pk), "b": DeadLetter.objects.get(pk=other.pk)}


# Each filter field: a query that selects `a` or `b` of the pair and not the other.
FILTER_CASES: list[tuple[str, Callable[[dict[str, DeadLetter]], dict[str, Any]], str]] = [
    ("pattern", lambda rows: {"pattern": rows["a"].pattern_id}, "a"),
    ("broker", lambda rows: {"broker": "second"}, "b"),
    ("queue", lambda rows: {"queue": "billing.dlq"}, "b"),
    ("reason", lambda rows: {"reason": rows["a"].failure_reason.lower()}, "a"),
    ("status", lambda rows: {"status": "failed"}, "b"),
    ("error_type", lambda rows: {"error_type": "CardError"}, "b"),
    ("since", lambda rows: {"since": "1d"}, "a"),
    ("until", lambda rows: {"until": "1d"}, "b"),
    ("priority", lambda rows: {"priority": "5-9"}, "a"),
    ("message_id", lambda rows: {"message_id": f"nothing,{rows['b'].message_id}"}, "b"),
    ("correlation_id", lambda rows: {"correlation_id": "checkout-1"}, "a"),
    ("ids", lambda rows: {"ids": rows["b"].pk}, "b"),
    ("host", lambda rows: {"host": "web-7"}, "a"),
    ("version", lambda rows: {"version": "1.4.2"}, "b"),
    ("text", lambda rows: {"text": "DECLINED"}, "b"),
    ("payload", lambda rows: {"payload": "ABC-123"}, "a"),
]


def test_the_filter_cases_cover_every_filter_field() -> None:
    assert [name for name, _, _ in FILTER_CASES] == list(DeadLetterFilter.FIELDS)


@pytest.mark.parametrize(("field", "query", "expected"), FILTER_CASES, ids=[case[0] for case in FILTER_CASES])
def test_each_filter_tells_the_pair_apart(
    client: APIClient,
    pair: dict[str, DeadLetter],
    field: str,
    query: Callable[[dict[str, DeadLetter]], dict[str, Any]],
    expected: str,
) -> None:
    response = client.get(LIST, {**query(pair), "status": ["parked", "failed"]} if field != "status" else query(pair))

    assert response.status_code == 200, response.json()
    assert [row["id"] for row in response.json()["results"]] == [pair[expected].pk]


def test_a_row_has_what_the_messages_page_shows_and_links(client: APIClient, pair: dict[str, DeadLetter]) -> None:
    row = client.get(LIST, {"ids": pair["a"].pk}).json()["results"][0]
    letter = pair["a"]

    assert row["url"] == f"http://testserver/api/v1/dead-letters/{letter.pk}/"
    assert row["page"] == f"http://testserver/messages/{letter.pk}/"
    assert row["broker"] == "default"
    assert (row["source_queue"], row["original_queue"], row["original_exchange"]) == ("orders.dlq", "orders", "shop")
    assert row["original_routing_keys"] == ["orders.created"]
    assert (row["status"], row["failure_reason"], row["death_reason"]) == ("parked", letter.failure_reason, "rejected")
    assert (row["error_type"], row["error_message"], row["error_message_truncated"]) == (
        "TimeoutError",
        "Request timed out after 3000ms",
        False,
    )
    assert (row["pattern"], row["message_id"], row["correlation_id"]) == (
        letter.pattern_id,
        letter.message_id,
        "checkout-1",
    )
    assert (row["host"], row["app_version"], row["priority"], row["attempt_count"]) == ("web-7", "2.0.0", 9, 1)
    assert (row["body_size"], row["body_truncated"], row["replay_count"]) == (len(b'{"sku": "ABC-123"}'), False, 0)
    assert row["ingested_at"] and row["last_failed_at"] is not None
    assert "body" not in row and "headers" not in row and "stack_trace" not in row


def test_a_row_built_directly_is_what_its_fields_give(pair: dict[str, DeadLetter]) -> None:
    request = Request(APIRequestFactory().get(LIST))
    rows = (
        DeadLetter.objects.select_related("broker")
        .only(*ROW_COLUMNS)
        .annotate(error_excerpt=Left("error_message", ERROR_EXCERPT_CHARS + 1))
        .order_by("id")
    )
    DeadLetter.objects.filter(pk=pair["b"].pk).update(first_failed_at=None, original_routing_keys=[])

    for row in rows:
        serializer = DeadLetterRowSerializer(context={"request": request})
        direct = serializer.to_representation(row)
        walked = serializers.Serializer.to_representation(serializer, row)
        assert list(direct.items()) == list(walked.items())


def test_a_long_error_message_is_cut_in_the_list_and_whole_in_the_detail(client: APIClient) -> None:
    (letter,) = many(1, error="x" * 5000)

    row = client.get(LIST).json()["results"][0]
    whole = client.get(row["url"]).json()

    assert (len(row["error_message"]), row["error_message_truncated"]) == (ERROR_EXCERPT_CHARS, True)
    assert (whole["error_message"], whole["error_message_truncated"]) == ("x" * 5000, False)


def test_the_list_reads_no_bodies_and_a_fixed_number_of_queries(client: APIClient) -> None:
    many(3)
    client.get(LIST)  # the token's first use and the brokers' sync are behind us

    with CaptureQueriesContext(connection) as few:
        client.get(LIST)
    many(20, error="another failure")
    with CaptureQueriesContext(connection) as more:
        response = client.get(LIST)

    assert len(response.json()["results"]) == 23
    assert len(more.captured_queries) == len(few.captured_queries)
    listing = [query["sql"] for query in more.captured_queries if 'FROM "deadletters_deadletter"' in query["sql"]]
    assert len(listing) == 1
    assert '"body"' not in listing[0] and '"headers"' not in listing[0] and '"stack_trace"' not in listing[0]


def test_cursors_walk_three_pages_without_repeats_and_back(client: APIClient) -> None:
    ids = sorted(row.pk for row in many(7))
    seen: list[int] = []
    pages = []
    url: str | None = f"{LIST}?limit=3"
    while url:
        page = client.get(url).json()
        pages.append(page)
        seen += [row["id"] for row in page["results"]]
        url = page["next"]

    assert [len(page["results"]) for page in pages] == [3, 3, 1]
    assert seen == sorted(ids, reverse=True)
    assert "offset" not in pages[1]["next"] and "count" not in pages[1]
    back = client.get(pages[2]["previous"]).json()
    assert [row["id"] for row in back["results"]] == seen[3:6]
    assert pages[0]["previous"] is None


def test_archived_dead_letters_are_left_out_unless_asked_for(client: APIClient) -> None:
    kept, archived = many(2)
    DeadLetter.objects.filter(pk=archived.pk).update(status="archived")

    assert [row["id"] for row in client.get(LIST).json()["results"]] == [kept.pk]
    assert [row["id"] for row in client.get(LIST, {"status": "archived"}).json()["results"]] == [archived.pk]


@pytest.mark.parametrize(
    ("query", "code", "message"),
    [
        ({"priority": "high"}, "refused", "priority must be a number"),
        ({"since": "yesterday-ish"}, "refused", "since must be an ISO date/time"),
        ({"status": "gone"}, "refused", "unknown status 'gone'"),
        ({"reason": "nope"}, "refused", "unknown reason 'NOPE'"),
        ({"broker": "nowhere"}, "refused", "no broker named 'nowhere'"),
        ({"pattern": "abc"}, "refused", "pattern and ids must be whole numbers"),
        ({"correlation_id": "a\x00b"}, "refused", "correlation_id cannot hold a NUL"),
        ({"queues": "orders.dlq"}, "invalid", "queues: Not a parameter of this resource"),
    ],
)
def test_a_bad_filter_is_400_with_the_reason(client: APIClient, query: dict[str, str], code: str, message: str) -> None:
    many(1)

    response = client.get(LIST, query)

    assert response.status_code == 400
    assert response["Content-Type"] == "application/json"
    assert (response.json()["code"], message in response.json()["detail"]) == (code, True)


def test_the_counters_spare_a_scan_that_cannot_match(client: APIClient) -> None:
    many(2, queue="orders")

    with CaptureQueriesContext(connection) as queries:
        response = client.get(LIST, {"queue": "orders.dlq", "reason": "AUTH"})

    assert response.json()["results"] == []
    assert not any('FROM "deadletters_deadletter"' in query["sql"] for query in queries.captured_queries)


def test_the_detail_has_everything_with_the_body_as_text(client: APIClient) -> None:
    (letter,) = store(
        EnvelopeFactory.build(
            body='{"name": "Zoë"}'.encode(),
            stack_trace="Traceback (most recent call last):\n  boom",
            headers={"tenant": "acme", "raw": b"\x00\x01"},
        )
    )

    data = client.get(f"{LIST}{letter.pk}/").json()

    assert (data["body"], data["body_encoding"], data["body_truncated"]) == ('{"name": "Zoë"}', "text", False)
    assert data["headers"]["tenant"] == "acme"
    assert data["headers"]["raw"] == {"$bytes": base64.b64encode(b"\x00\x01").decode()}
    assert data["x_death"][0]["queue"] == "orders" and data["x_death"][0]["reason"] == "rejected"
    assert data["properties"]["message_id"] == letter.message_id
    assert data["stack_trace"].startswith("Traceback")
    assert (data["pattern"], data["pattern_template"]) == (letter.pattern_id, letter.pattern.template)
    assert data["pattern_url"] == f"http://testserver/api/v1/patterns/{letter.pattern_id}/"
    assert data["parse_errors"] == [] and data["fingerprint"] == letter.fingerprint
    assert data["content_type"] == "application/json"
    assert data["previous"] is None and data["ancestors"] == [] and data["boomerangs"] == []


def test_the_body_as_base64_is_byte_exact_and_a_binary_body_never_comes_as_text(client: APIClient) -> None:
    raw = b"\xff\xfe binary \x00 \x80"
    (binary,) = many(1, body=raw)
    (text,) = many(1, body="plain ✓".encode())

    as_text = client.get(f"{LIST}{binary.pk}/").json()
    as_base64 = client.get(f"{LIST}{text.pk}/", {"body": "base64"}).json()

    assert (as_text["body_encoding"], base64.b64decode(as_text["body"])) == ("base64", raw)
    assert (as_base64["body_encoding"], base64.b64decode(as_base64["body"])) == ("base64", "plain ✓".encode())
    assert client.get(f"{LIST}{text.pk}/", {"body": "hex"}).status_code == 400


def test_the_detail_links_the_records_of_the_same_message(client: APIClient) -> None:
    first, replayed, again, edited = many(4)
    DeadLetter.objects.filter(pk=replayed.pk).update(previous=first)
    DeadLetter.objects.filter(pk=again.pk).update(previous=replayed)
    DeadLetter.objects.filter(pk=edited.pk).update(edited_from=first)

    oldest = client.get(f"{LIST}{first.pk}/").json()
    newest = client.get(f"{LIST}{again.pk}/").json()

    assert [link["id"] for link in oldest["boomerangs"]] == [replayed.pk]
    assert [link["id"] for link in oldest["edits"]] == [edited.pk]
    assert newest["previous"]["id"] == replayed.pk
    assert newest["previous"]["url"] == f"http://testserver/api/v1/dead-letters/{replayed.pk}/"
    assert [link["id"] for link in newest["ancestors"]] == [replayed.pk, first.pk]
    assert client.get(f"{LIST}{edited.pk}/").json()["edited_from"]["id"] == first.pk


@pytest.mark.parametrize("path", ["987654321/", "99999999999999999999999/"])
def test_a_missing_dead_letter_is_json_404(client: APIClient, path: str) -> None:
    response = client.get(f"{LIST}{path}")

    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
    assert response.json()["code"] == "not_found"


def test_the_list_and_detail_are_read_only(api_for: ApiFor, admin_user: User) -> None:
    (letter,) = many(1)
    client = api_for(admin_user)

    assert client.post(LIST, {}, format="json").status_code == 405
    assert client.delete(f"{LIST}{letter.pk}/").status_code == 405


def test_the_schema_lists_every_filter_with_its_meaning(client: APIClient) -> None:
    schema = client.get("/api/v1/openapi.json").json()

    listing = schema["paths"]["/api/v1/dead-letters/"]["get"]
    parameters = {parameter["name"]: parameter for parameter in listing["parameters"]}
    assert listing["operationId"] == "list_dead_letters"
    assert set(DeadLetterFilter.FIELDS) | {"cursor", "limit"} == set(parameters)
    assert set(FILTER_HELP) == set(DeadLetterFilter.FIELDS)
    assert parameters["correlation_id"]["schema"] == {"type": "array", "items": {"type": "string"}}
    assert parameters["ids"]["schema"] == {"type": "array", "items": {"type": "integer"}}
    assert parameters["since"]["schema"] == {"type": "string"}
    detail = schema["paths"]["/api/v1/dead-letters/{id}/"]["get"]
    assert detail["operationId"] == "get_dead_letter"
    assert [parameter["name"] for parameter in detail["parameters"] if parameter["in"] == "query"] == ["body"]
