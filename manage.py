#!/usr/bin/env python
from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path


def read_make_run_settings() -> None:
    """Take the settings of the last `make run` for every variable the shell does not set, so that a command run
    from the checkout in a plain shell (`python manage.py dlq operation show 3`) uses the database and settings the
    console runs with. scripts/run writes them to make-run.env in DLQ_VAR_DIR (var/ unless the shell sets it);
    scripts/test sets DLQ_VAR_DIR to var/test, so the tests never read a developer's."""
    var_dir = os.environ.get("DLQ_VAR_DIR") or Path(__file__).resolve().parent / "var"
    try:
        text = (Path(var_dir) / "make-run.env").read_text(encoding="utf-8")
    except FileNotFoundError:
        return
    for assignment in shlex.split(text, comments=True):
        name, _, value = assignment.partition("=")
        os.environ.setdefault(name, value)


if __name__ == "__main__":
    read_make_run_settings()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dlqconsole.settings")
    from django.core.management import execute_from_command_line
    from django.db import DatabaseError

    try:
        execute_from_command_line(sys.argv)
    except DatabaseError:
        # A database that was never migrated gets one line saying what to run, for every command that reads it;
        # migrate's own errors stay as they are.
        from dlqconsole.core.unmigrated import unmigrated_database_message

        message = None if sys.argv[1:2] == ["migrate"] else unmigrated_database_message()
        if message is None:
            raise
        sys.exit(message)
