"""Sample the depth and consumer count of watched queues into QueueSample, and forget old samples.

Each enabled WatchedQueue gives two samples per run: its work queue (backpressure, depth alerts) and its
dead-letter queue (messages not yet ingested: the consumer's lag). A passive queue_declare reads both numbers
without touching the messages. A queue that does not exist is skipped; the broker being down skips the run.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass

import pika
from django.conf import settings
from django.utils import timezone
from pika.exceptions import AMQPChannelError, AMQPConnectionError

from dlqconsole.core.amqp import connect, queue_depth
from dlqconsole.ingest.models import QueueSample, WatchedQueue

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SamplingResult:
    sampled: int
    missing: list[str]
    deleted: int


def sample_queue_depths(*, now: dt.datetime | None = None) -> SamplingResult:
    now = now or timezone.now()
    names: list[str] = []
    for queue in WatchedQueue.objects.filter(enabled=True):
        names += [queue.name, queue.dead_letter_queue]
    samples: list[QueueSample] = []
    missing: list[str] = []
    if names:
        try:
            connection = connect(heartbeat=0)
        except AMQPConnectionError as error:
            logger.warning("queue sampling skipped, broker unavailable: %r", error)
            names = []
        else:
            try:
                samples, missing = _read_depths(connection, names, now=now)
            finally:
                if connection.is_open:
                    connection.close()
    QueueSample.objects.bulk_create(samples)
    cutoff = now - dt.timedelta(hours=settings.DLQ_QUEUE_SAMPLE_RETENTION_HOURS)
    deleted, _ = QueueSample.objects.filter(sampled_at__lt=cutoff).delete()
    return SamplingResult(sampled=len(samples), missing=missing, deleted=deleted)


def _read_depths(
    connection: pika.BlockingConnection, names: list[str], *, now: dt.datetime
) -> tuple[list[QueueSample], list[str]]:
    samples: list[QueueSample] = []
    missing: list[str] = []
    channel = connection.channel()
    for name in dict.fromkeys(names):
        try:
            messages, consumers = queue_depth(channel, name)
        except AMQPChannelError:
            # A missing queue closes the channel (404 NOT_FOUND); carry on with a new one.
            missing.append(name)
            channel = connection.channel()
            continue
        samples.append(QueueSample(queue=name, messages=messages, consumers=consumers, sampled_at=now))
    if channel.is_open:
        channel.close()
    return samples, missing
