"""The deploy files agree with the Compose Specification and with the code: `docker compose up` cannot be run on the
development machines or in CI, so docker-compose.yml, the Procfile and the Dockerfile are checked here instead.

Each check is a function that returns the problems it finds, so that a broken copy of a file shows the message a
real mistake would."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

import jsonschema
import pika
import pytest
import requests
import yaml
from django.conf import settings
from django.core.management import get_commands

ROOT = Path(__file__).resolve().parent.parent
SCHEMA_PATH = Path(__file__).resolve().parent / "data" / "compose-spec.json"

INFRASTRUCTURE = ("postgres", "rabbitmq", "redis")
ONE_SHOT = ("rabbitmq-vhost", "migrate")
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
    expected = dict.fromkeys(INFRASTRUCTURE, "service_healthy") | dict.fromkeys(
        ONE_SHOT, "service_completed_successfully"
    )
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
    in_compose = set(compose["services"]) - {*INFRASTRUCTURE, *ONE_SHOT}
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
    elif not re.search(r"^RUN pip install .*--require-hashes", dockerfile, re.MULTILINE):
        problems.append("requirements.txt is installed without --require-hashes")
    # Django 6 needs Python 3.12 or newer, as pyproject.toml says.
    base = re.search(r"^FROM python:(\S+)", dockerfile, re.MULTILINE)
    tag = base[1] if base else ""
    version = re.match(r"(\d+)\.(\d+)", tag)
    if not version or (int(version[1]), int(version[2])) < (3, 12):
        problems.append("the base image is not Python 3.12 or newer")
    elif not EXACT_TAG["python"].fullmatch(tag):
        problems.append(f"the base image python:{tag} is no exact release")
    users = re.findall(r"^USER\s+(\S+)", dockerfile, re.MULTILINE)
    if not users or users[-1].split(":")[0] in {"root", "0"}:
        problems.append("the containers run as root (no USER, or USER root, at the end of the Dockerfile)")
    return problems


# An exact release in a tag, not one that moves with new releases (`16`, `7`, `3.13-management`, `latest`):
# PostgreSQL numbers its releases major.minor, the others major.minor.patch. A variant may follow.
EXACT_TAG = {
    "postgres": re.compile(r"\d+\.\d+-[a-z0-9.-]+|\d+\.\d+"),
    "python": re.compile(r"\d+\.\d+\.\d+-[a-z0-9.-]+|\d+\.\d+\.\d+"),
    "rabbitmq": re.compile(r"\d+\.\d+\.\d+-[a-z0-9.-]+|\d+\.\d+\.\d+"),
    "redis": re.compile(r"\d+\.\d+\.\d+-[a-z0-9.-]+|\d+\.\d+\.\d+"),
}


def image_problems(compose: dict[str, Any]) -> list[str]:
    problems = []
    for name, service in compose["services"].items():
        image = service.get("image")
        if image is None:
            continue
        repository, _, tag = image.partition(":")
        pattern = EXACT_TAG.get(repository)
        if pattern is None or not pattern.fullmatch(tag):
            problems.append(f"{name} runs {image}, not an exact release")
    return problems


def secret_problems(compose_text: str, compose: dict[str, Any]) -> list[str]:
    """SECRET_KEY must be given (no public default), and the admin password must not have one either."""
    problems = []
    for name in (*APP_SERVICES, "migrate"):
        environment = compose["services"].get(name, {}).get("environment", {})
        if not re.fullmatch(r"\$\{SECRET_KEY:\?[^}]+\}", str(environment.get("SECRET_KEY", ""))):
            problems.append(
                f"{name}: SECRET_KEY is not required (${{SECRET_KEY:?...}}): {environment.get('SECRET_KEY')}"
            )
        if environment.get("DLQ_ADMIN_PASSWORD", "${DLQ_ADMIN_PASSWORD:-}") != "${DLQ_ADMIN_PASSWORD:-}":
            problems.append(f"{name}: DLQ_ADMIN_PASSWORD has a default: {environment['DLQ_ADMIN_PASSWORD']}")
    for public in ("change-me", "admin-change-me"):
        if public in compose_text:
            problems.append(f"docker-compose.yml still holds the public {public!r}")
    if "--no-password-file" not in compose["services"]["migrate"].get("command", ""):
        problems.append("migrate keeps or prints the admin password again (ensure_admin without --no-password-file)")
    return problems


def port_problems(compose: dict[str, Any]) -> list[str]:
    return [
        f"{name} publishes RabbitMQ's management port ({port})"
        for name, service in compose["services"].items()
        for port in service.get("ports", [])
        if "15672" in str(port)
    ]


def amqp_vhost(url: str) -> str:
    return urllib.parse.unquote(urllib.parse.urlsplit(url).path[1:])


def vhost_command(compose: dict[str, Any]) -> str:
    command = compose["services"].get("rabbitmq-vhost", {}).get("command", [])
    return command[-1] if isinstance(command, list) else str(command)


def vhost_problems(compose: dict[str, Any]) -> list[str]:
    """The console's Celery on a vhost of its own, which a one-shot service creates (and lets its user use) before
    the app starts, with the rabbitmqadmin of the broker's own management image."""
    services = compose["services"]
    problems = []
    for name in APP_SERVICES:
        environment = services.get(name, {}).get("environment", {})
        celery_url, amqp_url = environment.get("CELERY_BROKER_URL", ""), environment.get("AMQP_URL", "")
        if amqp_vhost(celery_url) != "dlqconsole" or amqp_vhost(amqp_url) == "dlqconsole":
            problems.append(f"{name}: Celery on {celery_url or 'AMQP_URL'}, not on the vhost dlqconsole")
    setup = services.get("rabbitmq-vhost")
    if setup is None:
        return [*problems, "no rabbitmq-vhost service creates the vhost"]
    if setup.get("image") != services["rabbitmq"]["image"] or not setup.get("image", "").endswith("-management"):
        problems.append(f"rabbitmq-vhost runs {setup.get('image')}, not the broker's management image")
    command = " ".join(vhost_command(compose).split())
    user = urllib.parse.urlsplit(services["web"]["environment"]["CELERY_BROKER_URL"]).username
    for needed in ("declare vhost name=dlqconsole", f"declare permission vhost=dlqconsole user={user} "):
        if needed not in command:
            problems.append(f"rabbitmq-vhost does not {needed.strip()}")
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
    image = "    image: redis:7.4.11-bookworm\n"
    broken.write_text(text.replace(image, image + "    restart_policy: always\n"))
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


def test_compose_pins_every_image_to_an_exact_release() -> None:
    assert image_problems(load_compose()) == []


def test_a_moving_image_tag_would_be_found() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    moving = text.replace("image: redis:7.4.11-bookworm", "image: redis:7").replace(
        "image: postgres:16.15-bookworm", "image: postgres:16"
    )

    assert image_problems(yaml.safe_load(moving)) == [
        "postgres runs postgres:16, not an exact release",
        "redis runs redis:7, not an exact release",
    ]


def test_compose_requires_a_secret_key_and_gives_the_admin_password_no_default() -> None:
    text = (ROOT / "docker-compose.yml").read_text()

    assert secret_problems(text, load_compose()) == []


def test_a_public_key_or_admin_password_in_compose_would_be_found() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    key = re.search(r"\$\{SECRET_KEY:\?[^}]+\}", text)
    assert key is not None
    public = (
        text.replace(key[0], "${SECRET_KEY:-change-me-in-production-please-0123456789abcdef}")
        .replace("${DLQ_ADMIN_PASSWORD:-}", "${DLQ_ADMIN_PASSWORD:-admin-change-me}")
        .replace("ensure_admin --no-password-file", "ensure_admin")
    )

    problems = secret_problems(public, yaml.safe_load(public))

    placeholder = "${SECRET_KEY:-change-me-in-production-please-0123456789abcdef}"
    assert f"web: SECRET_KEY is not required (${{SECRET_KEY:?...}}): {placeholder}" in problems
    assert "migrate: DLQ_ADMIN_PASSWORD has a default: ${DLQ_ADMIN_PASSWORD:-admin-change-me}" in problems
    assert "docker-compose.yml still holds the public 'admin-change-me'" in problems
    assert "migrate keeps or prints the admin password again (ensure_admin without --no-password-file)" in problems


def test_rabbitmq_management_port_is_not_published_unless_its_line_is_uncommented() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    opened = text.replace('    # ports: ["127.0.0.1:15672:15672"]', '    ports: ["127.0.0.1:15672:15672"]')

    assert port_problems(load_compose()) == []
    assert port_problems(yaml.safe_load(opened)) == [
        "rabbitmq publishes RabbitMQ's management port (127.0.0.1:15672:15672)"
    ]


def test_the_console_celery_runs_on_a_vhost_of_its_own_created_before_the_app_starts() -> None:
    compose = load_compose()

    assert vhost_problems(compose) == []
    # ... and every app service waits for it (health_problems checks the conditions).
    assert health_problems(compose) == []


def test_celery_on_the_users_vhost_or_no_vhost_service_would_be_found() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    shared = text.replace("rabbitmq:5672/dlqconsole", "rabbitmq:5672/%2F")
    compose = yaml.safe_load(text)
    del compose["services"]["rabbitmq-vhost"]

    assert vhost_problems(yaml.safe_load(shared))[0] == (
        "web: Celery on amqp://guest:guest@rabbitmq:5672/%2F, not on the vhost dlqconsole"
    )
    assert vhost_problems(compose)[-1] == "no rabbitmq-vhost service creates the vhost"


def test_the_vhost_service_command_makes_a_vhost_its_user_can_use() -> None:
    """The command of rabbitmq-vhost as compose runs it, against this machine's broker and a vhost of the test's
    own: the rabbitmqadmin of RabbitMQ 3.x (the Debian package has the one the 3.13 management image has)."""
    if shutil.which("rabbitmqadmin") is None:
        assert os.environ.get("CI") != "true", "rabbitmqadmin (Debian package rabbitmq-server) is missing"
        pytest.skip("rabbitmqadmin is not installed (it comes with the Debian package rabbitmq-server)")
    broker = urllib.parse.urlsplit(settings.AMQP_URL)
    vhost = f"dlqconsole-test-{uuid.uuid4().hex[:12]}"
    command = vhost_command(load_compose())
    local = command.replace("--host=rabbitmq", f"--host={broker.hostname}").replace("dlqconsole", vhost)
    api = f"http://{broker.hostname}:15672/api"
    auth = (broker.username or "guest", broker.password or "guest")
    try:
        runs = [subprocess.run(["sh", "-c", local], capture_output=True, text=True, timeout=60) for _ in range(2)]
        permissions = requests.get(f"{api}/permissions/{vhost}/guest", auth=auth, timeout=10)
        with pika.BlockingConnection(pika.URLParameters(f"amqp://{auth[0]}:{auth[1]}@{broker.hostname}/{vhost}")) as c:
            declared = c.channel().queue_declare("", exclusive=True).method.queue
    finally:
        requests.delete(f"{api}/vhosts/{vhost}", auth=auth, timeout=10)

    assert local != command and f"vhost={vhost}" in local
    # A second start of the stack runs it again: it must succeed and change nothing.
    assert [run.returncode for run in runs] == [0, 0], [run.stderr for run in runs]
    assert permissions.status_code == 200
    assert {key: permissions.json()[key] for key in ("configure", "write", "read")} == dict.fromkeys(
        ("configure", "write", "read"), ".*"
    )
    assert declared.startswith("amq.gen-")


def test_the_image_runs_as_a_user_of_its_own_and_env_files_stay_out_of_it() -> None:
    ignored = (ROOT / ".dockerignore").read_text().splitlines()

    assert dockerfile_problems((ROOT / "Dockerfile").read_text()) == []
    assert ".env" in ignored and ".env.*" in ignored


def test_a_dockerfile_as_root_without_hashes_or_on_a_moving_python_would_be_found() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    loose = (
        re.sub(r"^USER .*$", "", dockerfile, flags=re.MULTILINE)
        .replace(" --require-hashes", "")
        .replace("FROM python:3.12.14-slim-bookworm", "FROM python:3.12-slim")
    )

    assert dockerfile_problems(loose) == [
        "requirements.txt is installed without --require-hashes",
        "the base image python:3.12-slim is no exact release",
        "the containers run as root (no USER, or USER root, at the end of the Dockerfile)",
    ]
