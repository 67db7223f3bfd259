"""The deploy files agree with the Compose Specification and with the code: `docker compose up` cannot be run on the
development machines or in CI, so docker-compose.yml, the Procfile and the Dockerfile are checked here instead.

Each check is a function that returns the problems it finds, so that a broken copy of a file shows the message a
real mistake would."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from django.core.management import get_commands

ROOT = Path(__file__).resolve().parent.parent
SCHEMA_PATH = Path(__file__).resolve().parent / "data" / "compose-spec.json"

INFRASTRUCTURE = ("postgres", "rabbitmq", "redis")
APP_SERVICES = ("web", "consumer", "worker", "control", "beat", "demo")
LONG_RUNNING = (*APP_SERVICES, *INFRASTRUCTURE)


def load_compose(path: Path = ROOT / "docker-compose.yml") -> dict[str, Any]:
    # safe_load resolves the anchors and `<<` merge keys, as Compose does before it validates.
    return yaml.safe_load(path.read_text())


def load_procfile(path: Path = ROOT / "Procfile") -> dict[str, str]:
    lines = (line.partition(":") for line in path.read_text().splitlines() if line.strip())
    return {name.strip(): command.strip() for name, _, command in lines}


def schema_problems(compose: dict[str, Any]) -> list[str]:
    schema = json.loads(SCHEMA_PATH.read_text())
    # The schema declares draft-07; check_schema also catches a schema file damaged when it was copied.
    assert schema["$schema"] == "https://json-schema.org/draft-07/schema"
    jsonschema.Draft7Validator.check_schema(schema)
    validator = jsonschema.Draft7Validator(schema)
    return [
        f"{'/'.join(map(str, error.absolute_path)) or '<root>'}: {error.message}"
        for error in validator.iter_errors(compose)
    ]


def reference_problems(compose: dict[str, Any]) -> list[str]:
    """What the schema cannot see: dependencies on services and named volumes that are not declared."""
    services = compose["services"]
    volumes = compose.get("volumes") or {}
    problems = []
    for name, service in services.items():
        problems += [
            f"{name} depends on unknown service {dependency}"
            for dependency in service.get("depends_on", {})
            if dependency not in services
        ]
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if not source.startswith((".", "/", "~")) and source not in volumes:
                problems.append(f"{name} mounts undeclared volume {source}")
    return problems


def health_problems(compose: dict[str, Any]) -> list[str]:
    services = compose["services"]
    problems = []
    for name in LONG_RUNNING:
        check = services.get(name, {}).get("healthcheck", {})
        if not check.get("test") or check.get("disable"):
            problems.append(f"{name} has no healthcheck")
    expected = dict.fromkeys(INFRASTRUCTURE, "service_healthy") | {"migrate": "service_completed_successfully"}
    for name in APP_SERVICES:
        depends_on = services.get(name, {}).get("depends_on", {})
        conditions = (
            {dependency: (depends_on.get(dependency) or {}).get("condition") for dependency in expected}
            if isinstance(depends_on, dict)
            else {}
        )
        if conditions != expected:
            problems.append(f"{name} depends on {conditions or depends_on}, not {expected}")
    return problems


def environment_without_queue_names() -> dict[str, str]:
    return {
        key: value for key, value in os.environ.items() if key not in {"CELERY_TASK_DEFAULT_QUEUE", "DLQ_CONTROL_QUEUE"}
    }


def default_queues() -> tuple[str, str]:
    """The queue names settings.py gives when the environment names none (the tests run with queues of their own)."""
    script = (
        "import django; django.setup(); from django.conf import settings; "
        "print(settings.CELERY_TASK_DEFAULT_QUEUE, settings.DLQ_CONTROL_QUEUE)"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        env={**environment_without_queue_names(), "DJANGO_SETTINGS_MODULE": "dlqconsole.settings"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    default, control = result.stdout.split()
    return default, control


def queues_of(command: str) -> list[str]:
    """The -Q argument of a Celery worker command as the shell expands it with no queue variable set, the way
    honcho runs a Procfile line."""
    match = re.search(r"(?:^|\s)-Q\s+(\S+)", command)
    if not match:
        return []
    expanded = subprocess.run(
        ["sh", "-c", f"printf %s {match[1]}"],
        env=environment_without_queue_names(),
        capture_output=True,
        text=True,
        check=True,
    )
    return expanded.stdout.split(",")


def queue_problems(compose: dict[str, Any], procfile: dict[str, str], default: str, control: str) -> list[str]:
    expected = {"worker": [default], "control": [control]}
    problems = []
    for source, commands in (
        ("docker-compose.yml", {name: service.get("command", "") for name, service in compose["services"].items()}),
        ("Procfile", procfile),
    ):
        for name, queues in expected.items():
            found = queues_of(commands.get(name, ""))
            if found != queues:
                problems.append(f"{source}: {name} consumes {found}, settings default to {queues}")
    return problems


def process_problems(compose: dict[str, Any], procfile: dict[str, str]) -> list[str]:
    in_compose = set(compose["services"]) - {*INFRASTRUCTURE, "migrate"}
    if set(procfile) == in_compose == set(APP_SERVICES):
        return []
    return [
        f"Procfile runs {sorted(procfile)}, docker-compose.yml {sorted(in_compose)}, expected {sorted(APP_SERVICES)}"
    ]


def dockerfile_problems(dockerfile: str) -> list[str]:
    problems = []
    if not re.search(r"^COPY requirements\.txt ", dockerfile, re.MULTILINE):
        problems.append("requirements.txt is not copied into the image")
    if not re.search(r"^RUN pip install .*-r requirements\.txt", dockerfile, re.MULTILINE):
        problems.append("requirements.txt is not installed")
    # Django 6 needs Python 3.12 or newer, as pyproject.toml says.
    base = re.search(r"^FROM python:(\d+)\.(\d+)", dockerfile, re.MULTILINE)
    if not base or (int(base[1]), int(base[2])) < (3, 12):
        problems.append("the base image is not Python 3.12 or newer")
    return problems


def manage_commands(compose: dict[str, Any], procfile: dict[str, str]) -> set[str]:
    texts = list(procfile.values())
    for service in compose["services"].values():
        for value in (service.get("command"), service.get("healthcheck", {}).get("test")):
            texts.append(" ".join(value) if isinstance(value, list) else value or "")
    return {match for text in texts for match in re.findall(r"manage\.py\s+(\w+)", text)}


def test_compose_file_is_valid_against_the_compose_specification() -> None:
    compose = load_compose()
    assert schema_problems(compose) == []
    assert reference_problems(compose) == []


def test_the_schema_rejects_an_unknown_service_key(tmp_path: Path) -> None:
    broken = tmp_path / "docker-compose.yml"
    text = (ROOT / "docker-compose.yml").read_text()
    broken.write_text(text.replace("    image: redis:7\n", "    image: redis:7\n    restart_policy: always\n"))
    problems = schema_problems(load_compose(broken))
    assert problems == ["services/redis: 'restart_policy' does not match any of the regexes: '^x-'"]


def test_long_running_services_have_healthchecks_and_wait_for_what_they_need() -> None:
    assert health_problems(load_compose()) == []


def test_workers_consume_the_queues_settings_default_to() -> None:
    default, control = default_queues()
    assert (default, control) == ("dlqconsole", "dlqconsole.control")
    assert queue_problems(load_compose(), load_procfile(), default, control) == []


def test_procfile_and_compose_run_the_same_processes() -> None:
    assert process_problems(load_compose(), load_procfile()) == []


def test_dockerfile_installs_the_requirements() -> None:
    assert dockerfile_problems((ROOT / "Dockerfile").read_text()) == []


def test_every_manage_py_command_in_the_deploy_files_exists() -> None:
    commands = manage_commands(load_compose(), load_procfile())
    # Guards against a pattern that silently stops matching.
    assert {"migrate", "ensure_admin", "consume_dlq", "demo", "check"} <= commands
    assert commands - set(get_commands()) == set()
