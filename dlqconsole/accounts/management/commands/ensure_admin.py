from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = (
        "Create the admin login if it does not exist, with DLQ_ADMIN_PASSWORD or a generated password; an existing "
        "admin's password changes only when DLQ_ADMIN_PASSWORD is set. The password is written to "
        "var/admin-password.txt and printed on every run, or with --no-password-file printed once, when generated."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--username", default=os.environ.get("DLQ_ADMIN_USER", "admin"))
        parser.add_argument(
            "--no-password-file",
            action="store_true",
            help="Keep the password nowhere: print a generated one once, and later runs say it is unchanged "
            "(docker compose, whose migrate service runs this at every start).",
        )

    def handle(self, *args: Any, username: str, no_password_file: bool, **options: Any) -> None:
        user_model = get_user_model()
        password_file = None if no_password_file else settings.VAR_DIR / "admin-password.txt"
        # Empty counts as unset: docker compose passes an unset variable on as an empty one.
        chosen = os.environ.get("DLQ_ADMIN_PASSWORD", "")
        user = user_model.objects.filter(username=username).first()
        if user is None:
            password = chosen or secrets.token_urlsafe(12)
            user = user_model.objects.create_superuser(username=username, email="", password=password)
        elif chosen:
            password = chosen
            user.set_password(password)
            user.save(update_fields=["password"])
        else:
            password = ""
        group, _ = Group.objects.get_or_create(name="admin")
        user.groups.add(group)

        if password_file is not None:
            if password:
                # The file is what the next run without DLQ_ADMIN_PASSWORD prints: it must not keep an old password.
                self._remember(password_file, password)
            password = (
                password
                or (password_file.read_text().strip() if password_file.exists() else "")
                or "(unchanged; see DLQ_ADMIN_PASSWORD)"
            )
            self.stdout.write(f"Sign in as {username!r} with password {password!r} (also in {password_file}).")
        elif chosen:
            self.stdout.write(f"Sign in as {username!r} with the password in DLQ_ADMIN_PASSWORD.")
        elif password:
            self.stdout.write(f"Sign in as {username!r} with password {password!r} (printed this once).")
        else:
            self.stdout.write(f"The admin {username!r} exists; its password is unchanged (DLQ_ADMIN_PASSWORD sets it).")

    @staticmethod
    def _remember(password_file: Path, password: str) -> None:
        password_file.write_text(password + "\n")
        password_file.chmod(0o600)
