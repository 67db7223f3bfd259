from __future__ import annotations

import os
import secrets
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = (
        "Create the admin login if it does not exist. The password comes from DLQ_ADMIN_PASSWORD (also applied to an "
        "existing admin), or is generated; either is written to var/admin-password.txt. Prints how to sign in."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--username", default=os.environ.get("DLQ_ADMIN_USER", "admin"))

    def handle(self, *args: Any, username: str, **options: Any) -> None:
        user_model = get_user_model()
        password_file = settings.VAR_DIR / "admin-password.txt"
        user = user_model.objects.filter(username=username).first()
        if user is None:
            password = os.environ.get("DLQ_ADMIN_PASSWORD") or secrets.token_urlsafe(12)
            user = user_model.objects.create_superuser(username=username, email="", password=password)
            self._remember(password_file, password)
        elif os.environ.get("DLQ_ADMIN_PASSWORD"):
            password = os.environ["DLQ_ADMIN_PASSWORD"]
            user.set_password(password)
            user.save(update_fields=["password"])
            # The file is what the next run without DLQ_ADMIN_PASSWORD prints: it must not keep the old password.
            self._remember(password_file, password)
        else:
            password = (
                password_file.read_text().strip() if password_file.exists() else "(unchanged; see DLQ_ADMIN_PASSWORD)"
            )
        group, _ = Group.objects.get_or_create(name="admin")
        user.groups.add(group)
        self.stdout.write(f"Sign in as {username!r} with password {password!r} (also in {password_file}).")

    @staticmethod
    def _remember(password_file: Any, password: str) -> None:
        password_file.write_text(password + "\n")
        password_file.chmod(0o600)
