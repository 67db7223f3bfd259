"""Sample the depth and consumer count of watched queues into QueueSample, and forget old samples.

Each enabled WatchedQueue gives two samples per run: its work queue (backpressure, depth alerts) and its
dead-letter queue (messages not yet ingested: the consumer's lag). A passive queue_declare reads both numbers
without touching the messages. A queue that does not exist is skipped.

Every enabled broker is sampled through its own connection, all of them at once: a broker that is down, refuses
us or takes its time to answer is logged and skipped, and the others are sampled as usual (their samples are
written; its queues simply have none this run).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pika
from django.conf import settings
from django.utils import timezone
from pika.exceptions import AMQPChannelError

from dlqconsole.brokers import registry
from dlqconsole.brokers.models import Broker
from dlqconsole.core.amqp import queue_depth
from dlqconsole.ingest.models import QueueSample, WatchedQueue

logger = logging.getLogger(__name__)

# Brokers sampled at the same time, each on its own thread and connection.
MAX_PARALLEL_BROKERS = 8


@dataclass(frozen=True)
class SamplingResult:
    sampled: int
    # (broker name, queue name) of each watched queue the broker does not have.
    missing: list[tuple[str, str]]
    deleted: int
    # Brokers that could not be sampled this run (down, refusing us, a broken URL).
    unreachable: list[str] = field(default_factory=list)


@dataclass
class _BrokerRun:
    broker: Broker
    parameters: pika.URLParameters
    names: list[str]
    depths: dict[str, tuple[int, int]] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    failed: bool = False


def sample_queue_depths(*, now: dt.datetime | None = None) -> SamplingResult:
    now = now or timezone.now()
    names: dict[int, list[str]] = defaultdict(list)
    for broker_id, name, dead_letter_queue in WatchedQueue.objects.filter(enabled=True).values_list(
        "broker_id", "name", "dead_letter_queue"
    ):
        names[broker_id or 0] += [name, dead_letter_queue]
    runs: list[_BrokerRun] = []
    unreachable: list[str] = []
    for broker in registry.brokers():
        if not names.get(broker.pk):
            continue
        try:
            parameters = registry.connection_parameters(broker, heartbeat=0)
        except Exception:
            # A URL that cannot be read (a credential the key no longer decrypts): this broker only.
            logger.exception("queue sampling skipped broker %s: its connection settings cannot be read", broker.name)
            unreachable.append(broker.name)
            continue
        runs.append(_BrokerRun(broker=broker, parameters=parameters, names=list(dict.fromkeys(names[broker.pk]))))
    if runs:
        with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL_BROKERS, len(runs))) as pool:
            list(pool.map(_sample_broker, runs))
    samples: list[QueueSample] = []
    missing: list[tuple[str, str]] = []
    for run in runs:
        if run.failed:
            # What was read before the failure is kept.
            unreachable.append(run.broker.name)
        missing += [(run.broker.name, name) for name in run.missing]
        samples += [
            QueueSample(broker=run.broker, queue=name, messages=messages, consumers=consumers, sampled_at=now)
            for name, (messages, consumers) in run.depths.items()
        ]
    QueueSample.objects.bulk_create(samples)
    cutoff = now - dt.timedelta(hours=settings.DLQ_QUEUE_SAMPLE_RETENTION_HOURS)
    deleted, _ = QueueSample.objects.filter(sampled_at__lt=cutoff).delete()
    return SamplingResult(sampled=len(samples), missing=missing, deleted=deleted, unreachable=sorted(unreachable))


def _sample_broker(run: _BrokerRun) -> None:
    """Read the depths of one broker's queues into `run` (on a thread of its own: no database here). Any failure
    marks the run failed and is logged with the broker's name and its URL without the password."""
    try:
        connection = pika.BlockingConnection(run.parameters)
    except Exception as error:
        logger.warning("queue sampling skipped broker %s (%s), unavailable: %r", run.broker.name, run.broker.url, error)
        run.failed = True
        return
    try:
        _read_depths(connection, run)
    except Exception as error:
        logger.warning("queue sampling of broker %s (%s) failed: %r", run.broker.name, run.broker.url, error)
        run.failed = True
    finally:
        if connection.is_open:
            try:
                connection.close()
            except Exception:
                # Closing a broken connection: nothing is left to do.
                logger.debug("closing the sampling connection of broker %s failed", run.broker.name)


def _read_depths(connection: pika.BlockingConnection, run: _BrokerRun) -> None:
    channel = connection.channel()
    for name in run.names:
        try:
            run.depths[name] = queue_depth(channel, name)
        except AMQPChannelError:
            # A missing queue closes the channel (404 NOT_FOUND); carry on with a new one.
            run.missing.append(name)
            channel = connection.channel()
    if channel.is_open:
        channel.close()
