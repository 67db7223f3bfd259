"""/healthz answers 200 when the database and the broker answer, and 503 naming the one that does not."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
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
