"""The shared test world: users with each role, and RabbitMQ queues that clean up after themselves."""

from __future__ import annotations

import datetime as dt
import os
import secrets
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pytest
import time_machine
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.test import Client

from dlqconsole.core.amqp import connect

# The Celery workers and beat that tests start refuse to start without a real SECRET_KEY (dlqconsole/checks.py):
# scripts/test exports one for its run, and a run started by hand gets one made here for the processes it starts.
os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(50))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--pin-clock",
        default="",
        metavar="MOMENT",
        help="run every test with Python's clock started at MOMENT (ISO 8601, UTC unless it says), ticking: "
        "finds tests whose outcome depends on the time of day (run them just before an hour, a day, a month and "
        "a year end)",
    )


@pytest.fixture(autouse=True)
def _pinned_clock(request: pytest.FixtureRequest) -> Iterator[None]:
    moment = request.config.getoption("--pin-clock")
    if not moment:
        yield
        return
    start = dt.datetime.fromisoformat(moment)
    with time_machine.travel(start if start.tzinfo else start.replace(tzinfo=dt.UTC), tick=True):
        yield


@pytest.fixture(autouse=True)
def _one_consumer_process(settings: Any) -> None:
    """consume_dlq called in the test process runs its consumer in that process (forking pytest would copy its
    database connections); consume_dlq started as a subprocess keeps its default, several processes."""
    settings.DLQ_CONSUMER_PROCESSES = 1


def _user(username: str, role: str | None) -> User:
    user = User.objects.create_user(username=username, password="pw-" + username)
    if role is not None:
        user.groups.add(Group.objects.get_or_create(name=role)[0])
    return user


@pytest.fixture
def viewer(db: None) -> User:
    return _user("vera-viewer", "viewer")


@pytest.fixture
def operator(db: None) -> User:
    return _user("otto-operator", "operator")


@pytest.fixture
def admin_user(db: None) -> User:
    return _user("ada-admin", "admin")


@pytest.fixture
def amqp_connection() -> Iterator[pika.BlockingConnection]:
    connection = connect(settings.AMQP_URL)
    yield connection
    if connection.is_open:
        connection.close()


@pytest.fixture
def amqp_channel(amqp_connection: pika.BlockingConnection) -> pika.adapters.blocking_connection.BlockingChannel:
    return amqp_connection.channel()


@pytest.fixture
def queue_name() -> Iterator[Callable[[str], str]]:
    """Makes unique queue names for one test and deletes every queue (and exchange) named so afterwards."""
    made: list[str] = []
    prefix = f"t{uuid.uuid4().hex[:10]}"

    def make(base: str) -> str:
        name = f"{prefix}.{base}"
        made.append(name)
        return name

    yield make
    connection = connect(settings.AMQP_URL)
    channel = connection.channel()
    for name in made:
        for suffix in ("", ".dlq"):
            channel.queue_delete(queue=name + suffix)
        channel.exchange_delete(exchange=name + ".dlx")
    connection.close()


def client_for(user: User, *, enforce_csrf_checks: bool = False) -> Client:
    """A test client signed in as `user`."""
    client = Client(enforce_csrf_checks=enforce_csrf_checks)
    client.force_login(user)
    return client


@pytest.fixture
def celery_queue() -> Iterator[str]:
    """This run's Celery queue (tasks the test enqueues go there); emptied afterwards, so no later worker runs
    them against another test's database."""
    yield settings.CELERY_TASK_DEFAULT_QUEUE
    connection = connect(settings.AMQP_URL)
    channel = connection.channel()
    channel.queue_declare(queue=settings.CELERY_TASK_DEFAULT_QUEUE, durable=True)
    channel.queue_purge(queue=settings.CELERY_TASK_DEFAULT_QUEUE)
    connection.close()
