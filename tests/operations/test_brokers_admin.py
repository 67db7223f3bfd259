"""Brokers in the admin's operations, in retry policies and in a purge's record: the admin's confirmation page says
when a selection spans brokers and offers a move's target broker, a retry policy may cover one broker and its
automatic retries go back to that broker, and what a purge deleted names each dead letter's broker."""

from __future__ import annotations

import csv
import datetime as dt
import io
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.http import StreamingHttpResponse
from django.test import Client
from django.urls import reverse
from pika.adapters.blocking_connection import BlockingChannel as Channel

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.deadletters.models import DeadLetter
from dlqconsole.operations.models import Operation, OperationKind, OperationStatus, RetryPolicy
from dlqconsole.operations.planning import plan_operation
from dlqconsole.operations.policies import schedule_new_dead_letters, start_due_retries
from dlqconsole.operations.services import run_operation
from tests.conftest import client_for
from tests.operations.conftest import SecondBroker, TwoBrokers
from tests.support import drain, wait_for_depth

pytestmark = pytest.mark.django_db
CHANGELIST = "admin:deadletters_deadletter_changelist"


@pytest.fixture
def superuser_client(client: Client) -> Client:
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw-root"))
    return client


def act(client: Client, action: str, ids: list[int], **extra: str) -> Any:
    data = {"action": action, "_selected_action": [str(pk) for pk in ids], **extra}
    if "step" not in extra:
        data["index"] = "0"
    return client.post(reverse(CHANGELIST), data)


def all_ids(world: TwoBrokers) -> list[int]:
    return [letter.pk for letter in world.on_default + world.on_staging]


def test_the_admins_retry_confirmation_says_the_selection_spans_two_brokers(
    superuser_client: Client, two_brokers: TwoBrokers
) -> None:
    html = act(superuser_client, "retry_selected", all_ids(two_brokers)).content.decode()

    assert "This retry spans 2 brokers: staging 3, default 2." in html
    assert "<th>Broker</th>" in html and "<td>staging</td><td>3</td>" in html
    assert f"staging · {two_brokers.orders}.dlq" in html
    assert not Operation.objects.exists()


def test_the_admins_move_offers_the_target_broker_and_moves_there(
    superuser_client: Client,
    channel: Channel,
    staging: SecondBroker,
    two_brokers: TwoBrokers,
    queue_name: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    parking = queue_name("parking")
    staging.channel.queue_declare(queue=parking, durable=True)
    ids = [letter.pk for letter in two_brokers.on_default]

    first = act(superuser_client, "move_selected", ids).content.decode()
    with django_capture_on_commit_callbacks():
        started = act(
            superuser_client, "move_selected", ids, step="start", target_queue=parking, target_broker="staging"
        )

    assert 'name="target_broker"' in first and '<option value="staging">staging</option>' in first
    assert started.status_code == 302
    operation = Operation.objects.get()
    assert operation.target_broker is not None and operation.target_broker.name == "staging"
    run_operation(operation_id=operation.pk)
    assert wait_for_depth(staging.channel, parking, 2) == 2
    assert superuser_client.get(reverse("admin:operations_operation_change", args=[operation.pk])).status_code == 200


def test_a_retry_policy_covers_one_broker_and_retries_back_to_it(
    superuser_client: Client, channel: Channel, staging: SecondBroker, two_brokers: TwoBrokers
) -> None:
    added = superuser_client.post(
        reverse("admin:operations_retrypolicy_add"),
        {
            "name": "staging orders",
            "enabled": "on",
            "broker": str(staging.row.pk),
            "queue": two_brokers.orders + ".dlq",
            "failure_reason": "",
            "delays": "60",
            "max_attempts": "3",
            "rate": "",
        },
    )
    listed = superuser_client.get(reverse("admin:operations_retrypolicy_changelist")).content.decode()

    assert added.status_code == 302
    policy = RetryPolicy.objects.get()
    assert policy.broker == staging.row
    assert '"broker": "staging"' in AuditEntry.objects.get(action="retrypolicy.add").detail
    assert "field-broker" in listed and ">staging</td>" in listed

    later = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5)
    schedule_new_dead_letters(now=later)
    operations = start_due_retries(now=later + dt.timedelta(minutes=2))
    for operation in operations:
        run_operation(operation_id=operation.pk)

    (operation,) = operations
    operation.refresh_from_db()
    assert (operation.status, operation.succeeded, operation.breakdown["brokers"]) == (
        OperationStatus.DONE,
        3,
        {"staging": 3},
    )
    orders = two_brokers.orders
    assert wait_for_depth(staging.channel, orders, 3) == 3
    assert sorted(body for _, body in drain(staging.channel, orders)) == [b"staging 0", b"staging 1", b"staging 2"]
    assert channel.queue_declare(queue=orders, passive=True).method.message_count == 0
    assert set(DeadLetter.objects.filter(broker__name="default").values_list("status", flat=True)) == {"parked"}


def test_a_purge_records_each_dead_letters_broker(
    admin_user: User, two_brokers: TwoBrokers, django_capture_on_commit_callbacks: Any
) -> None:
    ids = all_ids(two_brokers)
    operation = plan_operation(kind="purge", filter={"ids": ids}, actor=admin_user)
    with django_capture_on_commit_callbacks(execute=True):
        client_for(admin_user).post(f"/operations/{operation.pk}/start/", {"typed_count": str(len(ids))})
    run_operation(operation_id=operation.pk)

    download = client_for(admin_user).get(f"/operations/{operation.pk}/purged.csv")
    assert isinstance(download, StreamingHttpResponse)
    text = b"".join(download.streaming_content).decode()  # type: ignore[arg-type]
    rows = list(csv.DictReader(io.StringIO(text)))
    staging_ids = {letter.pk for letter in two_brokers.on_staging}
    assert sorted((int(row["dead_letter_id"]), row["broker_name"]) for row in rows) == sorted(
        (pk, "staging" if pk in staging_ids else "default") for pk in ids
    )
    assert all(row["source_queue"] == two_brokers.orders + ".dlq" for row in rows)


def test_the_operations_list_filters_by_broker(two_brokers: TwoBrokers, operator: User) -> None:
    on_staging = plan_operation(kind=OperationKind.RETRY, filter={"broker": ["staging"]}, actor=operator)
    on_default = plan_operation(kind=OperationKind.RETRY, filter={"broker": ["default"]}, actor=operator)
    client = client_for(operator)

    html = client.get("/operations/?broker=staging").content.decode()
    assert f"/operations/{on_staging.pk}/" in html and f"/operations/{on_default.pk}/" not in html
    html = client.get("/operations/?broker=default").content.decode()
    assert f"/operations/{on_default.pk}/" in html and f"/operations/{on_staging.pk}/" not in html
    assert 'name="broker"' in html
