from __future__ import annotations

from typing import Any

from dlqconsole.celery import app
from dlqconsole.deadletters.exports import delete_expired_exports, write_export
from dlqconsole.ingest.services import prune_arrival_counts


@app.task(name="deadletters.write_export")
def write_export_task(*, token: str, filter: dict[str, Any], export_format: str) -> int:  # noqa: A002
    return write_export(token=token, filter=filter, export_format=export_format)


@app.task(name="deadletters.delete_expired_exports")
def delete_expired_exports_task() -> int:
    """The app's hourly retention (beat's deadletters-export-retention): old export files, and arrival counts
    past every chart's window. Returns how many export files went."""
    prune_arrival_counts()
    return delete_expired_exports()
