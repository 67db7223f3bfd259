"""Shed from the dashboard's backpressure panel (admins only, with the typed confirmation), from the `dlq` command,
and a shed operation on the operations pages and in the API."""

from __future__ import annotations

import re
from collections.abc import Callable
from io import StringIO
from typing import Any

import pika
import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client
from pika.adapters.blocking_connection import BlockingChannel as Channel

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.deadletters.models import DeadLetter, FailureReason
from dlqconsole.ingest.models import WatchedQueue
from dlqconsole.operations.models import Operation, OperationKind, OperationStatus
from dlqconsole.operations.services import run_operation
from tests.api.conftest import api_client, token_for
from tests.conftest import client_for
from tests.support import drain, wait_for_depth

pytestmark = pytest.mark.django_db


@pytest.fixture
def flooded(channel: Channel, queue_name: Callable[[str], str]) -> str:
    """A classic priority queue holding three low-priority messages and two high ones, watched by the console."""
    queue = queue_name("orders")
    channel.queue_declare(queue=queue, durable=True, arguments={"x-max-priority": 10})
    for number, priority in enumerate((1, 9, 2, 9, 0)):
        channel.basic_publish("", queue, f"order {number}".encode(), pika.BasicProperties(priority=priority))
    wait_for_depth(channel, queue, 5)
    WatchedQueue.objects.create(name=queue, dead_letter_queue=f"{queue}.dlq", dead_letter_exchange=f"{queue}.dlx")
    return queue


def test_only_an_admin_sees_the_shed_link_on_the_backpressure_panel(
    flooded: str, admin_user: User, operator: User, viewer: User
) -> None:
    pages = {user.username: client_for(user).get("/").content.decode() for user in (admin_user, operator, viewer)}

    assert 'data-testid="shed-link"' in pages[admin_user.username]
    assert f"/operations/shed/?queue={flooded}&amp;broker=default" in pages[admin_user.username]
    assert 'data-testid="shed-link"' not in pages[operator.username]
    assert 'data-testid="shed-link"' not in pages[viewer.username]


def test_a_quorum_work_queue_offers_no_shed_link(flooded: str, admin_user: User) -> None:
    """A shed of a quorum queue is refused (requeues count toward its delivery limit): the panel does not offer it."""
    WatchedQueue.objects.filter(name=flooded).update(kind=WatchedQueue.Kind.QUORUM)

    page = client_for(admin_user).get("/").content.decode()

    assert flooded in page
    assert 'data-testid="shed-link"' not in page


def test_operators_and_viewers_get_403_on_the_shed_page_and_plan_nothing(
    flooded: str, operator: User, viewer: User
) -> None:
    for user in (operator, viewer):
        client = client_for(user)
        assert client.get(f"/operations/shed/?queue={flooded}").status_code == 403
        assert client.post("/operations/shed/", {"queue": flooded, "priority_below": "5"}).status_code == 403
    assert not Operation.objects.exists()
    assert not AuditEntry.objects.filter(action__startswith="operation.shed").exists()


def test_an_admin_plans_a_shed_and_starts_it_only_with_the_depth_typed(
    flooded: str, admin_user: User, channel: Channel, celery_queue: str, django_capture_on_commit_callbacks: Any
) -> None:
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(admin_user)
    form = strict.get(f"/operations/shed/?queue={flooded}&broker=default")
    assert form.status_code == 200 and f'value="{flooded}"' in form.content.decode()
    token = form.cookies["csrftoken"].value
    assert strict.post("/operations/shed/", {"queue": flooded, "priority_below": "5"}).status_code == 403

    planned = strict.post("/operations/shed/", {"queue": flooded, "priority_below": "5", "csrfmiddlewaretoken": token})

    operation = Operation.objects.get()
    assert planned.status_code == 302 and planned["Location"] == f"/operations/{operation.pk}/"
    assert (operation.kind, operation.total, operation.status) == (OperationKind.SHED, 5, OperationStatus.PLANNED)
    page = " ".join(strict.get(f"/operations/{operation.pk}/").content.decode().split())
    assert f"/operations/shed/?queue={flooded}" in page
    assert 'data-testid="typed-count"' in page and "5 ready, 0 consumers; classic queue, x-max-priority 10" in page
    assert "Start: scan 5 messages, shed the matching ones" in page
    wrong = strict.post(f"/operations/{operation.pk}/start/", {"typed_count": "4", "csrfmiddlewaretoken": token})
    assert wrong.status_code == 409 and "Nothing was shed" in wrong.content.decode()
    operation.refresh_from_db()
    assert operation.status == OperationStatus.PLANNED
    assert AuditEntry.objects.filter(action="operation.shed.start_refused").exists()

    with django_capture_on_commit_callbacks(execute=False):
        started = strict.post(f"/operations/{operation.pk}/start/", {"typed_count": "5", "csrfmiddlewaretoken": token})
    assert started.status_code == 302
    run_operation(operation_id=operation.pk)

    operation.refresh_from_db()
    assert (operation.status, operation.succeeded, operation.skipped) == (OperationStatus.DONE, 3, 2)
    done = " ".join(strict.get(f"/operations/{operation.pk}/").content.decode().split())
    assert "looked at 5" in done and "3</strong> shed, 0 failed, 2 left in the queue" in done
    assert 'data-testid="status">Done<' in done
    link = f"/messages/?queue={flooded}&amp;reason=SHED&amp;status=archived"
    assert f'<a href="{link}" data-testid="shed-messages">' in done
    shown = " ".join(strict.get(link.replace("&amp;", "&")).content.decode().split())
    ids = sorted(DeadLetter.objects.filter(failure_reason=FailureReason.SHED).values_list("pk", flat=True))
    assert sorted({int(found) for found in re.findall(r'href="/messages/(\d+)/"', shown)}) == ids
    assert sorted(body for _, body in drain(channel, flooded)) == [b"order 1", b"order 3"]
    listed = strict.get("/operations/").content.decode()
    assert f"/operations/{operation.pk}/" in listed


def test_an_operator_cannot_start_an_admins_shed(flooded: str, admin_user: User, operator: User) -> None:
    client_for(admin_user).post("/operations/shed/", {"queue": flooded, "priority_below": "5"})
    operation = Operation.objects.get()

    refused = client_for(operator).post(f"/operations/{operation.pk}/start/", {"typed_count": "5"})

    assert refused.status_code == 403
    operation.refresh_from_db()
    assert operation.status == OperationStatus.PLANNED


def test_the_shed_page_shows_a_refusal_escaped(admin_user: User, queue_name: Callable[[str], str]) -> None:
    hostile = queue_name("<script>alert(1)</script>")

    response = client_for(admin_user).post("/operations/shed/", {"queue": hostile, "priority_below": "5"})

    page = response.content.decode()
    assert response.status_code == 400 and "does not exist" in page
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    bad = client_for(admin_user).post("/operations/shed/", {"queue": hostile, "priority_below": "high"})
    assert bad.status_code == 400 and "whole numbers" in bad.content.decode()
    assert not Operation.objects.exists()


def test_the_cli_sheds_inline_and_says_why_it_stopped(flooded: str, admin_user: User) -> None:
    out = StringIO()

    call_command(
        "dlq", "shed", flooded, "--priority-below", "2", "--yes", "--inline", "--user", admin_user.username, stdout=out
    )

    text = out.getvalue()
    assert f"shed queue {flooded} priority below 2" in text and "Started operation #" in text
    assert "Stopped: looked at 5 messages, as many as the queue held when the scan began." in text
    assert sorted(
        bytes(body)
        for body in DeadLetter.objects.filter(failure_reason=FailureReason.SHED).values_list("body", flat=True)
    ) == [b"order 0", b"order 4"]


def test_the_cli_refuses_a_missing_queue_and_a_bad_age(queue_name: Callable[[str], str], admin_user: User) -> None:
    with pytest.raises(CommandError, match="does not exist"):
        call_command("dlq", "shed", queue_name("missing"), "--priority-below", "5", "--yes", "--user", "ada-admin")
    with pytest.raises(CommandError, match="--older-than"):
        call_command("dlq", "shed", "orders", "--priority-below", "5", "--older-than", "soon", "--yes")
    assert not Operation.objects.exists()


def test_the_cli_dry_run_plans_nothing(flooded: str, admin_user: User) -> None:
    out = StringIO()

    call_command("dlq", "shed", flooded, "--priority-below", "5", "--dry-run", stdout=out)

    assert "Plan (dry run): shed queue" in out.getvalue() and "Dry run: nothing was taken." in out.getvalue()
    assert not Operation.objects.exists()


def test_the_api_shows_a_shed_and_asks_for_its_count(flooded: str, admin_user: User) -> None:
    client_for(admin_user).post("/operations/shed/", {"queue": flooded, "priority_below": "5"})
    operation = Operation.objects.get()

    api = api_client(token_for(admin_user))
    answer = api.get(f"/api/v1/operations/{operation.pk}/")

    assert answer.status_code == 200
    body = answer.json()
    assert body["kind"] == "shed" and body["confirm_count"] == 5
    assert body["breakdown"]["shed"]["queue"] == flooded and body["breakdown"]["shed"]["max_priority"] == 10
    assert body["target"]["display"] == f"from queue {flooded}"
    assert api.get("/api/v1/operations/?kind=shed").json()["results"][0]["id"] == operation.pk


def test_a_hostile_queue_name_is_shown_escaped(
    channel: Channel, queue_name: Callable[[str], str], admin_user: User
) -> None:
    queue = queue_name("<img src=x onerror=alert(1)>")
    channel.queue_declare(queue=queue, durable=True, arguments={"x-max-priority": 10})
    channel.basic_publish("", queue, b"x", pika.BasicProperties(priority=0))
    wait_for_depth(channel, queue, 1)
    WatchedQueue.objects.create(name=queue, dead_letter_queue=f"{queue}.dlq", dead_letter_exchange=f"{queue}.dlx")
    client = client_for(admin_user)

    dashboard = client.get("/").content.decode()
    client.post("/operations/shed/", {"queue": queue, "priority_below": "5"})
    operation = Operation.objects.get()
    detail = client.get(f"/operations/{operation.pk}/").content.decode()
    listed = client.get("/operations/").content.decode()

    assert "queue=t" in dashboard and "%3Cimg%20src%3Dx%20onerror%3Dalert%281%29%3E" in dashboard
    assert "&lt;img src=x onerror=alert(1)&gt;" in detail
    for page in (dashboard, detail, listed):
        assert "<img src=x" not in page


@pytest.mark.parametrize(
    "fields",
    [
        {"priority_below": "٥"},
        {"priority_below": "5", "limit": "٣"},
        {"priority_below": "²"},
        {"priority_below": "5", "limit": "9" * 5000},
    ],
)
def test_the_shed_page_takes_only_ascii_whole_numbers(flooded: str, admin_user: User, fields: dict[str, str]) -> None:
    response = client_for(admin_user).post("/operations/shed/", {"queue": flooded, **fields})

    assert response.status_code == 400 and "whole numbers" in response.content.decode()
    assert not Operation.objects.exists()


def test_a_broker_name_that_is_not_one_is_refused_on_the_page_and_in_the_cli(flooded: str, admin_user: User) -> None:
    for broker in ("\x00", "x" * 5000, "a b"):
        response = client_for(admin_user).post(
            "/operations/shed/", {"queue": flooded, "priority_below": "5", "broker": broker}
        )
        assert response.status_code == 400 and "is not a broker name" in response.content.decode()
    with pytest.raises(CommandError, match="is not a broker name"):
        call_command(
            "dlq", "shed", flooded, "--priority-below", "5", "--broker", "\x00", "--yes", "--user", "ada-admin"
        )
    assert not Operation.objects.exists()


def test_the_cli_takes_only_ascii_whole_numbers(flooded: str, admin_user: User) -> None:
    with pytest.raises(CommandError, match="--priority-below"):
        call_command("dlq", "shed", flooded, "--priority-below", "٥", "--yes", "--user", admin_user.username)
    with pytest.raises(CommandError, match="--limit"):
        call_command(
            "dlq", "shed", flooded, "--priority-below", "5", "--limit", "٣", "--yes", "--user", admin_user.username
        )
    assert not Operation.objects.exists()
