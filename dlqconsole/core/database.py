"""Bulk writes on Django's connection that the ORM makes slow: ingest's COPY and the counters' upserts."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from django.db import connection

# Rows in one multi-row statement on databases without unnest (SQLite).
ROWS_PER_STATEMENT = 200


@contextmanager
def binding_cursor() -> Iterator[psycopg.Cursor[Any]]:
    """A psycopg cursor on Django's connection (and transaction) that sends parameters apart from the SQL.
    Django's cursors write them into the statement as literals, which for a 500-key array costs about 4 µs
    per key in Python; here the driver sends them as they are."""
    connection.ensure_connection()
    with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cursor:
        yield cursor
