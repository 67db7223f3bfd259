"""AMQP connections for the consumer, the replay worker, the topology command and the health check; and the AMQP
names that ingest, the pages and replays share: the message properties, the headers the broker writes when a
message dies, and which timestamps in a message are plausible."""

from __future__ import annotations

import datetime as dt
import ssl

import pika
from django.conf import settings

# The basic properties of an AMQP 0-9-1 message besides its headers, as pika names them.
PROPERTY_NAMES = (
    "content_type",
    "content_encoding",
    "delivery_mode",
    "priority",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "timestamp",
    "type",
    "user_id",
    "app_id",
    "cluster_id",
)
# Annotations the queue we consume from adds on each delivery (a quorum DLQ counts its own redeliveries):
# a redelivered copy of the same dead letter differs only in these, so they are not part of its identity.
DELIVERY_ANNOTATIONS = frozenset({"x-delivery-count", "x-acquired-count"})
# Headers the broker adds when it dead-letters a message. Republishing them makes some broker versions drop the
# message silently when it dies again, and they describe deaths that are over.
DEATH_HEADERS = frozenset({"x-death"}) | DELIVERY_ANNOTATIONS
DEATH_HEADER_PREFIXES = ("x-first-death-", "x-last-death-")
# Timestamps outside this window are nonsense (a sender's bug, or a hostile header): kept raw, not used.
EARLIEST_TIMESTAMP = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
LATEST_TIMESTAMP_AHEAD = dt.timedelta(days=2)


def is_death_header(name: str) -> bool:
    """Headers the broker writes when a message dies; a replay strips them, so the message starts afresh."""
    lowered = name.lower()
    return lowered in DEATH_HEADERS or lowered.startswith(DEATH_HEADER_PREFIXES)


def connection_parameters(
    url: str | None = None, *, heartbeat: int = 30, tls_ca_certificate: str = "", tls_verify: bool = True
) -> pika.URLParameters:
    """Parameters for `url` (AMQP_URL by default). For amqps://, TLS checks the broker's certificate and name
    against the system's CAs, or against `tls_ca_certificate` (PEM) when given; `tls_verify=False` checks
    neither (a test broker with a self-signed certificate)."""
    url = url or settings.AMQP_URL
    parameters = pika.URLParameters(url)
    # An ssl_options query in the URL (pika's own syntax) is left as it is.
    if url.startswith("amqps:") and "ssl_options=" not in url:
        context = ssl.create_default_context(cadata=tls_ca_certificate or None)
        if not tls_verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        parameters.ssl_options = pika.SSLOptions(context, server_hostname=parameters.host)
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
