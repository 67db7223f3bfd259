"""The processes that sign (the web server under gunicorn or runserver, the Celery workers and beat) refuse to start
without a real SECRET_KEY unless DEBUG is on, with one line naming it; `check --deploy` reports it as an error;
offline commands (migrate, check, `dlq fingerprint`) need no key.

Each process runs for real in a subprocess, on a SQLite database of its own and the test run's broker."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dlqconsole.core.amqp import connect

ROOT = Path(__file__).resolve().parent.parent
MANAGE = str(ROOT / "manage.py")
COMPOSE_PLACEHOLDER = "change-me-in-production-please-0123456789abcdef"
DEVELOPMENT_KEY = "dev-insecure-dlqconsole-secret-key-change-me-0123456789"
PUBLIC_OR_WEAK_KEYS = {
    "absent": None,
    "empty": "",
    "the development default": DEVELOPMENT_KEY,
    "compose's placeholder": COMPOSE_PLACEHOLDER,
    "short": "only-thirty-characters-long-ok",
    "django-insecure": "django-insecure-" + "x1y2z3" * 10,
}
STARTUP_TIMEOUT = 90


def environment(tmp_path: Path, secret_key: str | None, **extra: str) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if name not in {"SECRET_KEY", "DEBUG"}}
    env |= {
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "DLQ_VAR_DIR": str(tmp_path),
        "PYTHONUNBUFFERED": "1",
        **extra,
    }
    if secret_key is not None:
        env["SECRET_KEY"] = secret_key
    return env


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def run_until_it_exits(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Runs a process that should refuse to start; one still running after the timeout did not refuse."""
    process = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = process.communicate(timeout=STARTUP_TIMEOUT)
    except subprocess.TimeoutExpired:
        stop(process)
        stdout, stderr = process.communicate()
        raise AssertionError(f"{command} started without a real SECRET_KEY:\n{stderr[-3000:]}") from None
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def start_and_wait(command: list[str], env: dict[str, str], log: Path, started: Callable[[], bool]) -> None:
    """Starts a process that should start, waits until `started()` says it did, and stops it."""
    with log.open("w") as output:
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while not started():
            assert process.poll() is None, f"{command} exited:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"{command} did not start:\n{log.read_text()[-3000:]}"
            time.sleep(0.2)
    finally:
        stop(process)


def answers(port: int) -> Callable[[], bool]:
    def check() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, ConnectionError):
            return False

    return check


def assert_refused_with_one_line(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode != 0, result.stderr[-3000:]
    naming = [line for line in result.stderr.splitlines() if "SECRET_KEY" in line]
    assert len(naming) == 1, result.stderr[-3000:]
    assert "refusing to start" in naming[0]
    assert "Traceback" not in result.stderr


def gunicorn(port: int) -> list[str]:
    return [sys.executable, "-m", "gunicorn", "dlqconsole.wsgi", "--bind", f"127.0.0.1:{port}", "--workers", "1"]


def celery(*arguments: str) -> list[str]:
    return [sys.executable, "-m", "celery", "-A", "dlqconsole", *arguments]


@pytest.fixture
def queue() -> Iterator[str]:
    """Task queues of this test's own (work and control), so that its processes take or send no other test's
    tasks; deleted afterwards (on a connection of their own: one left idle while the process ran would be gone)."""
    name = f"secret-key-test-{uuid.uuid4().hex[:12]}"
    yield name
    connection = connect()
    channel = connection.channel()
    for queue_name in (name, f"{name}.control"):
        channel.queue_delete(queue_name)
        channel.exchange_delete(queue_name)
    connection.close()


def worker_arguments(queue: str) -> list[str]:
    return ["worker", "--pool=solo", f"--hostname={queue}@%h", "--without-gossip", "--without-mingle", "-Q", queue]


@pytest.mark.parametrize("secret_key", ["absent", "compose's placeholder", "short"])
def test_gunicorn_refuses_to_start_without_a_real_secret_key(tmp_path: Path, secret_key: str) -> None:
    result = run_until_it_exits(gunicorn(free_port()), environment(tmp_path, PUBLIC_OR_WEAK_KEYS[secret_key]))

    assert_refused_with_one_line(result)


def test_gunicorn_serves_with_a_real_secret_key_or_with_debug_on(tmp_path: Path) -> None:
    port = free_port()
    start_and_wait(
        gunicorn(port), environment(tmp_path, secrets.token_urlsafe(50)), tmp_path / "real-key.log", answers(port)
    )
    start_and_wait(gunicorn(port), environment(tmp_path, None, DEBUG="true"), tmp_path / "debug.log", answers(port))


def test_runserver_refuses_to_start_without_a_real_secret_key(tmp_path: Path) -> None:
    # With its autoreloader, as developers run it: the server is loaded in a thread of the reloaded child.
    result = run_until_it_exits(
        [sys.executable, MANAGE, "runserver", f"127.0.0.1:{free_port()}"], environment(tmp_path, None)
    )

    assert_refused_with_one_line(result)


def test_runserver_serves_with_debug_on_and_no_key(tmp_path: Path) -> None:
    port = free_port()
    start_and_wait(
        [sys.executable, MANAGE, "runserver", f"127.0.0.1:{port}"],
        environment(tmp_path, None, DEBUG="true"),
        tmp_path / "runserver.log",
        answers(port),
    )


def test_a_celery_worker_refuses_to_start_without_a_real_secret_key(tmp_path: Path, queue: str) -> None:
    result = run_until_it_exits(
        celery(*worker_arguments(queue)), environment(tmp_path, COMPOSE_PLACEHOLDER, CELERY_TASK_DEFAULT_QUEUE=queue)
    )

    assert_refused_with_one_line(result)


def test_a_celery_worker_starts_with_a_real_secret_key(tmp_path: Path, queue: str) -> None:
    log = tmp_path / "worker.log"
    start_and_wait(
        celery(*worker_arguments(queue), "--loglevel=INFO"),
        environment(tmp_path, secrets.token_urlsafe(50), CELERY_TASK_DEFAULT_QUEUE=queue),
        log,
        lambda: " ready." in log.read_text(),
    )


def test_celery_beat_refuses_to_start_without_a_real_secret_key(tmp_path: Path, queue: str) -> None:
    result = run_until_it_exits(
        celery("beat", "--schedule", str(tmp_path / "schedule")),
        environment(tmp_path, DEVELOPMENT_KEY, CELERY_TASK_DEFAULT_QUEUE=queue),
    )

    assert_refused_with_one_line(result)


def test_celery_beat_starts_with_a_real_secret_key(tmp_path: Path, queue: str) -> None:
    log = tmp_path / "beat.log"
    # Beat logs "Starting" before it checks the key; it sends its first due tasks after.
    start_and_wait(
        celery("beat", "--loglevel", "INFO", "--schedule", str(tmp_path / "schedule")),
        environment(tmp_path, secrets.token_urlsafe(50), CELERY_TASK_DEFAULT_QUEUE=queue),
        log,
        lambda: "Scheduler: Sending due task" in log.read_text(),
    )


@pytest.mark.parametrize("secret_key", PUBLIC_OR_WEAK_KEYS)
def test_check_deploy_reports_a_missing_public_or_weak_secret_key_as_an_error(tmp_path: Path, secret_key: str) -> None:
    result = subprocess.run(
        [sys.executable, MANAGE, "check", "--deploy"],
        cwd=ROOT,
        env=environment(tmp_path, PUBLIC_OR_WEAK_KEYS[secret_key]),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("?: (dlqconsole.E001)")]
    assert len(errors) == 1 and "SECRET_KEY" in errors[0], result.stderr


def test_check_deploy_accepts_a_real_secret_key(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, MANAGE, "check", "--deploy"],
        cwd=ROOT,
        env=environment(tmp_path, secrets.token_urlsafe(50)),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert "dlqconsole.E001" not in result.stdout + result.stderr


def test_offline_commands_need_no_secret_key(tmp_path: Path) -> None:
    env = environment(tmp_path, None)

    def manage(*arguments: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, MANAGE, *arguments],
            cwd=ROOT,
            env=env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    migrated = manage("migrate", "--no-input", "-v0")
    checked = manage("check")
    fingerprinted = manage("dlq", "fingerprint", stdin="Request timed out after 5000ms\n")

    assert migrated.returncode == 0, migrated.stderr
    assert checked.returncode == 0, checked.stderr
    assert fingerprinted.returncode == 0, fingerprinted.stderr
    assert "Request timed out after <NUM>ms" in fingerprinted.stdout
