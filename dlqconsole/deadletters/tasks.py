"""Celery tasks of the deadletters app; their arguments are checked as if a stranger sent them
(core/taskargs.py)."""

from __future__ import annotations

from typing import Any

from dlqconsole.celery import app
from dlqconsole.core.taskargs import CheckedTask, one_of
from dlqconsole.deadletters import exports
from dlqconsole.deadletters.counters import prune_arrival_counts
from dlqconsole.deadletters.search_fill import fill_search_text


@app.task(
    name="deadletters.write_export",
    base=CheckedTask,
    argument_checks={
        "token": exports.token_argument,
        "filter": exports.filter_argument,
        "export_format": one_of(exports.FORMATS),
    },
)
def write_export_task(*, token: str, filter: dict[str, Any], export_format: str) -> None:  # noqa: A002
    def continue_later(seconds: float) -> None:
        # Every export slot is busy: come back later with the same (checked) arguments instead of holding a worker
        # process that operations need.
        write_export_task.apply_async(
            kwargs={"token": token, "filter": filter, "export_format": export_format}, countdown=seconds
        )

    exports.write_export(token=token, filter=filter, export_format=export_format, continue_later=continue_later)


@app.task(name="deadletters.delete_expired_exports", base=CheckedTask)
def delete_expired_exports_task() -> int:
    """The hourly retention of export files (beat's deadletters-export-retention). Returns how many went."""
    return exports.delete_expired_exports()


@app.task(name="deadletters.prune_arrival_counts", base=CheckedTask)
def prune_arrival_counts_task() -> int:
    """The hourly retention of arrival counts past every chart's window (beat's deadletters-arrival-retention).
    Returns how many rows went."""
    return prune_arrival_counts()


@app.task(name="deadletters.fill_search_text", base=CheckedTask)
def fill_search_text_task() -> int:
    """Fills in search_text for a bounded number of dead letters stored before it existed (beat's
    deadletters-search-fill, every minute). Returns how many; 0 once none is left, which costs one index probe."""
    return fill_search_text()
