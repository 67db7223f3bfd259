"""manage.py run from the checkout: it takes the settings of the last `make run` for what its shell does not set,
the tests never read a developer's, and a database that was never migrated gets one line saying what to run
instead of a traceback. Each command runs for real in a subprocess."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).resolve().parent.parent
SHOW_SETTINGS = "from django.conf import settings; print(settings.DATABASES['default']['NAME'], settings.TIME_ZONE)"


def manage(*arguments: str, script: Path = ROOT / "manage.py", **env: str) -> subprocess.CompletedProcess[str]:
    # A plain shell: none of the settings the test run exports for itself.
    base = {name: value for name, value in os.environ.items() if name not in {"DATABASE_URL", "DLQ_VAR_DIR"}}
    return subprocess.run(
        [sys.executable, str(script), *arguments],
        env={**base, "PYTHONPATH": str(ROOT), **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_command_takes_the_settings_of_the_last_make_run_where_its_shell_sets_none(tmp_path: Path) -> None:
    (tmp_path / "make-run.env").write_text(
        f"# written by make run\nDATABASE_URL='sqlite:///{tmp_path}/run.sqlite3'\nTIME_ZONE=Asia/Tokyo\n"
    )

    taken = manage("shell", "-c", SHOW_SETTINGS, DLQ_VAR_DIR=str(tmp_path))
    shell_wins = manage("shell", "-c", SHOW_SETTINGS, DLQ_VAR_DIR=str(tmp_path), TIME_ZONE="Europe/Paris")

    assert taken.stdout.splitlines()[-1] == f"{tmp_path}/run.sqlite3 Asia/Tokyo", taken.stderr
    assert shell_wins.stdout.splitlines()[-1] == f"{tmp_path}/run.sqlite3 Europe/Paris", shell_wins.stderr


def test_an_empty_console_url_means_the_default_not_links_without_a_host(tmp_path: Path) -> None:
    show = "from django.conf import settings; print(settings.DLQ_CONSOLE_URL)"

    result = manage("shell", "-c", show, DLQ_VAR_DIR=str(tmp_path), DLQ_CONSOLE_URL="")

    assert result.stdout.splitlines()[-1] == "http://localhost:8000", result.stderr


def test_without_dlq_var_dir_the_file_is_read_from_var_in_the_checkout(tmp_path: Path) -> None:
    # A copy of manage.py stands for the checkout, so that the developer's own var/make-run.env stays out of it.
    shutil.copy(ROOT / "manage.py", tmp_path / "manage.py")
    (tmp_path / "var").mkdir()
    (tmp_path / "var" / "make-run.env").write_text(f"DATABASE_URL=sqlite:///{tmp_path}/var/run.sqlite3\n")

    result = manage("shell", "-c", SHOW_SETTINGS, script=tmp_path / "manage.py")

    assert result.stdout.splitlines()[-1].split()[0] == f"{tmp_path}/var/run.sqlite3", result.stderr


def test_the_test_command_points_dlq_var_dir_away_from_the_make_run_file(tmp_path: Path) -> None:
    # scripts/test in a scratch checkout whose checks pass and whose pytest prints the variable it was given.
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "test", tmp_path / "scripts" / "test")
    (tmp_path / "scripts" / "check-module-size").write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / "scripts" / "check-module-size").chmod(0o755)
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    tools = {
        "python": f'exec "{sys.executable}" "$@"',
        "ruff": "exit 0",
        "mypy": "exit 0",
        "lint-imports": "exit 0",
        "djlint": "exit 0",
        "pytest": 'echo "DLQ_VAR_DIR=$DLQ_VAR_DIR"',
    }
    for name, body in tools.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}

    result = subprocess.run(
        [str(tmp_path / "scripts" / "test")], env=env, capture_output=True, text=True, timeout=120, check=False
    )

    assert result.returncode == 0, result.stderr
    given = {line for line in result.stdout.splitlines() if line.startswith("DLQ_VAR_DIR=")}
    assert given == {f"DLQ_VAR_DIR={tmp_path}/var/test"}


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
