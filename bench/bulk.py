"""Filling a benchmark's world fast: a table's secondary indexes dropped for a bulk insert and built again after it
(one sort each instead of keeping each up to date row by row), and its foreign-key checks skipped (the benchmark's
rows name rows that exist). Only for the benchmarks' own databases."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def bulk_loading(table: str) -> Iterator[None]:
    """Inside: `table` has only the indexes of its constraints (primary key, unique), and no trigger runs."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s "
            "AND indexname NOT IN (SELECT conname FROM pg_constraint)",
            [table],
        )
        indexes: list[Any] = cursor.fetchall()
        for name, _ in indexes:
            cursor.execute(f'DROP INDEX "{name}"')
        cursor.execute("SET session_replication_role = replica")
    started = time.perf_counter()
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET session_replication_role = DEFAULT")
            if table == "deadletters_deadletter":
                # The triggers that keep each hour's id range did not run.
                from dlqconsole.deadletters.time_bounds import fold_all

                fold_all()
            print(f"world: filled {table} in {time.perf_counter() - started:.0f} s", flush=True)
            started = time.perf_counter()
            cursor.execute("SET maintenance_work_mem = '1GB'")
            for _, definition in indexes:
                cursor.execute(definition)
            cursor.execute("RESET maintenance_work_mem")
            print(
                f"world: built {len(indexes)} indexes of {table} in {time.perf_counter() - started:.0f} s", flush=True
            )
