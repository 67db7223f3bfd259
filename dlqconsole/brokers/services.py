"""Writes to brokers: the credentials of a broker added in the admin are kept encrypted, and only its URL without
the password is stored in the clear."""

from __future__ import annotations

from dlqconsole.brokers.models import Broker
from dlqconsole.brokers.secrets import encrypt
from dlqconsole.core.broker_urls import check_amqp_url, without_password


class BrokerError(Exception):
    """A broker cannot be saved as given; the message says why."""


def set_urls(broker: Broker, *, amqp_url: str, api_url: str | None = None) -> None:
    """Give an admin-managed broker its AMQP URL (and management API URL, when given), password included: stored
    encrypted, shown without the password. Does not save the row."""
    if broker.managed:
        raise BrokerError(f"broker {broker.name} is managed by the environment (AMQP_URL or DLQ_BROKERS)")
    problem = check_amqp_url(amqp_url)
    if problem:
        raise BrokerError(f"not an AMQP URL: {problem}")
    broker.url = without_password(amqp_url)
    broker.url_secret = encrypt(amqp_url.strip())
    if api_url is not None:
        api_url = api_url.strip()
        if api_url.lower() in ("", "off"):
            broker.api_url, broker.api_secret = api_url.lower(), ""
        else:
            broker.api_url = without_password(api_url)
            broker.api_secret = encrypt(api_url)
