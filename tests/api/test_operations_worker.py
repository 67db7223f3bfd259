"""The API's acceptance test, with a real Celery worker and broker: with a token alone, list a queue's dead letters,
plan and start a retry, watch it finish, and find every message back in its original queue exactly once. Whoever
has no token, a viewer's token or a revoked one gets nothing done on the way."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from pika.adapters.blocking_connection import BlockingChannel
from rest_framework.test import APIClient

from dlqconsole.accounts.tokens import create_token, revoke_tokens
from dlqconsole.deadletters.models import DeadLetter, DeadLetterStatus
from tests.api.conftest import api_client, token_for
from tests.support import declare_with_dlq, die_on_broker, drain, ingest_from, wait_for_depth

pytestmark = pytest.mark.django_db(transaction=True)

COUNT = 5


def watch(client: APIClient, url: str, *, until: str, timeout: float) -> dict[str, Any]:
    """Poll the operation until its status is `until` and its numbers are final; fail naming where it stopped."""
    deadline = time.monotonic() + timeout
    while True:
        response = client.get(url)
        assert response.status_code == 200, response.json()
        shown: dict[str, Any] = response.json()
        if shown["status"] == until and shown["progress"]["settled"]:
            return shown
        assert time.monotonic() < deadline, f"after {timeout}s: {shown['status']}, {shown['progress']}"
        time.sleep(0.1)


def test_with_a_token_alone_list_plan_start_and_watch_a_retry_finish(
    amqp_channel: BlockingChannel,
    queue_name: Callable[[str], str],
    operator: User,
    viewer: User,
    celery_worker: Callable[..., Any],
    celery_queue: str,
) -> None:
    # The world: messages that died on the real broker, drained into the console as consume_dlq drains them.
    orders = declare_with_dlq(amqp_channel, queue_name("orders"))
    die_on_broker(amqp_channel, orders.work, [f'{{"order": {n}}}'.encode() for n in range(COUNT)])
    assert wait_for_depth(amqp_channel, orders.dlq, COUNT) == COUNT
    letters = ingest_from(amqp_channel, orders.dlq, expect=COUNT)
    worker = celery_worker()
    operator_api = api_client(token_for(operator))
    viewer_api = api_client(token_for(viewer))
    revoked, plaintext = create_token(user=operator, name="revoked")
    revoke_tokens([revoked], actor=operator)
    revoked_api = api_client(plaintext)

    # 1. The queue's dead letters.
    listed = operator_api.get("/api/v1/dead-letters/", {"queue": orders.dlq})
    assert listed.status_code == 200, listed.json()
    rows = listed.json()["results"]
    assert listed.json()["next"] is None
    assert sorted(row["id"] for row in rows) == sorted(letter.pk for letter in letters)
    assert {(row["source_queue"], row["status"]) for row in rows} == {(orders.dlq, "parked")}

    # 2. A plan to retry them: answered, not started. Without a token, with a revoked one or a viewer's, no plan.
    retry = {"kind": "retry", "filter": {"queue": [orders.dlq]}}
    for client, refused in ((api_client(), 401), (revoked_api, 401), (viewer_api, 403)):
        assert client.get("/api/v1/dead-letters/", {"queue": orders.dlq}).status_code == (
            200 if client is viewer_api else refused
        )
        assert client.post("/api/v1/operations/", retry, format="json").status_code == refused
    planned = operator_api.post("/api/v1/operations/", retry, format="json")
    assert planned.status_code == 201, planned.json()
    plan = planned.json()
    assert (plan["status"], plan["total"], plan["unreplayable"]["count"]) == ("planned", COUNT, 0)
    assert plan["breakdown"]["queues"] == [{"name": orders.dlq, "count": COUNT}]
    url = f"/api/v1/operations/{plan['id']}/"

    # 3. Its start: nobody without the operator's token starts it.
    for client, refused in ((api_client(), 401), (revoked_api, 401), (viewer_api, 403)):
        assert client.post(f"{url}start/", {}, format="json").status_code == refused
        assert client.get(url).status_code == (200 if client is viewer_api else refused)
    assert operator_api.get(url).json()["status"] == "planned"
    worker.wait_until_ready()
    started = operator_api.post(f"{url}start/", {}, format="json")
    assert started.status_code == 200, started.json()
    assert started.json()["status"] in ("running", "done")

    # 4. Watched until it is over, by the token alone.
    done = watch(operator_api, url, until="done", timeout=30)
    assert done["outcome"] == "Done" and done["eta_seconds"] is None and done["finished_at"]
    progress = done["progress"]
    assert (progress["done"], progress["failed"], progress["skipped"], progress["waiting"]) == (COUNT, 0, 0, 0)
    assert (progress["fraction"], progress["came_back"], progress["duplicates"]) == (1.0, 0, 0)

    # Every message is back in its original queue, exactly once, as it was sent; none died again.
    assert wait_for_depth(amqp_channel, orders.work, COUNT, timeout=5) == COUNT
    back = drain(amqp_channel, orders.work)
    assert Counter(properties.message_id for properties, _ in back) == {f"{orders.work}-{n}": 1 for n in range(COUNT)}
    assert sorted(body for _, body in back) == sorted(f'{{"order": {n}}}'.encode() for n in range(COUNT))
    assert drain(amqp_channel, orders.dlq) == []
    statuses = DeadLetter.objects.filter(pk__in=[letter.pk for letter in letters]).values_list("status", flat=True)
    assert set(statuses) == {DeadLetterStatus.REPLAYED}
