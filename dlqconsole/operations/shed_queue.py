"""What a shed may touch, checked when it is planned (shed.py) and again whenever its run starts (shedding.py): the
queue exists on the broker, is a classic queue, and is neither one of the console's own queues nor a dead-letter
queue the console drains. And what ingest lends a shed (ingest/shedding.py): the operations app cannot import
ingest (they are siblings), so the parsing and storing are lent when Django starts (dlqconsole/apps.py).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any, Protocol
from urllib.parse import quote

import requests
from django.core.exceptions import ImproperlyConfigured
from pika.exceptions import AMQPError, ChannelClosedByBroker

from dlqconsole.brokers import registry
from dlqconsole.brokers.models import Broker
from dlqconsole.brokers.secrets import CredentialsError
from dlqconsole.core import replay_guard
from dlqconsole.core.amqp import queue_depth
from dlqconsole.core.http import DeniedAddressError, HttpError, check_target, guarded_session

API_TIMEOUT = (2.0, 5.0)
QUORUM_REFUSAL = (
    "it is a quorum queue. A shed gives back the messages it keeps with basic.nack(requeue=true), and before "
    "RabbitMQ 4.3 every such return counts toward a quorum queue's delivery limit (x-delivery-limit, 20 by "
    "default from 4.0): messages would be dead-lettered or dropped for it. Its priorities are not what "
    "--priority-below assumes either (a quorum queue has two, normal and high, not 0 to x-max-priority)."
)
STREAM_REFUSAL = "it is a stream: consuming a stream removes nothing from it, so there is nothing a shed could take"


class ShedRefused(Exception):
    """A shed must not touch this queue (now); the message says why, in words fit for the user."""


class ShedLetter(Protocol):
    @property
    def content_hash(self) -> str: ...

    @property
    def body_truncated(self) -> bool: ...


class ShedStorage(Protocol):
    """What ingest lends a shed (ingest/shedding.py)."""

    def parse(
        self, *, queue: str, broker: Broker, body: bytes, properties: Any, note: str, now: dt.datetime
    ) -> ShedLetter: ...

    def store(self, letters: Sequence[Any], *, now: dt.datetime) -> list[int]: ...

    def drained_queues(self, broker: Broker) -> set[str]: ...

    def watched_kind(self, broker: Broker, queue: str) -> tuple[str, dict[str, Any]] | None: ...


_storage: ShedStorage | None = None


def register_storage(lent: ShedStorage) -> None:
    global _storage
    _storage = lent


def storage() -> ShedStorage:
    if _storage is None:
        raise ImproperlyConfigured("A shed needs the ingest app's storage (dlqconsole.apps.ConsoleConfig lends it).")
    return _storage


def refusal(broker: Broker, queue: str) -> str:
    """Why a shed must leave `queue` alone whatever it holds ("" when it may shed it): the console's own queues and
    the dead-letter queues it drains."""
    if refused := replay_guard.refusal("", queue, queue=queue, shared_vhost=registry.shares_celery_vhost(broker)):
        return refused
    if queue in storage().drained_queues(broker):
        return f"queue {queue!r} is a dead-letter queue the console drains: its messages are dead letters already"
    return ""


def inspect_queue(broker: Broker, queue: str, *, empty_refused: bool = True) -> dict[str, Any]:
    """The queue's depth, consumers, type and x-max-priority now; ShedRefused when a shed must not touch it (and,
    with `empty_refused`, when it holds no ready message). A plan asks it, and so does every run of a shed when it
    starts or resumes: the queue may have been deleted and declared again as a quorum queue since."""
    where = "" if broker.is_default else f" on broker {broker.name}"
    if refused := refusal(broker, queue):
        raise ShedRefused(f"cannot shed {queue!r}{where}: {refused}")
    try:
        connection = registry.connect(broker)
    except (AMQPError, OSError, CredentialsError) as error:
        raise ShedRefused(f"cannot reach broker {broker.name}: {error or type(error).__name__}") from None
    try:
        depth, consumers = queue_depth(connection.channel(), queue)
    except ChannelClosedByBroker as error:
        if error.reply_code == 404:
            raise ShedRefused(f"queue {queue!r} does not exist{where}") from None
        raise ShedRefused(f"queue {queue!r}{where}: {error.reply_text}") from None
    finally:
        if connection.is_open:
            connection.close()
    kind, arguments, source = _queue_type(broker, queue)
    if kind == "quorum":
        raise ShedRefused(f"cannot shed {queue!r}{where}: {QUORUM_REFUSAL}")
    if kind == "stream":
        raise ShedRefused(f"cannot shed {queue!r}{where}: {STREAM_REFUSAL}")
    if kind != "classic":
        raise ShedRefused(f"cannot shed {queue!r}{where}: a shed runs on classic queues only, and it is {kind!r}")
    if depth == 0 and empty_refused:
        raise ShedRefused(f"queue {queue!r}{where} holds no ready message: there is nothing to shed")
    max_priority = arguments.get("x-max-priority")
    if not isinstance(max_priority, int) or isinstance(max_priority, bool):
        max_priority = None
    return {"depth": depth, "consumers": consumers, "type": kind, "max_priority": max_priority, "type_from": source}


def _queue_type(broker: Broker, queue: str) -> tuple[str, dict[str, Any], str]:
    """(type, arguments, where that was read): the management API says; without it, the watched queue's row."""
    problem = ""
    try:
        api = registry.api(broker)
    except CredentialsError as error:
        api, problem = None, str(error)
    if api is not None:
        try:
            check_target(api.base)
            response = guarded_session().get(
                f"{api.base}api/queues/{quote(api.vhost, safe='')}/{quote(queue, safe='')}",
                auth=api.auth,
                timeout=API_TIMEOUT,
                allow_redirects=False,
            )
            info = response.json() if response.status_code == 200 else None
        except (HttpError, DeniedAddressError, requests.RequestException, ValueError) as error:
            info, problem = None, f"the management API at {api} did not answer ({type(error).__name__})"
        if isinstance(info, dict):
            found = info.get("arguments")
            arguments: dict[str, Any] = found if isinstance(found, dict) else {}
            return str(info.get("type") or "classic"), arguments, "management API"
        problem = problem or f"the management API at {api} did not describe it"
    watched = storage().watched_kind(broker, queue)
    if watched is not None:
        return watched[0], watched[1], "watched queue"
    raise ShedRefused(
        f"cannot tell whether {queue!r} is a classic queue ({problem or 'the management API is off'}, and it is not a "
        "watched queue): a shed runs on classic queues only"
    )
