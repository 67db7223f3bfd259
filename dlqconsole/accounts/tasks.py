"""Celery tasks of the accounts app: thin wrappers that call services."""

from __future__ import annotations

from dlqconsole.accounts import services
from dlqconsole.celery import app
from dlqconsole.core.taskargs import CheckedTask


@app.task(name="accounts.prune_audit", ignore_result=True, base=CheckedTask)
def prune_audit() -> None:
    """Hourly retention: audit rows older than DLQ_AUDIT_RETENTION_DAYS."""
    services.delete_expired_audit_entries()
