"""The operations test world: the broker channel, this run's Celery queue emptied after each test, and a database
that refuses chosen deletions. Queues, workers and dead letters come from tests/support.py and tests/factories.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pika
import pytest
from django.conf import settings
from django.db import connection
from pika.adapters.blocking_connection import BlockingChannel as Channel

from dlqconsole.core.amqp import connect
from dlqconsole.deadletters.models import DeadLetter


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
