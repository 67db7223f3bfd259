"""Operations through the API, without a worker: plans of each kind with their breakdown and warnings, the start's
confirmations, the controls, the roles, the refusals as JSON, and audit rows that name the token."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from rest_framework.test import APIClient

from dlqconsole.accounts.models import ApiToken, AuditEntry
from dlqconsole.accounts.tokens import revoke_tokens
from dlqconsole.deadletters.models import DeadLetter, DeadLetterStatus
from dlqconsole.operations.models import Operation, OperationStatus
from dlqconsole.operations.planning import plan_operation
from dlqconsole.operations.services import cancel_operation
from tests.api.conftest import api_client, token_for
from tests.factories import many, synthetic_dead_letters

pytestmark = pytest.mark.django_db

ApiFor = Callable[[User], APIClient]
CONTROLS = ("start", "pause", "resume", "cancel", "rate")


@pytest.fixture
def orders(amqp_channel: Any, queue_name: Callable[[str], str]) -> str:
    """A queue that exists on the broker, so that a retry of the dead letters that died in it can be replayed."""
    name = queue_name("orders")
    amqp_channel.queue_declare(queue=name, durable=True)
    return name


def plan(client: APIClient, **body: Any) -> Any:
    return client.post("/api/v1/operations/", body, format="json")


def audit_rows(operation_id: int) -> list[tuple[str, str]]:
    entries = AuditEntry.objects.filter(target=f"operation:{operation_id}").order_by("pk")
    return list(entries.values_list("action", "via"))


def test_a_retry_plan_is_answered_with_its_count_breakdown_and_not_started(
    api_for: ApiFor, operator: User, orders: str
) -> None:
    ids = synthetic_dead_letters(queue=orders, count=3)

    response = plan(api_for(operator), kind="retry", filter={"queue": [f"{orders}.dlq"]}, canary=1, canary_wait=5)

    assert response.status_code == 201, response.json()
    body = response.json()
    operation = Operation.objects.get(pk=body["id"])
    assert (operation.status, operation.total, operation.started_at) == (OperationStatus.PLANNED, 3, None)
    assert (body["kind"], body["status"], body["total"], body["rate"]) == ("retry", "planned", 3, "100/1s")
    assert body["filter"] == {"queue": [f"{orders}.dlq"]}
    assert body["canary"]["size"] == 1 and body["canary"]["wait_seconds"] == 5
    assert body["breakdown"]["queues"] == [{"name": f"{orders}.dlq", "count": 3}]
    assert body["breakdown"]["brokers"] == [{"name": "default", "count": 3}]
    assert body["breakdown"]["destinations"][0]["count"] == 3
    assert body["unreplayable"] == {"count": 0, "reasons": []}
    # The queue has no consumer: the page says so before Start, and so does the API.
    assert [warning["code"] for warning in body["warnings"]] == ["no_consumer"]
    assert body["confirm_count"] is None and body["eta_seconds"] is None
    assert body["created_by"] == "otto-operator" and body["url"].endswith(f"/operations/{operation.pk}/")
    assert body["progress"] == {
        "done": 0,
        "failed": 0,
        "skipped": 0,
        "not_attempted": 0,
        "in_flight": 0,
        "waiting": 3,
        "processed": 0,
        "remaining": 3,
        "fraction": 0.0,
        "came_back": 0,
        "came_back_reasons": [],
        "duplicates": 0,
        "settled": False,
    }
    # Not started: no worker is waited for.
    assert (body["waiting_for_worker_since"], body["heartbeat_age_seconds"], body["worker_note"]) == (None, None, "")
    assert set(operation.items.values_list("dead_letter_id", flat=True)) == set(ids)
    assert audit_rows(operation.pk) == [("operation.retry.plan", f"API token tests-1 (dlq_{token_prefix(operator)})")]


def token_prefix(user: User) -> str:
    return user.api_tokens.get().prefix  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", ["archive", "restore", "move"])
def test_each_other_kind_is_planned(api_for: ApiFor, operator: User, orders: str, kind: str) -> None:
    letters = many(2)
    if kind == "restore":
        DeadLetter.objects.filter(pk__in=[row.pk for row in letters]).update(status=DeadLetterStatus.ARCHIVED)
    body: dict[str, Any] = {"kind": kind, "filter": {"ids": [row.pk for row in letters]}}
    if kind == "move":
        body |= {"target_queue": orders, "rate": ""}

    response = plan(api_for(operator), **body)

    assert response.status_code == 201, response.json()
    answered = response.json()
    assert (answered["kind"], answered["status"], answered["total"]) == (kind, "planned", 2)
    assert answered["rate"] == ""
    if kind == "move":
        assert answered["target"] == {
            "queue": orders,
            "exchange": "",
            "routing_key": "",
            "broker": None,
            "display": f"queue {orders}",
        }
        assert answered["breakdown"]["destination_queues"] == [{"queue": orders, "messages": 0, "consumers": 0}]
    assert AuditEntry.objects.get(action=f"operation.{kind}.plan").via.startswith("API token")


def test_a_plan_whose_destinations_are_missing_says_so_and_cannot_start(api_for: ApiFor, operator: User) -> None:
    letters = many(2, queue="no-such-queue-anywhere", exchange="no-such-exchange-anywhere")
    client = api_for(operator)

    body = plan(client, kind="retry", filter={"ids": [row.pk for row in letters]}).json()

    assert body["unreplayable"]["count"] == 2
    assert "no-such-exchange-anywhere" in body["unreplayable"]["reasons"][0]["name"]
    assert [warning["code"] for warning in body["warnings"]] == ["nothing_replayable"]
    refused = client.post(f"/api/v1/operations/{body['id']}/start/", {}, format="json")
    assert refused.status_code == 400 and refused.json()["code"] == "refused"
    assert "cannot be replayed" in refused.json()["detail"]
    assert Operation.objects.get(pk=body["id"]).status == OperationStatus.PLANNED


def test_a_purge_needs_an_admin_and_its_count_to_start(
    api_for: ApiFor, operator: User, admin_user: User, celery_queue: str
) -> None:
    letters = many(3)
    ids = [row.pk for row in letters]
    admin, other = api_for(admin_user), api_for(operator)

    refused_plan = plan(other, kind="purge", filter={"ids": ids})
    body = plan(admin, kind="purge", filter={"ids": ids}).json()

    assert refused_plan.status_code == 403 and refused_plan.json()["detail"] == "This needs the admin role."
    assert Operation.objects.count() == 1
    assert (body["kind"], body["total"], body["confirm_count"], body["rate"]) == ("purge", 3, 3, "")
    assert "confirm_count" in [warning["code"] for warning in body["warnings"]]
    start = f"/api/v1/operations/{body['id']}/start/"

    assert other.post(start, {"confirm_count": 3}, format="json").status_code == 403
    missing = admin.post(start, {}, format="json")
    wrong = admin.post(start, {"confirm_count": 4}, format="json")

    for response in (missing, wrong):
        assert response.status_code == 400 and response.json()["code"] == "refused"
    assert '"confirm_count": 3' in missing.json()["detail"]
    assert wrong.json()["detail"] == (
        "Nothing was deleted: confirm_count was 4, but this purge deletes 3 messages. Send 3."
    )
    assert missing.json()["detail"].startswith('Nothing was deleted: send "confirm_count": 3 (the number of messages)')
    assert Operation.objects.get().status == OperationStatus.PLANNED
    assert DeadLetter.objects.filter(pk__in=ids).count() == 3
    refusals = AuditEntry.objects.filter(action="operation.purge.start_refused").order_by("pk")
    assert [(row.actor_name, row.detail) for row in refusals] == [
        ("ada-admin", "no count typed"),
        ("ada-admin", "typed '4' instead of 3"),
    ]
    assert all(row.via.startswith("API token") for row in refusals)

    started = admin.post(start, {"confirm_count": 3}, format="json")

    assert started.status_code == 200 and started.json()["status"] == "running"
    assert started.json()["confirm_count"] is None and started.json()["warnings"] == []
    assert not AuditEntry.objects.filter(actor_name="otto-operator").exists()
    assert AuditEntry.objects.get(action="operation.purge.start").via.startswith("API token")


def test_start_pause_resume_rate_and_cancel_answer_the_operation_after_the_change(
    api_for: ApiFor, operator: User, orders: str, celery_queue: str
) -> None:
    synthetic_dead_letters(queue=orders, count=2)
    client = api_for(operator)
    pk = plan(client, kind="retry", filter={"queue": [orders]}, rate="10/1s").json()["id"]

    def control(action: str, **body: Any) -> Any:
        return client.post(f"/api/v1/operations/{pk}/{action}/", body, format="json")

    wrong_count = control("start", confirm_count=5)
    started = control("start", confirm_count=2)
    paused = control("pause", reason="downstream is slow")
    paused_again = control("pause")
    resumed = control("resume")
    rated = control("rate", rate="1/1m")
    unlimited = control("rate", rate="")
    bad_rate = control("rate", rate="fast")
    no_rate = control("rate")
    cancelled = control("cancel")
    cancelled_again = control("cancel")

    assert wrong_count.status_code == 400 and "confirm_count is 5" in wrong_count.json()["detail"]
    assert started.status_code == 200 and started.json()["status"] == "running"
    assert started.json()["started_at"] is not None
    assert paused.json()["status"] == "paused" and paused.json()["pause_reason"] == "downstream is slow"
    assert paused_again.status_code == 400 and "only a running one can pause" in paused_again.json()["detail"]
    assert resumed.json()["status"] == "running" and resumed.json()["pause_reason"] == ""
    # Two messages left at one a minute; without a rate and with nothing done yet there is no pace to tell.
    assert (rated.json()["rate"], rated.json()["eta_seconds"]) == ("1/1m", 120)
    assert (unlimited.json()["rate"], unlimited.json()["eta_seconds"]) == ("", None)
    assert bad_rate.status_code == 400 and bad_rate.json()["code"] == "refused"
    assert bad_rate.json()["detail"].startswith("rate 'fast' has no '/'")
    assert no_rate.status_code == 400 and no_rate.json()["code"] == "invalid" and "rate" in no_rate.json()["errors"]
    assert cancelled.json()["status"] == "cancelled" and cancelled.json()["finished_at"] is not None
    assert cancelled.json()["progress"]["not_attempted"] == 2 and cancelled.json()["progress"]["settled"]
    assert cancelled_again.status_code == 400 and "cancelled already" in cancelled_again.json()["detail"]
    rows = audit_rows(pk)
    assert [action for action, _ in rows] == [
        "operation.retry.plan",
        "operation.retry.start",
        "operation.pause",
        "operation.resume",
        "operation.rate",
        "operation.rate",
        "operation.cancel",
    ]
    assert {via for _, via in rows} == {f"API token tests-1 (dlq_{token_prefix(operator)})"}


def test_a_stale_plan_starts_only_when_confirmed(api_for: ApiFor, operator: User, celery_queue: str) -> None:
    letters = many(2)
    client = api_for(operator)
    pk = plan(client, kind="archive", filter={"ids": [row.pk for row in letters]}).json()["id"]
    Operation.objects.filter(pk=pk).update(created_at=timezone.now() - dt.timedelta(minutes=20))

    shown = client.get(f"/api/v1/operations/{pk}/").json()
    refused = client.post(f"/api/v1/operations/{pk}/start/", {}, format="json")
    started = client.post(f"/api/v1/operations/{pk}/start/", {"stale_confirmed": True}, format="json")

    assert [warning["code"] for warning in shown["warnings"]] == ["stale_plan"]
    assert refused.status_code == 400 and "20 minutes ago" in refused.json()["detail"]
    assert 'Send "stale_confirmed": true to start it anyway' in refused.json()["detail"]
    assert started.status_code == 200 and started.json()["status"] == "running"


@pytest.mark.parametrize(
    ("body", "code", "words"),
    [
        ({"kind": "retry", "filter": {"queue": ["orders.dlq"]}, "rate": "fast"}, "refused", "rate 'fast'"),
        ({"kind": "retry", "filter": {"queue": ["orders.dlq"]}, "rate": "0/1s"}, "refused", "at least 1"),
        ({"kind": "archive", "filter": {"queue": ["orders.dlq"]}, "rate": "5/1s"}, "refused", "takes no rate"),
        ({"kind": "retry", "filter": {"pattern": ["three"]}}, "invalid", "filter: pattern:"),
        ({"kind": "retry", "filter": {"queues": ["orders.dlq"]}}, "invalid", "Not a field of this request"),
        ({"kind": "retry", "filter": {"since": "yesterday-ish"}}, "refused", "yesterday-ish"),
        ({"kind": "retry", "filter": {"status": ["archived"]}}, "refused", "cannot act on"),
        ({"kind": "retry", "filter": {}}, "refused", "needs a filter"),
        ({"kind": "retry", "filter": {"queue": []}}, "refused", "needs a filter"),
        ({"kind": "retry"}, "invalid", "filter: This field is required."),
        ({"kind": "shred", "filter": {"queue": ["orders.dlq"]}}, "invalid", "kind:"),
        ({"kind": "retry", "filter": {"queue": ["orders.dlq"]}, "target_queue": "x"}, "refused", "only a move"),
        ({"kind": "move", "filter": {"queue": ["orders.dlq"]}}, "refused", "needs a target queue"),
        (
            {"kind": "move", "filter": {"queue": ["orders.dlq"]}, "target_queue": "x", "target_broker": "nope"},
            "refused",
            "cannot move there",
        ),
        ({"kind": "retry", "filter": {"queue": ["orders.dlq"]}, "limit": 0}, "refused", "the limit"),
        ({"kind": "retry", "filter": {"queue": ["orders.dlq"]}, "canary": -1}, "refused", "canary size"),
        ({"kind": "retry", "filter": {"queue": ["orders.dlq"]}, "canary_wait": -1}, "invalid", "canary_wait"),
    ],
)
def test_a_bad_plan_is_400_json_and_plans_nothing(
    api_for: ApiFor, operator: User, body: dict[str, Any], code: str, words: str
) -> None:
    many(2)

    response = api_for(operator).post("/api/v1/operations/", body, format="json")

    assert response.status_code == 400
    answer = response.json()
    assert answer["code"] == code and words in answer["detail"], answer
    assert Operation.objects.count() == 0
    assert not AuditEntry.objects.filter(action__startswith="operation.").exists()


def test_a_viewer_reads_operations_and_gets_403_on_every_change(api_for: ApiFor, viewer: User, operator: User) -> None:
    letters = many(2)
    operation = plan_operation(kind="archive", filter={"ids": [row.pk for row in letters]}, actor=operator)
    client = api_for(viewer)

    assert client.get("/api/v1/operations/").json()["results"][0]["id"] == operation.pk
    assert client.get(f"/api/v1/operations/{operation.pk}/").json()["total"] == 2
    refused = [plan(client, kind="archive", filter={"ids": [letters[0].pk]})]
    refused += [
        client.post(f"/api/v1/operations/{pk}/{action}/", {"rate": "5/1s", "confirm_count": 2}, format="json")
        for action in CONTROLS
        for pk in (operation.pk, 999_999)  # whatever it names
    ]

    for response in refused:
        assert response.status_code == 403
        assert response.json() == {"detail": "This needs the operator role.", "code": "permission_denied"}
    operation.refresh_from_db()
    assert (operation.status, Operation.objects.count()) == (OperationStatus.PLANNED, 1)
    assert not AuditEntry.objects.filter(actor_name="vera-viewer").exists()


def test_anonymous_and_stopped_tokens_get_401(operator: User) -> None:
    letters = many(1)
    operation = plan_operation(kind="archive", filter={"ids": [letters[0].pk]}, actor=operator)
    token = token_for(operator)

    revoke_tokens(list(ApiToken.objects.filter(user=operator)), actor=operator)
    for client in (api_client(), api_client(token)):
        for response in (
            client.get("/api/v1/operations/"),
            client.get(f"/api/v1/operations/{operation.pk}/"),
            client.post("/api/v1/operations/", {"kind": "archive", "filter": {"ids": [1]}}, format="json"),
            client.post(f"/api/v1/operations/{operation.pk}/start/", {}, format="json"),
        ):
            assert response.status_code == 401
    assert Operation.objects.get().status == OperationStatus.PLANNED


def test_the_list_filters_as_the_operations_page_and_pages_by_cursor(
    api_for: ApiFor, viewer: User, operator: User
) -> None:
    letters = many(3)
    archives = [plan_operation(kind="archive", filter={"ids": [row.pk]}, actor=operator) for row in letters]
    cancel_operation(operation=archives[0], actor=operator)
    retry = plan_operation(kind="retry", filter={"ids": [letters[0].pk]}, actor=operator)
    client = api_for(viewer)

    def ids(query: str) -> list[int]:
        response = client.get(f"/api/v1/operations/{query}")
        assert response.status_code == 200, response.json()
        return [row["id"] for row in response.json()["results"]]

    assert ids("") == [retry.pk, archives[2].pk, archives[1].pk, archives[0].pk]
    assert ids("?kind=archive") == [archives[2].pk, archives[1].pk, archives[0].pk]
    assert ids("?status=cancelled") == [archives[0].pk]
    assert ids("?status=unfinished&kind=archive") == [archives[2].pk, archives[1].pk]
    assert ids("?broker=default") == [retry.pk, archives[2].pk, archives[1].pk, archives[0].pk]
    first = client.get("/api/v1/operations/?limit=2").json()
    second = client.get(first["next"]).json()
    assert [row["id"] for row in first["results"] + second["results"]] == ids("")
    assert second["next"] is None
    # A cancelled plan's messages were never attempted; the list counts them as the page does.
    cancelled = client.get("/api/v1/operations/?status=cancelled").json()["results"][0]
    assert cancelled["outcome"] == "Discarded (never started)"
    assert cancelled["progress"]["not_attempted"] == 1 and cancelled["progress"]["skipped"] == 0
    for query, field in (("?status=lost", "status"), ("?kind=shred", "kind"), ("?broker=nowhere", "broker")):
        refused = client.get(f"/api/v1/operations/{query}")
        assert refused.status_code == 400 and field in refused.json()["errors"]


def test_an_unknown_operation_is_json_404(api_for: ApiFor, operator: User) -> None:
    client = api_for(operator)
    for response in (
        client.get("/api/v1/operations/999999/"),
        client.post("/api/v1/operations/999999/pause/", {}, format="json"),
    ):
        assert response.status_code == 404 and response.json()["code"] == "not_found"


def test_every_action_is_in_the_schema(api_for: ApiFor, viewer: User) -> None:
    schema = api_for(viewer).get("/api/v1/openapi.json").json()
    found = {
        operation["operationId"]
        for path, methods in schema["paths"].items()
        if path.startswith("/api/v1/operations/")
        for operation in methods.values()
    }
    assert found == {
        "operations_list",
        "operations_retrieve",
        "operations_plan",
        "operations_start",
        "operations_pause",
        "operations_resume",
        "operations_cancel",
        "operations_rate",
    }


def test_an_operation_waiting_for_a_breaker_says_what_for(api_for: ApiFor, viewer: User, operator: User) -> None:
    until = timezone.now() + dt.timedelta(seconds=40)
    operation = Operation.objects.create(
        kind="retry",
        status=OperationStatus.RUNNING,
        created_by=operator,
        breaker_wait="circuit open for queue orders, probing at 07:45:10 UTC",
        breaker_wait_until=until,
    )

    shown = api_for(viewer).get(f"/api/v1/operations/{operation.pk}/").json()

    assert shown["breaker_wait"] == "circuit open for queue orders, probing at 07:45:10 UTC"
    assert dt.datetime.fromisoformat(shown["breaker_wait_until"]) == until
