"""Destinations a replay or move must never reach: the console's own Celery queues and exchanges.

Everything in a dead letter is untrusted. Anyone with publish rights on a vhost can put a message in a DLQ whose
x-death names any exchange and routing key, with Celery's `task` and `id` headers. Replayed into a queue the
console's own workers consume, it would run as one of the console's tasks. So, on every vhost, the names the
console's Celery uses (its task queues, their exchanges) are refused as destinations, since a second deployment's
console may sit on any vhost. On the vhost of CELERY_BROKER_URL, Celery's remote-control and event exchanges and
queues (`celery.pidbox`, `reply.celery.pidbox`, `celeryev`, `<worker>.celery.pidbox`, `celeryev.<id>`) are refused
too: a forged broadcast there would command the console's workers. A user's own Celery queues (`celery`, `orders`,
...) stay valid targets: replaying the users' Celery tasks is what the console is for.

A console replays to several brokers (each a vhost of its own), and any of them may be the vhost of the console's
Celery: whether one is comes from that broker's own URL (`shares_celery_vhost(url)`) or connection parameters,
never from AMQP_URL alone. So every refusal is asked with `shared_vhost` said by the caller, for the broker the
message goes to.

RabbitMQ also routes a message by the routing keys in its `CC` and `BCC` headers (sender-selected distribution), on
the exchange it is published to: a replay to a user's queue that carries `CC: ["dlqconsole"]` would reach the
console's queue too. Those keys are checked as destinations of their own (`header_refusal`).

The plan lists such dead letters as not replayable, and the publisher refuses them again (`refusal`).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

import pika
from django.conf import settings

from dlqconsole.core import jsonsafe

# RabbitMQ takes "amq.default" as another name for the default exchange ("").
DEFAULT_EXCHANGE_NAMES = frozenset({"", "amq.default"})


def console_names() -> frozenset[str]:
    """The queues and exchanges of the console's own Celery: the default and control queues, every queue in
    CELERY_TASK_QUEUES and CELERY_TASK_ROUTES, and their exchanges."""
    names = {settings.CELERY_TASK_DEFAULT_QUEUE, settings.DLQ_CONTROL_QUEUE}
    for queue in getattr(settings, "CELERY_TASK_QUEUES", None) or ():
        names.add(str(queue.name))
        if queue.exchange is not None:
            names.add(str(queue.exchange.name))
    for route in (getattr(settings, "CELERY_TASK_ROUTES", None) or {}).values():
        if isinstance(route, dict):
            names.add(str(route.get("queue", "")))
    return frozenset(name for name in names if name)


def _control_exchanges() -> tuple[str, str, str]:
    namespace = getattr(settings, "CELERY_CONTROL_EXCHANGE", None) or "celery"
    events = getattr(settings, "CELERY_EVENT_EXCHANGE", None) or "celeryev"
    return f"{namespace}.pidbox", f"reply.{namespace}.pidbox", events


def _is_control_name(name: str) -> bool:
    pidbox, reply, events = _control_exchanges()
    return (
        name in (pidbox, reply, events) or name.endswith((f".{pidbox}", f".{reply}")) or name.startswith(f"{events}.")
    )


def vhost_of(url: str) -> tuple[str, int, str] | None:
    """(scheme, port, vhost) of an AMQP URL, None for another transport (a Redis broker shares nothing)."""
    parts = urlsplit(url.split(";", 1)[0].strip())
    if parts.scheme not in ("amqp", "amqps", "pyamqp", "librabbitmq"):
        return None
    secure = parts.scheme == "amqps"
    try:
        port = parts.port or (5671 if secure else 5672)
    except ValueError:
        port = 5671 if secure else 5672
    vhost = unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
    return ("amqps" if secure else "amqp"), port, vhost


def shares_celery_vhost(amqp_url: str | None = None) -> bool:
    """Whether `amqp_url` (a broker's AMQP URL; AMQP_URL by default) may be the vhost of the console's Celery. Host
    names are not compared: one broker answers to several names (localhost, 127.0.0.1, a DNS alias), and a wrong
    "no" here would open the console's control exchanges. The same vhost name on the same port counts as shared."""
    ours = vhost_of(amqp_url or settings.AMQP_URL)
    return ours is not None and ours == vhost_of(settings.CELERY_BROKER_URL)


def parameters_share_celery_vhost(parameters: pika.ConnectionParameters) -> bool:
    """shares_celery_vhost for the parameters a connection was opened with."""
    scheme = "amqps" if parameters.ssl_options is not None else "amqp"
    return (scheme, parameters.port, parameters.virtual_host) == vhost_of(settings.CELERY_BROKER_URL)


def refusal(exchange: str, routing_key: str, *, queue: str = "", shared_vhost: bool) -> str:
    """Why a publish to `exchange` with `routing_key` (expected to reach `queue`) is refused; "" when it is not.
    `shared_vhost`: whether the broker it goes to is on the console's Celery vhost (`shares_celery_vhost`)."""
    owned = console_names()
    direct = exchange in DEFAULT_EXCHANGE_NAMES
    targets = [name for name in (queue, routing_key if direct else "") if name]
    for name in targets:
        if name in owned:
            return f"queue {name!r} is one of the console's own Celery queues"
    if not direct and exchange in owned:
        return f"exchange {exchange!r} is one of the console's own Celery exchanges"
    if shared_vhost:
        for name in [*targets, "" if direct else exchange]:
            if name and _is_control_name(name):
                return f"{name!r} is Celery's remote control or event channel on the console's own vhost"
    return ""


# The headers RabbitMQ reads as further routing keys (sender-selected distribution); names compared as it does.
ROUTING_HEADERS = ("CC", "BCC")


def routing_keys_in_headers(headers: Any) -> list[str]:
    """The routing keys a message's CC and BCC headers add (values as pika or core.jsonsafe give them)."""
    if not isinstance(headers, dict):
        return []
    keys: list[str] = []
    for name in ROUTING_HEADERS:
        value = headers.get(name)
        if isinstance(value, dict):
            value = jsonsafe.decode(value)
        for key in value if isinstance(value, list) else [value]:
            if isinstance(key, dict):
                key = jsonsafe.decode(key)
            if isinstance(key, bytes):
                key = key.decode("utf-8", "replace")
            if isinstance(key, str):
                keys.append(key)
    return keys


def header_refusal(exchange: str, headers: Any, *, shared_vhost: bool) -> str:
    """Why the CC or BCC header of a message published to `exchange` is refused; "" when it is not."""
    for key in routing_keys_in_headers(headers):
        if refused := refusal(exchange, key, shared_vhost=shared_vhost):
            return f"its CC/BCC header routes it further: {refused}"
    return ""
