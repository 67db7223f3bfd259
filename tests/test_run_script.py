"""scripts/run (`make run`) reads .env before its set-up: run in a scratch copy of the checkout whose manage.py and
honcho only print what they were given, so nothing is migrated or started."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
PRINT_ENV = "import json, os, sys; print(json.dumps({'argv': sys.argv[1:], 'env': dict(os.environ)}))\n"
SHOW = "from django.conf import settings; print(settings.DLQ_CONSOLE_URL, settings.DEFAULT_FROM_EMAIL, sep='|')"


def checkout(tmp_path: Path, dotenv: bytes) -> Path:
    (tmp_path / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "run", tmp_path / "scripts" / "run")
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    # The checkout's own Python (honcho is installed there), under the name scripts/run puts first on PATH.
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (bin_dir / "honcho").write_text(f"#!{sys.executable}\n{PRINT_ENV}")
    for tool in (bin_dir / "python", bin_dir / "honcho"):
        tool.chmod(0o755)
    (tmp_path / "manage.py").write_text(PRINT_ENV)
    (tmp_path / ".env").write_bytes(dotenv)
    return tmp_path


def run(root: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ["PATH"], "HOME": str(root), "DATABASE_URL": "sqlite:///unused.sqlite3"}
    return subprocess.run(
        [str(root / "scripts" / "run")], env={**base, **env}, capture_output=True, text=True, timeout=60, check=False
    )


def started_with(result: subprocess.CompletedProcess[str]) -> dict[str, str]:
    assert result.returncode == 0, result.stderr
    last = json.loads(result.stdout.strip().splitlines()[-1])
    assert last["argv"][:1] == ["start"]
    return last["env"]


def test_env_values_with_spaces_dollars_and_quotes_reach_the_processes_as_written(tmp_path: Path) -> None:
    root = checkout(
        tmp_path,
        b'DEFAULT_FROM_EMAIL="DLQ console <dlq@example.com>"\n'
        b"EMAIL_HOST_PASSWORD='pa$$ \"word\" `x` $(y)'\n"
        b"PORT=9123\n"
        b"TIME_ZONE=Europe/Berlin\n",
    )

    env = started_with(run(root, TIME_ZONE="UTC"))

    assert env["DEFAULT_FROM_EMAIL"] == "DLQ console <dlq@example.com>"
    assert env["EMAIL_HOST_PASSWORD"] == 'pa$$ "word" `x` $(y)'
    assert env["PORT"] == "9123"
    assert env["TIME_ZONE"] == "UTC"  # the shell wins
    assert env["BIND"] == "127.0.0.1" and len(env["SECRET_KEY"]) > 40


def test_a_line_whose_name_is_no_shell_variable_is_left_out_not_fatal(tmp_path: Path) -> None:
    root = checkout(tmp_path, "PORT=9124\nNAMEÉ=1\n".encode())

    env = started_with(run(root))

    assert env["PORT"] == "9124"


def test_an_env_file_that_cannot_be_read_stops_the_run_before_the_set_up(tmp_path: Path) -> None:
    root = checkout(tmp_path, b"BIND=0.0.0.0\nDEFAULT_FROM_EMAIL=caf\xe9@example.com\n")

    result = run(root)

    assert result.returncode != 0
    assert "migrate" not in result.stdout


def test_with_env_example_as_env_make_run_still_creates_its_local_database(tmp_path: Path) -> None:
    # `.env.example` says make run reads it as .env: copied as it is, it must not name a database that nobody
    # creates (make run creates `dlqconsole` only when DATABASE_URL is unset). psql here only records its calls.
    root = checkout(tmp_path, (ROOT / ".env.example").read_bytes())
    psql = root / ".venv" / "bin" / "psql"
    psql.write_text(f'#!/bin/sh\necho "$*" >> "{root}/psql-calls"\n')
    psql.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "HOME": str(root)}

    result = subprocess.run(
        [str(root / "scripts" / "run")], env=env, capture_output=True, text=True, timeout=60, check=False
    )

    started = started_with(result)
    if started["DATABASE_URL"].startswith("postgres"):  # PostgreSQL answers on this machine
        assert "CREATE DATABASE dlqconsole" in (root / "psql-calls").read_text()
    else:
        assert "DATABASE_URL" not in started


def test_the_consoles_celery_runs_on_a_vhost_of_its_own_on_the_broker_of_amqp_url(tmp_path: Path) -> None:
    root = checkout(tmp_path, b"")

    default = started_with(run(root))
    remote = started_with(run(root, AMQP_URL="amqps://svc:s3cret@rabbit.internal:5671/shop"))
    chosen = started_with(run(root, CELERY_BROKER_URL="amqp://guest:guest@127.0.0.1:5672/mine"))

    assert default["CELERY_BROKER_URL"] == "amqp://guest:guest@localhost:5672/dlqconsole"
    assert remote["CELERY_BROKER_URL"] == "amqps://svc:s3cret@rabbit.internal:5671/dlqconsole"
    assert chosen["CELERY_BROKER_URL"] == "amqp://guest:guest@127.0.0.1:5672/mine"


def test_the_console_url_alerts_link_to_follows_port_and_bind_unless_set(tmp_path: Path) -> None:
    root = checkout(tmp_path, b"")

    def console_url(**env: str) -> str:
        return started_with(run(root, **env))["DLQ_CONSOLE_URL"]

    assert console_url(PORT="8041") == "http://127.0.0.1:8041"
    assert console_url(BIND="::1") == "http://[::1]:8000"
    # Listening on every address: the host name the console answers to, else this machine's.
    assert console_url(BIND="0.0.0.0") == "http://localhost:8000"
    assert console_url(BIND="::", ALLOWED_HOSTS="*, .example.com,dlq.example.com,localhost") == (
        "http://dlq.example.com:8000"
    )
    assert console_url(PORT="8041", DLQ_CONSOLE_URL="https://dlq.example.com") == "https://dlq.example.com"


def test_an_empty_console_url_in_env_is_derived_too(tmp_path: Path) -> None:
    root = checkout(tmp_path, b"DLQ_CONSOLE_URL=\nPORT=8042\n")

    assert started_with(run(root))["DLQ_CONSOLE_URL"] == "http://127.0.0.1:8042"


def test_make_run_leaves_its_settings_for_later_commands_readable_by_its_user_only(tmp_path: Path) -> None:
    root = checkout(tmp_path, b"TIME_ZONE=Asia/Tokyo\nEMAIL_HOST_PASSWORD='pa$$ \"word\"'\n")

    env = started_with(run(root, PORT="9000", CELERY_TASK_DEFAULT_QUEUE="dlqconsole-second"))

    run_file = root / "var" / "make-run.env"
    written = dict(token.split("=", 1) for token in shlex.split(run_file.read_text(), comments=True))
    assert written["TIME_ZONE"] == "Asia/Tokyo" and written["EMAIL_HOST_PASSWORD"] == 'pa$$ "word"'
    assert written["DLQ_CONSOLE_URL"] == "http://127.0.0.1:9000" and written["SECRET_KEY"] == env["SECRET_KEY"]
    assert written["REDIS_URL"] == env["REDIS_URL"] and written["CELERY_BROKER_URL"] == env["CELERY_BROKER_URL"]
    assert written["BIND"] == "127.0.0.1"
    # Where the data is, whoever set it (the harness's shell sets DATABASE_URL): the next shell has lost it. Other
    # settings of the shell are the shell's to set again.
    assert written["DATABASE_URL"] == "sqlite:///unused.sqlite3"
    # The queue this run's workers read, whoever set it: a `dlq retry` from a plain shell queues its task there.
    assert written["CELERY_TASK_DEFAULT_QUEUE"] == "dlqconsole-second"
    assert "PORT" not in written
    assert stat.S_IMODE(run_file.stat().st_mode) == 0o600


def test_the_make_run_file_goes_where_manage_py_finds_it_and_gives_it_what_make_run_used(tmp_path: Path) -> None:
    root = checkout(tmp_path / "checkout", b'DEFAULT_FROM_EMAIL="DLQ console <dlq@example.com>"\n')
    elsewhere = tmp_path / "elsewhere"

    started_with(run(root, PORT="8043", DLQ_VAR_DIR=str(elsewhere)))
    # The real manage.py, in a plain shell that names only where the file is.
    plain = {name: value for name, value in os.environ.items() if not name.startswith(("DLQ_", "DATABASE_URL"))}
    shown = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "shell", "-c", SHOW],
        env={**plain, "DLQ_VAR_DIR": str(elsewhere), "DATABASE_URL": "sqlite:///unused.sqlite3"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert shown.stdout.splitlines()[-1] == "http://127.0.0.1:8043|DLQ console <dlq@example.com>", shown.stderr


def test_a_postgresql_database_that_does_not_exist_yet_is_made_and_one_out_of_reach_stops_with_one_line(
    tmp_path: Path,
) -> None:
    root = checkout(tmp_path, b"")
    name = f"dlq_run_made_{os.getpid()}"
    server = "postgres://postgres@127.0.0.1:5432"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}"')
    try:
        made = run(root, DATABASE_URL=f"{server}/{name}")
        again = run(root, DATABASE_URL=f"{server}/{name}")
        with psycopg.connect(f"{server}/postgres") as connection:
            exists = connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
    finally:
        with psycopg.connect(f"{server}/postgres", autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    unreachable = run(root, DATABASE_URL="postgres://postgres@127.0.0.1:1/dlqconsole")

    assert started_with(made)["DATABASE_URL"] == f"{server}/{name}" and exists == (1,)
    assert f"Made the database {name}" in made.stdout
    assert "Made the database" not in started_with_output(again)
    assert unreachable.returncode != 0
    assert (
        unreachable.stderr.strip()
        .splitlines()[-1]
        .startswith("make run: cannot reach the database DATABASE_URL names:")
    )
    assert "Traceback" not in unreachable.stderr and "migrate" not in unreachable.stdout


def started_with_output(result: subprocess.CompletedProcess[str]) -> str:
    started_with(result)
    return result.stdout
