"""The operations test world: the broker channel, this run's Celery queue emptied after each test, a second broker
(a vhost of its own), and a database that refuses chosen deletions. Queues, workers and dead letters come from
tests/support.py and tests/factories.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pika
import pytest
from django.conf import settings
from django.db import connection
from pika.adapters.blocking_connection import BlockingChannel as Channel

from dlqconsole.brokers import registry
from dlqconsole.brokers.models import Broker
from dlqconsole.core.amqp import connect
from dlqconsole.deadletters.models import DeadLetter
from tests.support import Vhost, declare_with_dlq, die_on_broker, ingest_from, rabbitmqctl, vhost_broker, wait_for_depth


@pytest.fixture
def channel(amqp_channel: Channel) -> Channel:
    return amqp_channel


@pytest.fixture(autouse=True)
def _purge_celery_queue() -> Iterator[None]:
    """Tasks one test enqueued must not run in the next test's worker."""
    yield
    connection_ = connect(settings.AMQP_URL)
    try:
        channel_ = connection_.channel()
        channel_.queue_declare(queue=settings.CELERY_TASK_DEFAULT_QUEUE, durable=True)
        channel_.queue_purge(queue=settings.CELERY_TASK_DEFAULT_QUEUE)
    except pika.exceptions.AMQPError:
        pass
    finally:
        if connection_.is_open:
            connection_.close()


@pytest.fixture
def refuse_deleting() -> Iterator[Callable[[int], None]]:
    """A database fault on the deletion of chosen dead letters (a PostgreSQL trigger raises), so the batch holding
    one rolls back the way a batch cut short by a lost connection or a killed worker does. Call it with the id of
    a dead letter whose deletion is to fail."""
    table = connection.ops.quote_name(DeadLetter._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE test_refused_deletion (id bigint PRIMARY KEY)")
        cursor.execute(
            "CREATE FUNCTION test_refuse_deletion() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "IF EXISTS (SELECT 1 FROM test_refused_deletion WHERE id = OLD.id) THEN "
            "RAISE EXCEPTION 'deletion of % refused', OLD.id; END IF; RETURN OLD; END $$"
        )
        cursor.execute(
            f"CREATE TRIGGER test_refuse_deletion BEFORE DELETE ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION test_refuse_deletion()"
        )

    def refuse(dead_letter_id: int) -> None:
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO test_refused_deletion (id) VALUES (%s)", [dead_letter_id])

    yield refuse
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TRIGGER IF EXISTS test_refuse_deletion ON {table}")
        cursor.execute("DROP FUNCTION IF EXISTS test_refuse_deletion()")
        cursor.execute("DROP TABLE IF EXISTS test_refused_deletion")


@dataclass
class SecondBroker:
    """The broker `staging` of a test: a vhost of its own on the local RabbitMQ, named in DLQ_BROKERS."""

    name: str
    vhost: Vhost
    channel: Channel

    @property
    def url(self) -> str:
        return self.vhost.url

    @property
    def row(self) -> Broker:
        return registry.get(self.name)

    def depth(self, queue: str) -> int:
        return int(self.channel.queue_declare(queue=queue, passive=True).method.message_count)

    def revoke(self) -> None:
        """Take guest's permissions on the vhost away: the broker refuses every new connection."""
        rabbitmqctl("clear_permissions", "-p", self.vhost.name, "guest")

    def grant(self) -> None:
        self.vhost.grant()


@pytest.fixture
def staging(settings: Any) -> Iterator[SecondBroker]:
    """A second broker, `staging`, beside default (tests/support.py vhost_broker), and a channel on it."""
    with vhost_broker(settings, "staging") as vhost:
        amqp = connect(vhost.url)
        try:
            yield SecondBroker(name="staging", vhost=vhost, channel=amqp.channel())
        finally:
            if amqp.is_open:
                amqp.close()


ERROR = {"x-exception-message": "Connection refused to inventory-service:8080"}


@dataclass
class TwoBrokers:
    """`orders` on both brokers, two dead letters of it on default and three on staging, all of one pattern."""

    orders: str
    on_default: list[DeadLetter]
    on_staging: list[DeadLetter]

    @property
    def pattern_id(self) -> int:
        return self.on_default[0].pattern_id


@pytest.fixture
def two_brokers(channel: Channel, staging: SecondBroker, queue_name: Any) -> TwoBrokers:
    orders = queue_name("orders")
    for on in (channel, staging.channel):
        declare_with_dlq(on, orders)
    die_on_broker(channel, orders, [b"default 0", b"default 1"], headers=ERROR)
    die_on_broker(staging.channel, orders, [b"staging 0", b"staging 1", b"staging 2"], headers=ERROR)
    assert wait_for_depth(channel, orders + ".dlq", 2) == 2
    assert wait_for_depth(staging.channel, orders + ".dlq", 3) == 3
    world = TwoBrokers(
        orders=orders,
        on_default=ingest_from(channel, orders + ".dlq", broker=registry.default_broker(), expect=2),
        on_staging=ingest_from(staging.channel, orders + ".dlq", broker=staging.row, expect=3),
    )
    # Patterns are global: the same failure on two brokers is one pattern.
    assert {letter.pattern_id for letter in world.on_default + world.on_staging} == {world.pattern_id}
    return world
