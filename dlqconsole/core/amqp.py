"""AMQP connections for the consumer, the replay worker, the topology command and the health check."""

from __future__ import annotations

import pika
from django.conf import settings


def connection_parameters(url: str | None = None, *, heartbeat: int = 30) -> pika.URLParameters:
    parameters = pika.URLParameters(url or settings.AMQP_URL)
    parameters.heartbeat = heartbeat
    parameters.blocked_connection_timeout = 60
    parameters.connection_attempts = 1
    parameters.socket_timeout = 10
    parameters.client_properties = {"connection_name": "dlqconsole"}
    return parameters


def connect(url: str | None = None, *, heartbeat: int = 30) -> pika.BlockingConnection:
    return pika.BlockingConnection(connection_parameters(url, heartbeat=heartbeat))


def queue_depth(channel: pika.adapters.blocking_connection.BlockingChannel, queue: str) -> tuple[int, int]:
    """(messages ready, consumers) of a queue, by a passive declare; raises ChannelClosedByBroker if missing."""
    frame = channel.queue_declare(queue=queue, passive=True)
    return frame.method.message_count, frame.method.consumer_count
