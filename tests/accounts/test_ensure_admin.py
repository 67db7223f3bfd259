"""`ensure_admin` (run by `make run`) creates the admin login once and always prints a password that works."""

from __future__ import annotations

import io
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
