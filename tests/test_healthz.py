"""/healthz answers 200 when the database and the broker answer, and 503 naming the one that does not. It needs
no login, so the broker's answer is kept for a few seconds: calls piling up do not pile up AMQP connections."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from django.conf import settings
from django.test import Client, override_settings

pytestmark = [pytest.mark.django_db]

ROOT = Path(__file__).resolve().parents[1]


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_healthy_without_login(client: Client) -> None:
    response = client.get("/healthz")

    assert response.status_code == 200
    assert response.json() == {"status": "ok", "database": "ok", "broker": "ok"}
    assert "no-cache" in response["Cache-Control"]


def test_broker_down_is_503(client: Client) -> None:
    with override_settings(AMQP_URL=f"amqp://guest:guest@127.0.0.1:{closed_port()}/%2F"):
        response = client.get("/healthz")

    assert response.status_code == 503
    body = response.json()
    assert (body["status"], body["database"]) == ("error", "ok")
    assert body["broker"].startswith("error: AMQPConnectionError")


def test_wrong_broker_credentials_are_503(client: Client) -> None:
    with override_settings(AMQP_URL="amqp://guest:wrong-password@127.0.0.1:5672/%2F"):
        response = client.get("/healthz")

    assert response.status_code == 503
    assert response.json()["broker"].startswith("error:")


def test_only_get_is_allowed(client: Client) -> None:
    assert client.post("/healthz").status_code == 405


def test_database_down_is_503() -> None:
    """A web process whose database does not answer (a fresh process: the test database stays up)."""
    script = (
        "import django, json; django.setup(); from django.test import Client; "
        "response = Client().get('/healthz'); print(response.status_code, json.dumps(response.json()))"
    )
    env = dict(os.environ, DATABASE_URL=f"postgres://postgres@127.0.0.1:{closed_port()}/dlqconsole")
    env.setdefault("DJANGO_SETTINGS_MODULE", "dlqconsole.settings")
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=True
    )

    status, _, text = done.stdout.strip().splitlines()[-1].partition(" ")
    body = json.loads(text)
    assert status == "503"
    assert (body["status"], body["broker"]) == ("error", "ok")
    assert body["database"].startswith("error: OperationalError")


@pytest.mark.django_db
def test_favicon_needs_no_login_and_points_at_the_console_icon(client: Client) -> None:
    response = client.get("/favicon.ico")

    assert response.status_code == 302 and response["Location"].endswith("img/favicon.svg")
    page = client.get("/login/").content.decode()
    assert 'rel="icon"' in page and "img/favicon.svg" in page


class CountingProxy:
    """A TCP proxy to RabbitMQ that counts the connections made through it: the broker connections /healthz opens.
    (RabbitMQ's own connection counters are the whole broker's, which other tests move at the same time.)"""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.connections = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.lock = threading.Lock()
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                self.connections += 1
            upstream = socket.create_connection(self.target)
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self.pipe, args=(source, sink), daemon=True).start()

    @staticmethod
    def pipe(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        # shutdown() wakes the accept() under way; close() alone would leave it taking one more connection.
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()


@pytest.fixture
def broker_proxy() -> Iterator[CountingProxy]:
    parameters = pika.URLParameters(settings.AMQP_URL)
    proxy = CountingProxy((parameters.host, parameters.port))
    yield proxy
    proxy.close()


def proxied_url(proxy: CountingProxy) -> str:
    parameters = pika.URLParameters(settings.AMQP_URL)
    vhost = urllib.parse.quote(parameters.virtual_host, safe="")
    user, password = parameters.credentials.username, parameters.credentials.password  # type: ignore[attr-defined]
    return f"amqp://{user}:{password}@127.0.0.1:{proxy.port}/{vhost}"


def test_fifty_health_checks_open_at_most_a_couple_of_broker_connections(
    client: Client, broker_proxy: CountingProxy
) -> None:
    with override_settings(AMQP_URL=proxied_url(broker_proxy)):
        bodies = [client.get("/healthz").json() for _ in range(50)]

    assert bodies == [{"status": "ok", "database": "ok", "broker": "ok"}] * 50
    assert 1 <= broker_proxy.connections <= 2


def test_without_the_cache_every_health_check_opens_a_broker_connection(
    client: Client, broker_proxy: CountingProxy
) -> None:
    """The same count with the broker's answer kept for no time: the proxy sees each check."""
    with override_settings(AMQP_URL=proxied_url(broker_proxy), DLQ_HEALTHZ_BROKER_CACHE_SECONDS=0):
        statuses = [client.get("/healthz").status_code for _ in range(10)]

    assert statuses == [200] * 10
    assert broker_proxy.connections == 10


def test_a_broker_that_went_down_is_reported_once_the_kept_answer_is_stale(
    client: Client, broker_proxy: CountingProxy
) -> None:
    url = proxied_url(broker_proxy)
    with override_settings(AMQP_URL=url):
        assert client.get("/healthz").status_code == 200
        broker_proxy.close()
        kept = client.get("/healthz")
    with override_settings(AMQP_URL=url, DLQ_HEALTHZ_BROKER_CACHE_SECONDS=0):
        fresh = client.get("/healthz")

    assert kept.status_code == 200
    assert fresh.status_code == 503 and fresh.json()["broker"].startswith("error: AMQPConnectionError")
