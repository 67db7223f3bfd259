"""The plan tells what the destination queues look like before anything is replayed into them."""

from __future__ import annotations

import pytest
from django.test import Client

from dlqconsole.operations.models import OperationKind
from dlqconsole.operations.planning import plan_operation
from tests.support import declare_with_dlq, ingest_from, kill_on_broker, wait_for_depth

pytestmark = pytest.mark.django_db


def test_plan_records_depth_and_consumers_of_each_destination_queue(channel, queue_name, operator):
    orders, billing = queue_name("orders"), queue_name("billing")
    for queue in (orders, billing):
        declare_with_dlq(channel, queue)
        channel.basic_publish(exchange="", routing_key=queue, body=b"dies")
        kill_on_broker(channel, queue, 1)
        wait_for_depth(channel, queue + ".dlq", 1)
        ingest_from(channel, queue + ".dlq")
    for n in range(3):  # a backlog the replay would join
        channel.basic_publish(exchange="", routing_key=orders, body=f"waiting {n}".encode())
    wait_for_depth(channel, orders, 3)
    channel.basic_consume(queue=billing, on_message_callback=lambda *args: None)  # billing has a consumer

    operation = plan_operation(
        kind=OperationKind.RETRY, filter={"queue": [orders + ".dlq", billing + ".dlq"]}, actor=operator
    )

    assert operation.destination_queues == sorted([(orders, 3, 0), (billing, 0, 1)])
    client = Client()
    client.force_login(operator)
    page = client.get(f"/operations/{operation.pk}/").content.decode()
    table = page[page.index('data-testid="destination-queues"') :]
    table = table[: table.index("</table>")]
    assert orders in table and billing in table
    assert table.count("no consumer") == 1
