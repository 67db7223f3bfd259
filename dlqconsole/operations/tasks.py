"""Celery tasks: each takes primary keys (or nothing), checked as if a stranger sent them (core/taskargs.py), calls
one service and returns."""

from __future__ import annotations

import math

from dlqconsole.celery import app
from dlqconsole.core.taskargs import CheckedTask, row_id
from dlqconsole.operations import policies, retention, services, upkeep
from dlqconsole.operations.models import Operation


@app.task(name="operations.run_operation", base=CheckedTask, argument_checks={"operation_id": row_id(Operation)})
def run_operation_task(operation_id: int) -> None:
    def continue_later(seconds: float) -> None:
        # The canary's wait, or a circuit breaker's: come back when it is over instead of holding a worker process.
        run_operation_task.apply_async((operation_id,), countdown=max(1, math.ceil(seconds)))

    services.run_operation(operation_id=operation_id, continue_later=continue_later)


@app.task(name="operations.sweep_operations", base=CheckedTask)
def sweep_operations() -> None:
    upkeep.requeue_stale_operations()
    upkeep.recount_came_back()


@app.task(name="operations.schedule_new_dead_letters", base=CheckedTask)
def schedule_new_dead_letters() -> None:
    policies.schedule_new_dead_letters()


@app.task(name="operations.start_due_retries", base=CheckedTask)
def start_due_retries() -> None:
    policies.start_due_retries()


@app.task(name="operations.apply_retention", base=CheckedTask)
def apply_retention() -> None:
    retention.apply_retention()


# The name beat gave retention when it deleted only archives: a task queued under it by the previous version, during
# a deploy, runs the whole retention.
@app.task(name="operations.delete_expired_archives", base=CheckedTask)
def delete_expired_archives() -> None:
    retention.apply_retention()
