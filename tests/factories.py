"""What the tests start from, made by factory_boy: users with a role, dead letters as RabbitMQ delivers them (read by
parse_envelope, as the consumer reads them), stored through ingest_batch (so the counters the pages and alerts
read are kept exactly as ingest keeps them), alert rules and channels.

    EnvelopeFactory.build(error="...", queue="billing")      # a ParsedDeadLetter, not stored
    store(EnvelopeFactory.build(), ...)                      # the stored DeadLetter rows, in order
    many(3, error="...")                                     # three stored at once
    parked(5, reason="TIMEOUT")                              # five plain rows, for counters and alerts
    UserFactory.create(role="operator")
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import factory
import pika
from django.contrib.auth.models import Group, User
from django.utils import timezone

from dlqconsole.alerts.models import AlertRule, Channel
from dlqconsole.deadletters.models import DeadLetter
from dlqconsole.ingest.envelope import ParsedDeadLetter, parse_envelope
from dlqconsole.ingest.services import ingest_batch

# The moment every made message died on the broker (its x-death time); arrival is the time it is ingested.
DIED_AT = dt.datetime(2026, 11, 20, 10, 0, tzinfo=dt.UTC)


class UserFactory(factory.django.DjangoModelFactory[User]):
    """A user who signs in with the password `pw-<username>`, in the group `role` (none when it is None)."""

    class Meta:
        model = User
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user-{n}")
    password = factory.LazyAttribute(lambda user: "pw-" + user.username)
    is_staff = False

    @classmethod
    def _create(cls, model_class: type[User], *args: Any, **fields: Any) -> User:
        return model_class.objects.create_user(*args, **fields)

    @factory.post_generation
    def role(user: User, create: bool, extracted: str | None, **kwargs: Any) -> None:  # noqa: N805
        if create and extracted:
            user.groups.add(Group.objects.get_or_create(name=extracted)[0])


class EnvelopeFactory(factory.Factory[ParsedDeadLetter]):
    """A message that died in QUEUE (x-death as RabbitMQ writes it, the failure in x-exception-* headers) and was
    delivered from QUEUE.dlq, read by parse_envelope. A field set to "" or None leaves its header or property out;
    `headers` adds (or overrides) headers."""

    class Meta:
        model = ParsedDeadLetter

    queue = "orders"
    error = "Request timed out after 3000ms"
    error_type = "TimeoutError"
    stack_trace = ""
    reason = "rejected"
    exchange = "shop"
    routing_key = "orders.created"
    host: str | None = "web-1"
    version: str | None = "1.4.2"
    content_type: str | None = "application/json"
    priority: int | None = None
    message_id = factory.Sequence(lambda n: f"msg-{n}")
    body = factory.Sequence(lambda n: f'{{"order": {n}}}'.encode())
    headers = factory.Dict({})
    now = factory.LazyFunction(timezone.now)

    @classmethod
    def _create(cls, model_class: type[ParsedDeadLetter], *args: Any, **fields: Any) -> ParsedDeadLetter:
        return cls._build(model_class, *args, **fields)

    @classmethod
    def _build(cls, model_class: type[ParsedDeadLetter], *args: Any, **fields: Any) -> ParsedDeadLetter:
        queue = fields["queue"]
        headers: dict[str, Any] = {
            "x-death": [
                {
                    "count": 1,
                    "reason": fields["reason"],
                    "queue": queue,
                    "time": DIED_AT,
                    "exchange": fields["exchange"],
                    "routing-keys": [fields["routing_key"]],
                }
            ],
            "x-exception-message": fields["error"],
        }
        optional = {
            "x-exception-type": fields["error_type"],
            "x-exception-stacktrace": fields["stack_trace"],
            "x-host": fields["host"],
            "x-app-version": fields["version"],
        }
        headers.update({name: value for name, value in optional.items() if value})
        headers.update(fields["headers"])
        properties = pika.BasicProperties(
            message_id=fields["message_id"],
            content_type=fields["content_type"],
            priority=fields["priority"],
            headers=headers,
        )
        return parse_envelope(
            source_queue=f"{queue}.dlq", body=fields["body"], properties=properties, now=fields["now"]
        )


class ParsedDeadLetterFactory(factory.Factory[ParsedDeadLetter]):
    """A parsed dead letter with no broker history at all: for counters and alerts, where only the queue, the
    error and the failure reason count."""

    class Meta:
        model = ParsedDeadLetter

    source_queue = "orders.dlq"
    body = b"{}"
    dedupe_key = factory.LazyFunction(lambda: uuid.uuid4().hex)
    original_queue = factory.LazyAttribute(lambda made: made.source_queue.removesuffix(".dlq"))
    error_type = "TimeoutError"
    error_message = "Request timed out after 30000ms"
    failure_reason = "TIMEOUT"


def store(*letters: ParsedDeadLetter, now: dt.datetime | None = None) -> list[DeadLetter]:
    """Ingest the letters as one batch, as consume_dlq does; returns their rows in the same order."""
    ingest_batch(letters=list(letters), now=now)
    keys = [item.dedupe_key for item in letters]
    found = {row.dedupe_key: row for row in DeadLetter.objects.filter(dedupe_key__in=keys)}
    return [found[key] for key in keys]


def many(count: int, **fields: Any) -> list[DeadLetter]:
    """`count` dead letters of EnvelopeFactory with these fields, stored as one batch."""
    return store(*EnvelopeFactory.build_batch(count, **fields))


def parked(
    count: int = 1,
    *,
    queue: str = "orders.dlq",
    error_type: str = "TimeoutError",
    message: str = "Request timed out after 30000ms",
    reason: str = "TIMEOUT",
) -> list[DeadLetter]:
    """`count` new dead letters of ParsedDeadLetterFactory in QUEUE, stored as one batch; returned in the order
    they were stored (by id), which ingest does not promise to be the order they were made in."""
    rows = store(
        *ParsedDeadLetterFactory.build_batch(
            count, source_queue=queue, error_type=error_type, error_message=message, failure_reason=reason
        )
    )
    return sorted(rows, key=lambda row: row.pk)


def synthetic_dead_letters(
    *,
    queue: str,
    count: int,
    exchange: str = "",
    error: str = "Request timed out after 30s",
    start: int = 0,
    now: dt.datetime | None = None,
    extra_headers: dict[str, Any] | None = None,
) -> list[int]:
    """Ingest `count` dead letters that died in QUEUE, published to it directly (exchange "" unless said), without
    making them die one by one on the broker: the big tests need thousands. Message n is `m-<n>` with body
    `message <n>` and the header `seq: n`. Returns their ids in order."""
    now = now or timezone.now()
    ids: list[int] = []
    for first in range(start, start + count, 1000):
        letters = [
            EnvelopeFactory.build(
                queue=queue,
                exchange=exchange,
                routing_key=queue,
                error=error,
                error_type="",
                host=None,
                version=None,
                content_type="text/plain",
                message_id=f"m-{n}",
                body=f"message {n}".encode(),
                now=now,
                headers={
                    "x-first-death-queue": queue,
                    "x-first-death-reason": "rejected",
                    "x-first-death-exchange": exchange,
                    "seq": n,
                    **(extra_headers or {}),
                },
            )
            for n in range(first, min(start + count, first + 1000))
        ]
        ids.extend(row.pk for row in store(*letters, now=now))
    return sorted(ids)


def dead_letter_properties(index: int, **overrides: Any) -> pika.BasicProperties:
    """Properties of a realistic failed message, to publish to a work queue: expiration "0" makes the broker
    dead-letter it at once (reason `expired`). Three kinds of failure take turns, each with varying values."""
    values: dict[str, Any] = {
        "message_id": f"m-{index}",
        "content_type": "application/json",
        "delivery_mode": 2,
        "expiration": "0",
        "headers": {
            "x-exception-type": ["TimeoutError", "ValidationError", "ConnectionResetError"][index % 3],
            "x-exception-message": [
                f"Request to payments-{index % 40} timed out after {index}ms",
                f"Field amount_{index % 50} of order {index} is invalid",
                f"Connection reset by peer (node {index % 30})",
            ][index % 3],
        },
    }
    values.update(overrides)
    return pika.BasicProperties(**values)


class ChannelFactory(factory.django.DjangoModelFactory[Channel]):
    class Meta:
        model = Channel

    name = factory.Sequence(lambda n: f"channel {n}")
    kind = "webhook"
    target = "http://127.0.0.1:9/hook"


class AlertRuleFactory(factory.django.DjangoModelFactory[AlertRule]):
    class Meta:
        model = AlertRule
        skip_postgeneration_save = True

    name = factory.LazyFunction(lambda: f"test rule {uuid.uuid4().hex[:6]}")
    kind = "depth"

    @factory.post_generation
    def channels(rule: AlertRule, create: bool, extracted: list[Channel] | None, **kwargs: Any) -> None:  # noqa: N805
        if create and extracted:
            rule.channels.set(extracted)


def rule(kind: str, *, channels: list[Channel] | None = None, **fields: Any) -> AlertRule:
    """A rule of the given kind; the default rules of the data migration are switched off so only it speaks."""
    AlertRule.objects.exclude(name__startswith="test ").update(enabled=False)
    return AlertRuleFactory.create(name=f"test {kind} {uuid.uuid4().hex[:6]}", kind=kind, channels=channels, **fields)
