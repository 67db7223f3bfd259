"""The shared test world: users with each role, RabbitMQ queues that clean up after themselves, real Celery
workers on the test's database, and migrations run back and forth."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import secrets
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest
import redis
import time_machine
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client

from dlqconsole.brokers import registry
from dlqconsole.core.amqp import connect
from dlqconsole.core.breaker import LocalBreakers, RedisBreakers, get_breakers
from dlqconsole.operations import canary
from tests.factories import UserFactory
from tests.support import Vhost, Worker, vhost_broker, worker_environment

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
def _fast_password_hasher(settings: Any) -> None:
    """Users the tests make get their passwords hashed with MD5, in microseconds: PBKDF2 takes a quarter of a second
    a user, and the suite makes hundreds. PBKDF2 still checks the passwords that commands the tests run hashed."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher", *settings.PASSWORD_HASHERS]


@pytest.fixture(autouse=True)
def _brokers_read_afresh() -> Iterator[None]:
    """Each test reads the brokers of its own settings and database (a flushed table loses `default`; a test may
    set DLQ_BROKERS)."""
    registry.forget()
    yield
    registry.forget()


@pytest.fixture(autouse=True)
def _one_consumer_process(settings: Any) -> None:
    """consume_dlq called in the test process runs its consumer in that process (forking pytest would copy its
    database connections); consume_dlq started as a subprocess keeps its default, several processes."""
    settings.DLQ_CONSUMER_PROCESSES = 1


@pytest.fixture(autouse=True)
def _breakers_forgotten() -> Iterator[None]:
    """No test leaves a circuit breaker behind: an open one never expires, and the default alert rule would fire
    for it in the tests after."""
    yield
    breakers = get_breakers()
    if isinstance(breakers, LocalBreakers):
        breakers.states.clear()
    elif isinstance(breakers, RedisBreakers):
        with contextlib.suppress(redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            states = list(breakers.client.scan_iter(match=f"{breakers.prefix}*"))
            if states:
                breakers.client.delete(*states)


@pytest.fixture(autouse=True)
def _came_back_counted_on_every_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """A page or an API read counts what came back at most every few seconds per operation (a key in the shared
    cache, by operation id): ids repeat between tests, so tests count on every read unless they test that limit."""
    monkeypatch.setattr(canary, "RECOUNT_ON_READ_SECONDS", 0)


@pytest.fixture
def viewer(db: None) -> User:
    return UserFactory.create(username="vera-viewer", role="viewer")


@pytest.fixture
def operator(db: None) -> User:
    return UserFactory.create(username="otto-operator", role="operator")


@pytest.fixture
def admin_user(db: None) -> User:
    return UserFactory.create(username="ada-admin", role="admin")


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


@pytest.fixture
def second_vhost(settings: Any) -> Iterator[Vhost]:
    """A vhost of its own as the broker "second" beside default (tests/support.py vhost_broker)."""
    with vhost_broker(settings, "second") as vhost:
        yield vhost


@pytest.fixture
def second_channel(second_vhost: Vhost) -> Iterator[pika.adapters.blocking_connection.BlockingChannel]:
    """A channel on the broker "second"; a test may have had the broker force-close it."""
    connection = connect(second_vhost.url)
    yield connection.channel()
    with contextlib.suppress(pika.exceptions.AMQPError):
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


@pytest.fixture
def celery_worker(tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    """Start real Celery workers with `celery_worker(**extra_env)`: the console's app on this run's queue, with
    `control=True` on the control queue too, or another `app` and `queue`. Every one is stopped afterwards."""
    started: list[Worker] = []

    def start(*, app: str = "dlqconsole", queue: str = "", control: bool = False, **extra_env: str) -> Worker:
        queues = [queue or settings.CELERY_TASK_DEFAULT_QUEUE] + ([settings.DLQ_CONTROL_QUEUE] if control else [])
        worker = Worker(
            log=tmp_path / f"worker-{len(started)}.log",
            env=worker_environment(tmp_path, extra_env),
            app=app,
            queues=queues,
        )
        worker.start()
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


@pytest.fixture
def migrate() -> Iterator[Any]:
    """migrate(targets) -> the historical apps at that state; the database is migrated forward again after."""

    def to(targets: list[tuple[str, str]]) -> Any:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(targets)
        return executor.loader.project_state(targets).apps

    yield to
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())
