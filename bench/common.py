"""Small helpers shared by the benchmarks: a fresh PostgreSQL database, RabbitMQ queues, timing, a report.

Benchmarks run from the repository root with the project's virtualenv; `make bench` runs them all.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pika
import psycopg

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
AMQP_URL = os.environ.get("AMQP_URL", "amqp://guest:guest@localhost:5672/%2F")
POSTGRES_URL = os.environ.get("BENCH_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432")


def database_url(name: str) -> str:
    return f"{POSTGRES_URL}/{name}"


def fresh_database(name: str) -> str:
    """Drop and create database `name` and migrate it; returns its DATABASE_URL."""
    with psycopg.connect(database_url("postgres"), autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        connection.execute(f'CREATE DATABASE "{name}"')
    url = database_url(name)
    manage(["migrate", "--no-input", "-v0"], database=url)
    return url


def drop_database(name: str) -> None:
    with psycopg.connect(database_url("postgres"), autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def project_env(database: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ, DATABASE_URL=database, AMQP_URL=AMQP_URL, PYTHONPATH=str(ROOT), LOG_LEVEL="WARNING")
    env.update(extra)
    return env


def manage(arguments: Sequence[str], *, database: str, **extra: str) -> subprocess.CompletedProcess[str]:
    """Run `manage.py <arguments>` against `database` and wait; raises if it fails."""
    return subprocess.run(
        [PYTHON, str(ROOT / "manage.py"), *arguments],
        env=project_env(database, **extra),
        check=True,
        text=True,
        capture_output=True,
    )


@contextmanager
def amqp_channel() -> Iterator[pika.adapters.blocking_connection.BlockingChannel]:
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    try:
        yield connection.channel()
    finally:
        if connection.is_open:
            connection.close()


def queue_depth(queue: str) -> int:
    with amqp_channel() as channel:
        return int(channel.queue_declare(queue=queue, passive=True).method.message_count)


def wait_until(condition: Callable[[], bool], *, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return condition()


def rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("inf")


def report(title: str, rows: Sequence[tuple[str, str]]) -> None:
    """Print a titled two-column table."""
    width = max(len(label) for label, _ in rows)
    print(f"\n== {title}")
    for label, value in rows:
        print(f"  {label.ljust(width)}  {value}")
    sys.stdout.flush()
