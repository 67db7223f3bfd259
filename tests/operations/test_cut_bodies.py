"""A body over DLQ_MAX_BODY_BYTES is stored cut, so it cannot be replayed: what a retry would send is not the
message that died. The plan says so, the run refuses it, and no retry policy schedules it."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pika
import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from dlqconsole.deadletters.models import DeadLetter
from dlqconsole.ingest.envelope import parse_envelope
from dlqconsole.ingest.services import ingest_batch
from dlqconsole.operations.models import ItemStatus, OperationKind, RetryPolicy
from dlqconsole.operations.planning import plan_operation
from dlqconsole.operations.policies import schedule_new_dead_letters
from dlqconsole.operations.services import run_operation, start_operation
from dlqconsole.operations.taking import CUT_BODY
from tests.conftest import client_for
from tests.support import declare_with_dlq, drain

pytestmark = pytest.mark.django_db


def dead_letters(queue: str, bodies: list[bytes]) -> list[DeadLetter]:
    now = timezone.now()
    letters = [
        parse_envelope(
            source_queue=f"{queue}.dlq",
            body=body,
            properties=pika.BasicProperties(
                message_id=f"m-{index}",
                headers={
                    "x-death": [
                        {"count": 1, "reason": "rejected", "queue": queue, "exchange": "", "routing-keys": [queue]}
                    ]
                },
            ),
            now=now,
        )
        for index, body in enumerate(bodies)
    ]
    ingest_batch(letters=letters, now=now)
    return list(DeadLetter.objects.filter(source_queue=f"{queue}.dlq").order_by("message_id"))


def test_a_cut_body_is_stored_with_its_size_and_is_not_replayed(
    settings: Any, operator: User, channel: Any, queue_name: Any
) -> None:
    settings.DLQ_MAX_BODY_BYTES = 2048
    orders = queue_name("orders")
    declare_with_dlq(channel, orders)
    whole, cut = dead_letters(orders, [b"x" * 2048, b"y" * 5000])

    operation = plan_operation(kind=OperationKind.RETRY, filter={"queue": [f"{orders}.dlq"]}, actor=operator)
    start_operation(operation=operation, actor=operator)
    run_operation(operation_id=operation.pk)

    assert (whole.body_truncated, len(whole.body), whole.body_size) == (False, 2048, 2048)
    assert (cut.body_truncated, len(cut.body), cut.body_size) == (True, 2048, 5000)
    assert "over DLQ_MAX_BODY_BYTES" in cut.parse_errors[-1]
    operation.refresh_from_db()
    assert operation.unreplayable_reasons == {CUT_BODY: 1}
    item = operation.items.get(dead_letter=cut)
    assert (item.status, item.error) == (ItemStatus.FAILED, CUT_BODY)
    assert [body for _, body in drain(channel, orders)] == [b"x" * 2048]


def test_no_retry_policy_schedules_a_cut_body(settings: Any, queue_name: Any) -> None:
    settings.DLQ_MAX_BODY_BYTES = 1024
    orders = queue_name("orders")
    whole, cut = dead_letters(orders, [b"ok", b"z" * 4096])
    RetryPolicy.objects.create(name="all", queue=f"{orders}.dlq", delays=[60], permanent_reasons=[])

    schedule_new_dead_letters(now=timezone.now() + dt.timedelta(minutes=5))

    whole.refresh_from_db()
    cut.refresh_from_db()
    assert (whole.status, cut.status) == ("scheduled", "parked")


def test_the_message_page_says_a_body_was_cut(settings: Any, viewer: User, queue_name: Any) -> None:
    settings.DLQ_MAX_BODY_BYTES = 2048
    (cut,) = dead_letters(queue_name("orders"), [b"y" * 5000])

    page = client_for(viewer).get(f"/messages/{cut.pk}/").content.decode()

    # Runs of white space as one space, as a browser shows them (the no-break spaces of the sizes stay).
    notice = re.sub(r"[ \t\r\n]+", " ", page.split('data-testid="body-cut"')[1].split("</p>")[0])
    assert "Cut at ingest: 4.9\xa0KB were delivered, over DLQ_MAX_BODY_BYTES; the first 2.0\xa0KB are kept" in notice
    assert "It cannot be replayed." in notice
