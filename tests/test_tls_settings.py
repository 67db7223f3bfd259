"""Behind TLS, the environment turns on secure cookies, HSTS, the redirect of plain HTTP and the proxy's HTTPS header
(README, "Behind TLS"): Django's deployment checks are then clean, and the pages behave so.

Settings are read once per process, so each case runs in a fresh one with its own environment."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEHIND_TLS = {
    "SECURE_COOKIES": "true",
    "SECURE_SSL_REDIRECT": "true",
    "SECURE_HSTS_SECONDS": "31536000",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS": "true",
    "SECURE_HSTS_PRELOAD": "true",
    "SECURE_PROXY_SSL_HEADER": "X-Forwarded-Proto",
}
# Asks the pages over plain HTTP and as forwarded by a TLS proxy, and prints what came back.
REQUESTS = """
import django, json
django.setup()
from django.test import Client
client = Client()
plain = client.get("/login/")
forwarded = client.get("/login/", headers={"X-Forwarded-Proto": "https"})
health = client.get("/healthz")
print(json.dumps({
    "plain": [plain.status_code, plain.get("Location", "")],
    "forwarded": [forwarded.status_code, forwarded.get("Strict-Transport-Security", "")],
    "csrf_cookie_secure": bool(forwarded.cookies["csrftoken"]["secure"]),
    "health": health.status_code,
}))
"""


def environment(tmp_path: Path, **extra: str) -> dict[str, str]:
    # Nothing of this test run's own: the browser tests' DJANGO_ALLOW_ASYNC_UNSAFE is a deploy check error of its own.
    left_out = {"DEBUG", "DJANGO_ALLOW_ASYNC_UNSAFE", *BEHIND_TLS}
    env = {name: value for name, value in os.environ.items() if name not in left_out}
    return env | {
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "DLQ_VAR_DIR": str(tmp_path),
        "SECRET_KEY": secrets.token_urlsafe(50),
        "ALLOWED_HOSTS": "dlq.example.com,testserver",
        "DJANGO_SETTINGS_MODULE": "dlqconsole.settings",
        **extra,
    }


def python(script: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def test_check_deploy_is_clean_behind_tls(tmp_path: Path) -> None:
    result = python(["manage.py", "check", "--deploy", "--fail-level", "WARNING"], environment(tmp_path, **BEHIND_TLS))

    assert result.returncode == 0, result.stderr
    assert "System check identified no issues" in result.stdout


def test_check_deploy_warns_without_the_tls_settings(tmp_path: Path) -> None:
    result = python(["manage.py", "check", "--deploy", "--fail-level", "WARNING"], environment(tmp_path))

    assert result.returncode == 1
    for check in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert check in result.stderr


def test_behind_tls_plain_http_is_redirected_and_forwarded_https_gets_hsts_and_secure_cookies(tmp_path: Path) -> None:
    result = python(["-c", REQUESTS], environment(tmp_path, **BEHIND_TLS))

    assert result.returncode == 0, result.stderr
    pages = json.loads(result.stdout.strip().splitlines()[-1])
    assert pages["plain"] == [301, "https://testserver/login/"]
    assert pages["forwarded"] == [200, "max-age=31536000; includeSubDomains; preload"]
    assert pages["csrf_cookie_secure"] is True
    # The container health check and Prometheus call these over plain HTTP inside the network.
    assert pages["health"] == 200


def test_a_proxy_header_that_is_no_header_name_is_refused_by_name(tmp_path: Path) -> None:
    result = python(
        ["manage.py", "check"], environment(tmp_path, SECURE_PROXY_SSL_HEADER="X-Forwarded-Proto https; evil")
    )

    assert result.returncode != 0
    assert "SECURE_PROXY_SSL_HEADER" in result.stderr
