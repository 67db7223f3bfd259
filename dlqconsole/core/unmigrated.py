"""One line instead of a traceback when a command meets a database that was never migrated, or misses migrations:
manage.py asks here when a command ends in a database error (`no such table`, `relation ... does not exist`)."""

from __future__ import annotations

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.migrations.executor import MigrationExecutor


def unmigrated_database_message() -> str | None:
    """What to run, when the database misses migrations; None when it has them all, or cannot be asked (it is
    down, say): the command's own error then stands."""
    connection = connections[DEFAULT_DB_ALIAS]
    try:
        # A fresh connection: the failed command may have left its own in a failed transaction.
        connection.close()
        executor = MigrationExecutor(connection)
        unapplied = executor.migration_plan(executor.loader.graph.leaf_nodes())
    except Exception:
        return None
    if not unapplied:
        return None
    database = connection.settings_dict
    where = database["NAME"] if connection.vendor == "sqlite" else f"{database['NAME']} on {database['HOST']}"
    count = f"{len(unapplied)} migration{'' if len(unapplied) == 1 else 's'} not applied"
    return (
        f"The database {where} is not migrated ({count}): run `python manage.py migrate`, or `make run`, "
        "which migrates it first."
    )
