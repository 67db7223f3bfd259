"""scripts/services on a machine without PostgreSQL, Redis or RabbitMQ: as root it installs the missing Debian
packages and starts them, as another user it prints the apt-get line to run and stops.

It runs in a scratch copy of the checkout with a PATH of stand-ins only, so the real package manager and services
are out of its reach: `apt-get` records its calls and "installs" a package by putting that package's stand-in
commands on PATH; each service's stand-in records how it was called and listens on the port the test gave its URL
(nothing listens there before), as the service would; `id` says who runs the script."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# What the script needs of the system besides the commands under test.
TOOLS = ("bash", "dirname", "seq", "sleep", "grep", "ls", "head")
# A service's stand-in listens on its port for a minute at most (the test ends it sooner).
LISTEN = "import socket, sys, time; s = socket.create_server(('127.0.0.1', int(sys.argv[1]))); time.sleep(60)"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Machine:
    root: Path
    ports: dict[str, int] = field(default_factory=lambda: {name: free_port() for name in ("pg", "redis", "amqp")})

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    def calls(self) -> list[str]:
        path = self.root / "calls"
        return path.read_text().splitlines() if path.exists() else []

    def run(self, *, uid: int = 0, dotenv: str | None = None, **urls: str) -> subprocess.CompletedProcess[str]:
        self.command("id", f"echo {uid}")
        if dotenv is not None:
            (self.root / ".env").write_text(dotenv)
            venv = self.root / ".venv" / "bin"
            venv.mkdir(parents=True, exist_ok=True)
            # The checkout's own Python (honcho reads .env), as scripts/services finds it.
            (venv / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
            (venv / "python").chmod(0o755)
        env = {
            "PATH": str(self.bin),
            "HOME": str(self.root),
            "REDIS_URL": f"redis://127.0.0.1:{self.ports['redis']}/0",
            "AMQP_URL": f"amqp://guest:guest@localhost:{self.ports['amqp']}/%2F",
            **urls,
        }
        return subprocess.run(
            [str(self.root / "scripts" / "services")], env=env, capture_output=True, text=True, timeout=120, check=False
        )

    def command(self, name: str, body: str, *, into: Path | None = None, record: str = "") -> None:
        path = (into or self.bin) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f'#!/bin/sh\necho "{record}{name} $*" >> "{self.root}/calls"\n{body}\n')
        path.chmod(0o755)

    def package(self, name: str, **commands: str) -> None:
        """A Debian package for the stand-in apt-get: its commands, put on PATH when it is installed."""
        for command, body in commands.items():
            self.command(command, body, into=self.root / "packages" / name)

    def listener(self, service: str) -> str:
        # Detached from the script's output, which the test reads to its end; its id is kept for the clean-up.
        return (
            f"'{sys.executable}' -c \"{LISTEN}\" {self.ports[service]} >/dev/null 2>&1 </dev/null &\n"
            f'echo $! >> "{self.root}/pids"'
        )


@pytest.fixture
def machine(tmp_path: Path) -> Iterator[Machine]:
    """A machine where nothing of the console's is installed and apt-get offers the three packages."""
    made = Machine(tmp_path)
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "services", tmp_path / "scripts" / "services")
    made.bin.mkdir()
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found is not None, tool
        (made.bin / tool).symlink_to(found)
    packages, copy = tmp_path / "packages", shutil.which("cp")
    made.command(
        "apt-get",
        f'for name in "$@"; do [ -d "{packages}/$name" ] && {copy} "{packages}/$name"/* "{made.bin}"; done\nexit 0',
        record="DEBIAN_FRONTEND=$DEBIAN_FRONTEND ",
    )
    made.package("postgresql", pg_ctlcluster=made.listener("pg"))
    made.package("redis-server", **{"redis-server": made.listener("redis")})
    made.package(
        "rabbitmq-server",
        **{
            "rabbitmq-server": made.listener("amqp"),
            "rabbitmqctl": '[ "$2" = list_vhosts ] && echo /\nexit 0',
            "rabbitmq-plugins": '[ "$1" = list ] && printf "rabbitmq_shovel\\nrabbitmq_management\\n"\nexit 0',
        },
    )
    yield made
    pids = tmp_path / "pids"
    for pid in pids.read_text().split() if pids.exists() else []:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGTERM)


def installed(machine: Machine) -> list[str]:
    """The packages each `apt-get install` asked for, without asking anything (no recommended extras, no questions)."""
    return [
        call.split(" apt-get install -y -qq --no-install-recommends ", 1)[1]
        for call in machine.calls()
        if call.startswith("DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ")
    ]


def apt_calls(machine: Machine) -> list[str]:
    return [call.split(" ", 1)[1].split(" ", 2)[1] for call in machine.calls() if " apt-get " in call]


def test_as_root_without_database_url_it_installs_and_starts_redis_and_rabbitmq_and_uses_sqlite(
    machine: Machine,
) -> None:
    result = machine.run()

    assert result.returncode == 0, result.stderr
    calls = machine.calls()
    assert apt_calls(machine) == ["update", "install"]
    assert installed(machine) == ["redis-server rabbitmq-server"]
    redis = next(call for call in calls if call.startswith("redis-server"))
    assert "--daemonize yes" in redis and f"--port {machine.ports['redis']}" in redis
    assert "rabbitmq-server -detached" in calls
    # The vhost of the console's own Celery, on the RabbitMQ just installed.
    assert "rabbitmqctl -q add_vhost dlqconsole" in calls
    assert not any(call.startswith("pg_ctlcluster") for call in calls)
    assert "make run keeps its data in SQLite" in result.stdout


def test_as_root_with_a_database_url_naming_this_machine_it_installs_and_starts_postgresql_too(
    machine: Machine,
) -> None:
    result = machine.run(DATABASE_URL=f"postgres://dlq:pw@127.0.0.1:{machine.ports['pg']}/dlqconsole")

    assert result.returncode == 0, result.stderr
    assert installed(machine) == ["postgresql redis-server rabbitmq-server"]
    (start,) = [call for call in machine.calls() if call.startswith("pg_ctlcluster")]
    assert "--skip-systemctl-redirect" in start and start.endswith(" main start")
    assert "create the role" in result.stdout


def test_a_database_url_in_env_counts_as_one_in_the_shell(machine: Machine) -> None:
    result = machine.run(dotenv=f"DATABASE_URL=postgres://dlq:pw@localhost:{machine.ports['pg']}/dlqconsole\n")

    assert result.returncode == 0, result.stderr
    assert installed(machine) == ["postgresql redis-server rabbitmq-server"]


def test_as_another_user_it_prints_the_apt_get_line_to_run_and_stops(machine: Machine) -> None:
    result = machine.run(uid=1000, DATABASE_URL=f"postgres://dlq:pw@[::1]:{machine.ports['pg']}/dlqconsole")

    assert result.returncode != 0
    assert "sudo apt-get install -y --no-install-recommends postgresql redis-server rabbitmq-server" in result.stderr
    assert [call for call in machine.calls() if not call.startswith("id ")] == []


def test_installed_services_that_are_down_are_started_without_apt_and_a_remote_database_is_left_alone(
    machine: Machine,
) -> None:
    for package in ("postgresql", "redis-server", "rabbitmq-server"):
        for command in (machine.root / "packages" / package).iterdir():
            shutil.copy(command, machine.bin)

    result = machine.run(DATABASE_URL="postgres://dlq:pw@db.internal:5432/dlqconsole")

    assert result.returncode == 0, result.stderr
    calls = machine.calls()
    assert apt_calls(machine) == []
    assert "rabbitmq-server -detached" in calls and any(call.startswith("redis-server") for call in calls)
    assert not any(call.startswith("pg_ctlcluster") for call in calls)
