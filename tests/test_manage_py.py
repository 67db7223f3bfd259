"""manage.py run from the checkout: a database that was never migrated gets one line saying what to run instead of
a traceback. Each command runs for real in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).resolve().parent.parent


def manage(*arguments: str, **env: str) -> subprocess.CompletedProcess[str]:
    # A plain shell: none of the settings the test run exports for itself.
    base = {name: value for name, value in os.environ.items() if name not in {"DATABASE_URL", "DLQ_VAR_DIR"}}
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *arguments],
        env={**base, "PYTHONPATH": str(ROOT), **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_an_empty_console_url_means_the_default_not_links_without_a_host(tmp_path: Path) -> None:
    show = "from django.conf import settings; print(settings.DLQ_CONSOLE_URL)"

    result = manage("shell", "-c", show, DLQ_VAR_DIR=str(tmp_path), DLQ_CONSOLE_URL="")

    assert result.stdout.splitlines()[-1] == "http://localhost:8000", result.stderr


@pytest.fixture
def empty_postgresql_database() -> Iterator[str]:
    # The test run's PostgreSQL server, reached through its maintenance database.
    address = (os.environ.get("TEST_DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/").rsplit("/", 1)[0]
    server = f"{address}/postgres"
    name = f"dlq_unmigrated_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    yield f"{address}/{name}"
    with psycopg.connect(server, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


@pytest.mark.parametrize(
    "command", [["dlq", "operation", "show", "3"], ["dlq", "report", "failure-patterns"], ["ensure_admin"]]
)
def test_a_command_on_a_database_never_migrated_says_in_one_line_what_to_run(
    tmp_path: Path, command: list[str]
) -> None:
    result = manage(*command, DATABASE_URL=f"sqlite:///{tmp_path}/empty.sqlite3", DLQ_VAR_DIR=str(tmp_path))

    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.splitlines()
    assert "empty.sqlite3" in line and "python manage.py migrate" in line and "make run" in line


def test_an_empty_postgresql_database_gets_the_same_line(tmp_path: Path, empty_postgresql_database: str) -> None:
    result = manage("dlq", "operation", "show", "3", DATABASE_URL=empty_postgresql_database, DLQ_VAR_DIR=str(tmp_path))

    assert result.returncode == 1
    (line,) = result.stderr.splitlines()
    assert "python manage.py migrate" in line and "dlq_unmigrated_" in line
