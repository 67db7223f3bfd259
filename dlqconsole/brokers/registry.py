"""The brokers the console knows, and how to reach each.

The environment's brokers (AMQP_URL as `default`, DLQ_BROKERS) are written to the table when first asked for in a
process, and again whenever the settings change (tests); their credentials stay in the environment. A broker
added in the admin keeps its URL encrypted in the row (secrets.py).

Processes may be started with different environments (a shell without DLQ_BROKERS beside the running console), so
a process never disables or takes over what its own environment does not name: a broker of DLQ_BROKERS that this
process's environment lacks stays as it is, and this process leaves it out (it has no URL for it). A name in
DLQ_BROKERS that an admin-added broker already has is refused in the log and leaves that broker as it is."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

import pika
from django.conf import settings
from django.db import transaction

from dlqconsole.brokers.models import DEFAULT, Broker, forget_default
from dlqconsole.brokers.secrets import CredentialsError, decrypt
from dlqconsole.core import replay_guard
from dlqconsole.core.amqp import connection_parameters as amqp_parameters
from dlqconsole.core.broker_urls import Api, api_from_urls, without_password

log = logging.getLogger(__name__)


class UnknownBroker(Exception):
    """No broker of that name; the message lists the known ones."""


class NoUrl(CredentialsError):
    """This process has no URL for the broker; the message says what to set."""


_lock = threading.Lock()
_synced: tuple[object, ...] | None = None


def environment_brokers() -> dict[str, str]:
    """The brokers the environment names, `default` first: name to AMQP URL (with its password)."""
    return {DEFAULT: settings.AMQP_URL, **settings.DLQ_BROKERS}


def _environment_api_url(name: str) -> str:
    if name == DEFAULT:
        return settings.RABBITMQ_API_URL
    return settings.DLQ_BROKER_API_URLS.get(name, "")


def sync_environment() -> None:
    """Write the environment's brokers to the table once per process (and again when the settings change). A
    broker that left DLQ_BROKERS stays, disabled, with the rows that belong to it; the admin may then edit it."""
    global _synced
    state = (settings.AMQP_URL, tuple(settings.DLQ_BROKERS.items()), tuple(settings.DLQ_BROKER_API_URLS.items()))
    if _synced == state:
        return
    with _lock, transaction.atomic():
        wanted = environment_brokers()
        taken = set(Broker.objects.filter(name__in=list(wanted), managed=False).values_list("name", flat=True))
        for name in sorted(taken):
            log.error(
                "DLQ_BROKERS names %s, a broker added in the admin: the admin's is kept; rename one of them", name
            )
        for name, url in wanted.items():
            if name in taken:
                continue
            shown_api = _environment_api_url(name)
            fields = {
                "url": without_password(url),
                "api_url": without_password(shown_api) if shown_api.lower() not in ("", "off") else shown_api,
                "url_secret": "",
                "api_secret": "",
                "managed": True,
            }
            broker, created = Broker.objects.get_or_create(name=name, defaults={**fields, "enabled": True})
            if not created and (
                any(getattr(broker, key) != value for key, value in fields.items()) or not broker.enabled
            ):
                for key, value in fields.items():
                    setattr(broker, key, value)
                broker.enabled = True
                broker.save()
        _synced = state


def forget() -> None:
    """Read the environment again on the next call (tests that change DLQ_BROKERS)."""
    global _synced
    _synced = None
    forget_default()


def brokers(*, enabled: bool = True) -> list[Broker]:
    """The brokers to consume, sample and replay to (enabled=True): the enabled ones this process has a URL for.
    With enabled=False, every row (pages list a disabled broker's dead letters too)."""
    sync_environment()
    if not enabled:
        return list(Broker.objects.all())
    named = environment_brokers()
    return [broker for broker in Broker.objects.enabled() if not broker.managed or broker.name in named]


def default_broker() -> Broker:
    sync_environment()
    return Broker.objects.get(name=DEFAULT)


def get(name: str) -> Broker:
    """The broker called `name`; UnknownBroker (naming the known ones) otherwise."""
    sync_environment()
    try:
        return Broker.objects.get(name=name)
    except Broker.DoesNotExist:
        known = ", ".join(Broker.objects.values_list("name", flat=True)) or "none"
        raise UnknownBroker(f"no broker named {name[:64]!r} (known: {known})") from None


def named(names: Iterable[str]) -> list[Broker]:
    return [get(name) for name in names]


def amqp_url(broker: Broker) -> str:
    """The URL to connect with, password included: never log or show it (`broker.url` is the shown one). NoUrl
    when this process has none."""
    if broker.managed:
        url = environment_brokers().get(broker.name)
        if url is None:
            raise NoUrl(
                f"broker {broker.name} comes from DLQ_BROKERS, which this process's environment does not name it in: "
                "give every console process the same DLQ_BROKERS"
            )
        return url
    if not broker.url_secret:
        raise NoUrl(f"broker {broker.name} has no stored AMQP URL: give it one in the admin")
    return decrypt(broker.url_secret)


def api(broker: Broker) -> Api | None:
    """The management API of the broker's vhost; None when it is switched off."""
    if broker.managed and broker.name in environment_brokers():
        configured = _environment_api_url(broker.name)
    elif broker.api_secret:
        configured = decrypt(broker.api_secret)
    else:
        configured = broker.api_url
    return api_from_urls(amqp_url=amqp_url(broker), configured=configured)


def shares_celery_vhost(broker: Broker) -> bool:
    """Whether the broker's vhost is the console's own Celery vhost (replay_guard), judged by its own URL; False
    when this process has no URL for it (nothing can be published there either)."""
    try:
        url = amqp_url(broker)
    except CredentialsError:
        return False
    return replay_guard.shares_celery_vhost(url)


def connection_parameters(broker: Broker, *, heartbeat: int = 30) -> pika.URLParameters:
    return amqp_parameters(
        amqp_url(broker),
        heartbeat=heartbeat,
        tls_ca_certificate=broker.tls_ca_certificate,
        tls_verify=broker.tls_verify,
    )


def connect(broker: Broker, *, heartbeat: int = 30) -> pika.BlockingConnection:
    return pika.BlockingConnection(connection_parameters(broker, heartbeat=heartbeat))


def unknown_broker_notice(asked: str, known: Iterable[str]) -> str:
    """What a page that narrows to one broker (?broker=NAME) says when no broker has the name it was given: it shows
    every broker instead, and says so rather than reading as that broker's page. Empty when the name is known or
    none was given."""
    names = list(known)
    if not asked or asked in names:
        return ""
    return f"No broker named {asked[:64]!r} (known: {', '.join(names) or 'none'}): every broker is shown."
