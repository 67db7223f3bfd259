"""consume_dlq over two brokers: two vhosts of the local RabbitMQ, the same queue names on both, one process."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.core.management import call_command
from django.db.models import Sum

from dlqconsole.brokers import registry
from dlqconsole.brokers.models import Broker
from dlqconsole.brokers.services import set_urls
from dlqconsole.core.amqp import connect
from dlqconsole.deadletters.models import ArrivalCount, DeadLetter, DeadLetterCount
from dlqconsole.ingest.broker_consumers import BrokerConsumers
from dlqconsole.ingest.consumer import DeadLetterConsumer
from dlqconsole.ingest.models import IngestStat, WatchedQueue
from tests.ingest.conftest import ConsumerProcess, publish_dead_letters
from tests.support import DeadLetterQueue, Vhost, declare_with_dlq, wait_until

transactional = pytest.mark.django_db(transaction=True)


def watch(queue: DeadLetterQueue, broker: Broker) -> None:
    WatchedQueue.objects.create(
        broker=broker, name=queue.work, dead_letter_queue=queue.dlq, dead_letter_exchange=f"{queue.work}.dlx"
    )


def stored(broker: str) -> int:
    return DeadLetter.objects.filter(broker__name=broker).count()


@transactional
def test_one_consume_dlq_ingests_the_same_queue_of_two_vhosts_and_keeps_them_apart(
    queue_name: Callable[[str], str], amqp_channel: Any, second_channel: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    name = queue_name("orders")
    first, second = declare_with_dlq(amqp_channel, name), declare_with_dlq(second_channel, name)
    watch(first, registry.default_broker())
    watch(second, registry.get("second"))
    # The same messages on both: identical content on two brokers is two dead letters, not a duplicate.
    publish_dead_letters(amqp_channel, first, range(5))
    publish_dead_letters(second_channel, second, range(3))

    call_command("consume_dlq", batch_size=4, exit_when_idle=1)

    assert "8 received, 8 new, 0 duplicates" in capsys.readouterr().out
    assert (stored("default"), stored("second")) == (5, 3)
    assert set(DeadLetter.objects.values_list("source_queue", flat=True)) == {first.dlq}
    cells = dict(
        DeadLetterCount.objects.values_list("broker__name")
        .annotate(total=Sum("count"))
        .values_list("broker__name", "total")
    )
    assert cells == {"default": 5, "second": 3}
    arrivals = dict(
        ArrivalCount.objects.values_list("broker__name")
        .annotate(total=Sum("count"))
        .values_list("broker__name", "total")
    )
    assert arrivals == {"default": 5, "second": 3}
    stats = {stat.broker.name: (stat.received, stat.inserted) for stat in IngestStat.objects.select_related("broker")}
    assert stats == {"default": (5, 5), "second": (3, 3)}
    # The same message dead-lettered on both brokers is stored once for each.
    assert DeadLetter.objects.filter(message_id="m-1").count() == 2


@transactional
def test_broker_option_limits_consume_dlq_to_the_named_broker(
    queue_name: Callable[[str], str], amqp_channel: Any, second_channel: Any
) -> None:
    name = queue_name("orders")
    first, second = declare_with_dlq(amqp_channel, name), declare_with_dlq(second_channel, name)
    watch(first, registry.default_broker())
    watch(second, registry.get("second"))
    publish_dead_letters(amqp_channel, first, range(2))
    publish_dead_letters(second_channel, second, range(4))

    call_command("consume_dlq", broker=["second"], exit_when_idle=1)

    assert (stored("default"), stored("second")) == (0, 4)
    assert int(amqp_channel.queue_declare(queue=first.dlq, passive=True).method.message_count) == 2


@transactional
def test_an_unknown_broker_is_a_clear_error() -> None:
    with pytest.raises(Exception, match="no broker named 'nope' \\(known: default"):
        call_command("consume_dlq", broker=["nope"], exit_when_idle=1)


@transactional
def test_a_vhost_that_refuses_us_never_stops_the_other_and_is_consumed_again_when_access_returns(
    queue_name: Callable[[str], str],
    amqp_channel: Any,
    second_channel: Any,
    second_vhost: Vhost,
    consume_dlq: Callable[..., ConsumerProcess],
) -> None:
    name = queue_name("orders")
    first, second = declare_with_dlq(amqp_channel, name), declare_with_dlq(second_channel, name)
    watch(first, registry.default_broker())
    watch(second, registry.get("second"))
    process = consume_dlq("--processes", "1", "--refresh-seconds", "0.5", DLQ_BROKERS=f"second={second_vhost.url}")
    # Not waiting for the DLQs to fill: the consumer empties them as they do.
    publish_dead_letters(amqp_channel, first, range(2), wait=False)
    publish_dead_letters(second_channel, second, range(2), wait=False)
    assert wait_until(lambda: (stored("default"), stored("second")) == (2, 2), timeout=60), process.output

    # Permissions revoked and our connections to the vhost force-closed: the broker refuses every reconnect.
    second_vhost.revoke()
    publish_dead_letters(amqp_channel, first, range(10, 15), wait=False)
    assert wait_until(lambda: stored("default") == 7, timeout=60), process.output
    assert process.alive()
    assert "broker second: connection lost" in process.output

    # Access returns: the consumer of the vhost reconnects by itself and drains what piled up meanwhile.
    second_vhost.grant()
    channel = connect(second_vhost.url).channel()
    publish_dead_letters(channel, second, range(20, 23), wait=False)
    assert wait_until(lambda: stored("second") == 5, timeout=90), process.output
    assert stored("default") == 7
    assert process.alive()
    channel.connection.close()


@transactional
def test_a_broker_added_in_the_table_is_consumed_with_its_encrypted_url_unless_disabled(
    queue_name: Callable[[str], str], second_channel: Any, second_vhost: Vhost, settings: Any
) -> None:
    settings.DLQ_BROKERS = {}
    settings.DLQ_CREDENTIALS_KEY = "a key for the test"
    registry.forget()
    broker = Broker(name="added", enabled=False)
    set_urls(broker, amqp_url=second_vhost.url)
    broker.save()
    assert "guest:guest" not in broker.url and "guest" not in broker.url_secret
    queue = declare_with_dlq(second_channel, queue_name("orders"))
    watch(queue, broker)
    publish_dead_letters(second_channel, queue, range(2))

    call_command("consume_dlq", exit_when_idle=1)
    assert stored("added") == 0

    Broker.objects.filter(pk=broker.pk).update(enabled=True)
    call_command("consume_dlq", exit_when_idle=1)
    assert stored("added") == 2


@transactional
def test_a_brokers_url_changed_in_the_admin_reconnects_its_consumer(
    queue_name: Callable[[str], str], second_channel: Any, second_vhost: Vhost, settings: Any
) -> None:
    settings.DLQ_BROKERS = {}
    settings.DLQ_CREDENTIALS_KEY = "a key for the test"
    registry.forget()
    broker = Broker(name="added")
    set_urls(broker, amqp_url=second_vhost.url.replace("guest:guest@", "guest:wrong@"))
    broker.save()
    queue = declare_with_dlq(second_channel, queue_name("orders"))
    watch(queue, broker)
    publish_dead_letters(second_channel, queue, range(3))
    consumers = BrokerConsumers(
        lambda each: DeadLetterConsumer(broker=each, batch_seconds=0.05, max_backoff=0.5), refresh_seconds=0.3
    )
    runner = threading.Thread(target=consumers.run)
    runner.start()
    try:
        assert wait_until(lambda: consumers.stats.broker_errors >= 2, timeout=30)
        assert stored("added") == 0

        set_urls(broker, amqp_url=second_vhost.url)
        broker.save()

        assert wait_until(lambda: stored("added") == 3, timeout=30)
    finally:
        consumers.stop()
        runner.join(timeout=30)
    assert not runner.is_alive()
