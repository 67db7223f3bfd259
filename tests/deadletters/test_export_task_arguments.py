"""The export tasks take their arguments from whoever can publish to the console's Celery vhost: hostile ones are
refused with one logged line, and nothing is written, inside the export folder or out of it."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from pytest_django import Settings

from dlqconsole.deadletters.tasks import delete_expired_exports_task, write_export_task
from tests.factories import many
from tests.support import NESTED, refusals

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]

HEX = "a" * 32


@pytest.fixture
def var_dir(tmp_path: Path, settings: Settings) -> Path:
    """The console's VAR_DIR one level below tmp_path, so a file written outside it shows up in tmp_path."""
    settings.VAR_DIR = tmp_path / "var"
    (tmp_path / "var" / "exports").mkdir(parents=True)
    return tmp_path / "var"


def files_under(root: Path) -> dict[str, bytes]:
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


def test_a_traversal_token_writes_nothing_outside_the_export_folder(
    tmp_path: Path, var_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_export_task(token="../../x", filter={}, export_format="csv")

    assert files_under(tmp_path) == {}
    assert refusals(caplog, "deadletters.write_export") == [
        "task deadletters.write_export refused its arguments, did nothing: token: '../../x' is not an export token"
    ]


def hostile_tokens(user_id: int) -> list[Any]:
    return [
        "../../x",
        "../../../tmp/x",
        f"{user_id}-{HEX}/../../../x",
        f"../{user_id}-{HEX}",
        f"{user_id}-{HEX}\n",
        # Digits that are not ASCII, which int() and a Unicode \d would still read as the user's id.
        f"{chr(0x0660 + user_id % 10)}-{HEX}",
        "1; DROP TABLE deadletters_deadletter",
        "",
        f"{user_id}-{'A' * 32}",
        f"{'9' * 5000}-{HEX}",
        f"999999999-{HEX}",  # no such user
        -1,
        2**70,
        True,
        None,
        NESTED,
        [f"{user_id}-{HEX}"],
    ]


def test_hostile_tokens_are_refused_and_write_nothing(
    viewer: User, tmp_path: Path, var_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    many(2)
    tokens = hostile_tokens(viewer.pk)

    for token in tokens:
        assert write_export_task(token=token, filter={}, export_format="csv") is None

    assert files_under(tmp_path) == {}
    found = refusals(caplog, "deadletters.write_export")
    assert len(found) == len(tokens)
    assert all(": token: " in line for line in found)
    assert "token: 999999999 is outside" not in " ".join(found)
    assert any("no User 999999999" in line for line in found)


@pytest.mark.parametrize(
    "export_format", ["txt", "../csv", "csv/../../x", "CSV", "", None, True, 1, ["csv"], NESTED, "1; DROP"]
)
def test_hostile_formats_are_refused_and_write_nothing(
    viewer: User, tmp_path: Path, var_dir: Path, caplog: pytest.LogCaptureFixture, export_format: Any
) -> None:
    many(2)
    token = f"{viewer.pk}-{HEX}"
    (var_dir / "exports" / f"{token}.csv.part").touch()

    assert write_export_task(token=token, filter={}, export_format=export_format) is None

    assert files_under(tmp_path) == {f"var/exports/{token}.csv.part": b""}
    (line,) = refusals(caplog, "deadletters.write_export")
    assert ": export_format: " in line


@pytest.mark.parametrize(
    "hostile",
    [
        "1; DROP",
        None,
        [],
        True,
        -1,
        NESTED,
        {"ids": [2**70]},
        {"ids": [-1]},
        {"ids": [True]},
        {"ids": [1.5]},
        {"ids": ["1; DROP"]},
        {"pattern": [0]},
        {"queue": NESTED},
        {"queue": [NESTED]},
        {"queue": [["orders.dlq"]]},
        {"text": ["a", "b"]},
        {"text": 5},
        {"status": ["bogus"]},
        {"reason": ["1; DROP"]},
        {"since": "yesterday-ish"},
        {"priority": "1; DROP"},
        {"queue": ["nul\x00"]},
        {"unknown": "x"},
        {"__class__": "x"},
    ],
)
def test_hostile_filters_are_refused_and_write_nothing(
    viewer: User, tmp_path: Path, var_dir: Path, caplog: pytest.LogCaptureFixture, hostile: Any
) -> None:
    many(2)
    token = f"{viewer.pk}-{HEX}"
    (var_dir / "exports" / f"{token}.csv.part").touch()

    assert write_export_task(token=token, filter=hostile, export_format="csv") is None

    assert files_under(tmp_path) == {f"var/exports/{token}.csv.part": b""}
    (line,) = refusals(caplog, "deadletters.write_export")
    assert ": filter: " in line or "filter field" in line


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((), {"token": "TOKEN", "filter": {}, "export_format": "csv", "path": "/tmp/x"}),
        ((), {"token": "TOKEN", "filter": {}}),
        (("TOKEN", {}, "csv"), {}),
        ((), {}),
    ],
)
def test_unknown_missing_or_positional_arguments_are_refused(
    viewer: User,
    tmp_path: Path,
    var_dir: Path,
    caplog: pytest.LogCaptureFixture,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> None:
    token = f"{viewer.pk}-{HEX}"
    (var_dir / "exports" / f"{token}.csv.part").touch()
    args = tuple(token if value == "TOKEN" else value for value in args)
    kwargs = {name: token if value == "TOKEN" else value for name, value in kwargs.items()}

    assert write_export_task(*args, **kwargs) is None

    assert files_under(tmp_path) == {f"var/exports/{token}.csv.part": b""}
    assert len(refusals(caplog, "deadletters.write_export")) == 1


def test_a_token_with_no_export_waiting_writes_nothing(
    viewer: User, tmp_path: Path, var_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    many(2)
    # A well-formed token of an existing user, but start_export never made it: a forged message.
    write_export_task(token=f"{viewer.pk}-{HEX}", filter={}, export_format="csv")

    assert files_under(tmp_path) == {}
    assert "no csv export waits under this token" in caplog.text


def test_checked_arguments_still_write_the_export(
    viewer: User, tmp_path: Path, var_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    many(3, queue="orders")
    many(2, queue="billing")
    token = f"{viewer.pk}-{HEX}"
    (var_dir / "exports" / f"{token}.jsonl.part").touch()

    write_export_task(token=token, filter={"queue": "billing.dlq", "ids": []}, export_format="jsonl")

    written = files_under(tmp_path)
    assert list(written) == [f"var/exports/{token}.jsonl"]
    assert written[f"var/exports/{token}.jsonl"].count(b"\n") == 2
    assert refusals(caplog, "deadletters.write_export") == []


@pytest.mark.parametrize(("args", "kwargs"), [(("x",), {}), ((), {"retention_hours": 0}), ((NESTED,), {})])
def test_the_retention_task_takes_no_arguments(
    var_dir: Path, caplog: pytest.LogCaptureFixture, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    old = var_dir / "exports" / f"1-{HEX}.csv"
    old.write_text("id\n")
    long_ago = time.time() - 400 * 24 * 3600
    os.utime(old, (long_ago, long_ago))

    assert delete_expired_exports_task(*args, **kwargs) is None

    assert old.exists()
    assert len(refusals(caplog, "deadletters.delete_expired_exports")) == 1
    assert delete_expired_exports_task() == 1
    assert not old.exists()
