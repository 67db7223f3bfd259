"""`ensure_admin` creates the admin login once. For `make run` it always prints a password that works (kept in
var/); for docker compose (`--no-password-file`) it prints a generated password once and never resets it."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import authenticate
from django.contrib.auth.models import User
from django.core.management import call_command

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]


def ensure_admin() -> str:
    out = io.StringIO()
    call_command("ensure_admin", stdout=out)
    return out.getvalue()


@pytest.fixture
def var_dir(tmp_path: Path, settings: Any, monkeypatch: pytest.MonkeyPatch) -> Path:
    settings.VAR_DIR = tmp_path
    monkeypatch.delenv("DLQ_ADMIN_PASSWORD", raising=False)
    return tmp_path


def test_a_new_admin_gets_a_generated_password_that_is_printed_and_kept(var_dir: Path) -> None:
    printed = ensure_admin()

    password = (var_dir / "admin-password.txt").read_text().strip()
    assert f"password {password!r}" in printed
    assert authenticate(username="admin", password=password) is not None
    assert User.objects.get(username="admin").groups.filter(name="admin").exists()
    assert (var_dir / "admin-password.txt").stat().st_mode & 0o077 == 0


def test_a_chosen_password_replaces_the_remembered_one_for_later_runs(
    var_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ensure_admin()
    monkeypatch.setenv("DLQ_ADMIN_PASSWORD", "chosen-pw-123")
    ensure_admin()
    monkeypatch.delenv("DLQ_ADMIN_PASSWORD")

    printed = ensure_admin()

    assert "password 'chosen-pw-123'" in printed
    assert (var_dir / "admin-password.txt").read_text().strip() == "chosen-pw-123"
    assert authenticate(username="admin", password="chosen-pw-123") is not None
    assert User.objects.filter(username="admin").count() == 1


def ensure_admin_without_file() -> str:
    out = io.StringIO()
    call_command("ensure_admin", "--no-password-file", stdout=out)
    return out.getvalue()


def test_without_a_password_file_a_generated_password_is_printed_once_and_never_reset(
    var_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = ensure_admin_without_file()
    password = re.search(r"password '([^']+)'", first)
    assert password is not None, first
    # docker compose passes an unset DLQ_ADMIN_PASSWORD as an empty one: that is no password either.
    monkeypatch.setenv("DLQ_ADMIN_PASSWORD", "")

    second = ensure_admin_without_file()

    assert password[1] not in second and "unchanged" in second
    assert authenticate(username="admin", password=password[1]) is not None
    assert not (var_dir / "admin-password.txt").exists()


def test_without_a_password_file_an_explicit_password_still_sets_it_and_is_not_printed(
    var_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ensure_admin_without_file()
    monkeypatch.setenv("DLQ_ADMIN_PASSWORD", "chosen-pw-456")

    printed = ensure_admin_without_file()

    assert "chosen-pw-456" not in printed and "DLQ_ADMIN_PASSWORD" in printed
    assert authenticate(username="admin", password="chosen-pw-456") is not None
    assert not (var_dir / "admin-password.txt").exists()
