#!/usr/bin/env python
from __future__ import annotations

import os
import sys

if __name__ == "__main__":
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
