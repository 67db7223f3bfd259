"""The browser test world: Debian's chromium driven by Playwright against pytest-django's live server, a real
Celery worker on the live server's database, and queues on the real RabbitMQ that died into their DLQ."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection
from django.utils import timezone
from pika.adapters.blocking_connection import BlockingChannel
from playwright.sync_api import Browser, ConsoleMessage, Dialog, Page, ViewportSize, sync_playwright

from dlqconsole.deadletters.models import DeadLetter
from dlqconsole.ingest.envelope import ParsedDeadLetter, parse_envelope
from dlqconsole.ingest.services import ingest_batch
from tests.alerts.conftest import receiver  # noqa: F401  (the webhook receiver fixture, for the alert flows)

BASE_DIR = Path(__file__).resolve().parents[2]
SCREENSHOTS = BASE_DIR / "var" / "artifacts" / "screenshots"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
DESKTOP: ViewportSize = {"width": 1366, "height": 900}
PHONE: ViewportSize = {"width": 375, "height": 812}

# How long a page may wait for a Celery worker to take and finish its work: generous, since a worker that
# starts on a loaded 2-core machine takes seconds to import Django (a ceiling for correctness, not a speed test).
WORKER_WAIT_MS = 60_000


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    # Playwright's sync API runs an asyncio loop in this thread; the test's own ORM calls are still synchronous.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        yield launched
        launched.close()
    if previous is None:
        os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    else:
        os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


class Watched:
    """Everything a page did that a test must see: dialogs (an injected alert() would open one), console
    errors and uncaught exceptions."""

    def __init__(self) -> None:
        self.dialogs: list[str] = []
        self.console_errors: list[str] = []
        self.page_errors: list[str] = []

    def on_dialog(self, dialog: Dialog) -> None:
        self.dialogs.append(f"{dialog.type}: {dialog.message}")
        dialog.dismiss()

    def on_console(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            self.console_errors.append(message.text)


@pytest.fixture
def watched() -> Watched:
    return Watched()


@pytest.fixture
def page(browser: Browser, live_server: Any, watched: Watched) -> Iterator[Page]:
    context = browser.new_context(viewport=DESKTOP, base_url=live_server.url)
    opened = context.new_page()
    opened.on("dialog", watched.on_dialog)
    opened.on("console", watched.on_console)
    opened.on("pageerror", lambda error: watched.page_errors.append(str(error)))
    opened.set_default_timeout(15000)
    yield opened
    context.close()
    # Every page works under the Content Security Policy: nothing the console serves is refused.
    assert [error for error in watched.console_errors if "Content Security Policy" in error] == []


def log_in(page: Page, user: User) -> None:
    page.goto("/login/")
    page.fill("#id_username", user.username)
    page.fill("#id_password", "pw-" + user.username)
    page.click("button[type=submit]")
    page.wait_for_url("**/")


def screenshot(page: Page, name: str) -> None:
    """Save the page at desktop width and at 375 px (test artifacts), and check it does not overflow a phone."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}-desktop.png"), full_page=True)
    page.set_viewport_size(PHONE)
    page.wait_for_timeout(100)
    overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    # The outermost elements that stick out, to say what to fix.
    culprits = page.evaluate(
        """() => [...document.querySelectorAll('body *')]
            .filter(e => e.getBoundingClientRect().right > document.documentElement.clientWidth + 1)
            .filter(e => !e.parentElement.closest('.table-wrap'))
            .slice(0, 5).map(e => e.tagName.toLowerCase() + (e.className ? '.' + e.className : '')
                + ' right=' + Math.round(e.getBoundingClientRect().right))"""
    )
    page.screenshot(path=str(SCREENSHOTS / f"{name}-375.png"), full_page=True)
    page.set_viewport_size(DESKTOP)
    assert overflow <= 0, f"{name} is {overflow}px wider than a 375px screen: {culprits}"


# The broker -----------------------------------------------------------------------------------------------------


def declare_with_dlq(channel: BlockingChannel, queue: str) -> None:
    channel.exchange_declare(exchange=queue + ".dlx", exchange_type="fanout", durable=True)
    channel.queue_declare(queue=queue + ".dlq", durable=True)
    channel.queue_bind(queue=queue + ".dlq", exchange=queue + ".dlx")
    channel.queue_declare(queue=queue, durable=True, arguments={"x-dead-letter-exchange": queue + ".dlx"})


def die_on_broker(
    channel: BlockingChannel, queue: str, bodies: list[bytes], *, headers: dict[str, Any] | None = None
) -> None:
    """Publish to QUEUE and reject each message without requeue, as a failing consumer does."""
    for number, body in enumerate(bodies):
        channel.basic_publish(
            exchange="",
            routing_key=queue,
            body=body,
            properties=pika.BasicProperties(
                message_id=f"{queue}-{number}", content_type="application/json", headers=dict(headers or {})
            ),
        )
    for _ in bodies:
        for _attempt in range(100):
            method, _, _ = channel.basic_get(queue=queue)
            if method is not None:
                break
            time.sleep(0.05)
        assert method is not None, f"{queue} ran dry"
        channel.basic_reject(delivery_tag=method.delivery_tag, requeue=False)


def ingest_dlq(channel: BlockingChannel, dlq: str, *, expect: int) -> list[DeadLetter]:
    """Drain the DLQ into the database as consume_dlq does: parse, ingest, then ack."""
    letters: list[ParsedDeadLetter] = []
    tags: list[int] = []
    deadline = time.monotonic() + 10
    while len(letters) < expect and time.monotonic() < deadline:
        method, properties, body = channel.basic_get(queue=dlq)
        if method is None:
            time.sleep(0.05)
            continue
        letters.append(parse_envelope(source_queue=dlq, body=body, properties=properties, now=timezone.now()))
        tags.append(method.delivery_tag)
    ingest_batch(letters=letters)
    for tag in tags:
        channel.basic_ack(delivery_tag=tag)
    assert len(letters) == expect
    return list(DeadLetter.objects.filter(dedupe_key__in=[letter.dedupe_key for letter in letters]).order_by("pk"))


def drain(channel: BlockingChannel, queue: str) -> list[tuple[pika.BasicProperties, bytes]]:
    found: list[tuple[pika.BasicProperties, bytes]] = []
    while True:
        method, properties, body = channel.basic_get(queue=queue, auto_ack=True)
        if method is None:
            return found
        found.append((properties, body))


# The worker -----------------------------------------------------------------------------------------------------


def database_url() -> str:
    """The live server's database (pytest-django's test_<name>), for the worker subprocess."""
    database = settings.DATABASES["default"]
    if database["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{database['NAME']}"
    user = database.get("USER") or "postgres"
    host = database.get("HOST") or "127.0.0.1"
    port = database.get("PORT") or 5432
    return f"postgres://{user}@{host}:{port}/{connection.settings_dict['NAME']}"


@pytest.fixture
def celery_worker(tmp_path: Path, live_server: Any) -> Iterator[Callable[[], subprocess.Popen[bytes]]]:
    """Start a real Celery worker on this run's queues (work and control) and the live server's database;
    stopped afterwards."""
    started: list[subprocess.Popen[bytes]] = []
    log = tmp_path / "worker.log"

    def start() -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            "DATABASE_URL": database_url(),
            "CELERY_TASK_DEFAULT_QUEUE": settings.CELERY_TASK_DEFAULT_QUEUE,
            "REDIS_URL": settings.REDIS_URL,
            "DLQ_VAR_DIR": str(tmp_path),
            "PYTHONUNBUFFERED": "1",
        }
        env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "dlqconsole",
                "worker",
                "--pool=solo",
                "--without-heartbeat",
                "--without-gossip",
                "--without-mingle",
                "--loglevel=INFO",
                "-Q",
                f"{settings.CELERY_TASK_DEFAULT_QUEUE},{settings.DLQ_CONTROL_QUEUE}",
            ],
            cwd=BASE_DIR,
            env=env,
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
    if log.exists():
        sys.stdout.write(log.read_text()[-3000:])
