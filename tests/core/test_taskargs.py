"""Every Celery task of the console checks its arguments before it runs, and a task that forgets to name a check
for a parameter fails where it is defined, not when a stranger's message arrives."""

from __future__ import annotations

import pytest

from dlqconsole.celery import app
from dlqconsole.core.taskargs import CheckedTask, one_of


def test_every_task_of_the_console_checks_its_arguments() -> None:
    app.loader.import_default_modules()
    console = {name: task for name, task in app.tasks.items() if not name.startswith("celery.")}

    # The console's own tasks are all there (the demo's belong to the demo's Celery app).
    assert {
        "deadletters.write_export",
        "deadletters.delete_expired_exports",
        "deadletters.prune_arrival_counts",
        "operations.run_operation",
        "operations.sweep_operations",
        "operations.schedule_new_dead_letters",
        "operations.start_due_retries",
        "operations.delete_expired_archives",
        "alerts.evaluate_alerts",
        "alerts.send_notification",
        "alerts.retry_notifications",
        "alerts.sample_queues",
        "alerts.prune_notifications",
        "accounts.prune_audit",
    } <= set(console)
    assert [name for name, task in console.items() if not isinstance(task, CheckedTask)] == []


def test_a_parameter_without_a_check_fails_where_the_task_is_defined() -> None:
    def probe(token: str, export_format: str) -> None:
        raise AssertionError("never run")

    with pytest.raises(TypeError, match=r"parameters \['export_format', 'token'\] but argument_checks for \['token'\]"):
        type(
            "probe",
            (CheckedTask,),
            {"name": "tests.probe", "run": staticmethod(probe), "argument_checks": {"token": str}},
        )


def test_a_task_taking_any_arguments_fails_where_it_is_defined() -> None:
    def probe(**options: object) -> None:
        raise AssertionError("never run")

    with pytest.raises(TypeError, match=r"\*options cannot be checked"):
        type("probe", (CheckedTask,), {"name": "tests.probe", "run": staticmethod(probe)})


def test_a_refused_call_logs_one_line_and_never_runs_the_task(caplog: pytest.LogCaptureFixture) -> None:
    ran: list[str] = []

    def probe(export_format: str) -> str:
        ran.append(export_format)
        return export_format

    task_class: type[CheckedTask] = type(
        "probe",
        (CheckedTask,),
        {"name": "tests.probe", "run": staticmethod(probe), "argument_checks": {"export_format": one_of({"csv"})}},
    )
    task_class.bind(app)  # bound to the console's app without being registered in it
    task = task_class()

    assert task("csv") == "csv"
    assert task(export_format="../x") is None
    assert task("csv", "jsonl") is None
    assert task(export_format="csv", extra=1) is None

    assert ran == ["csv"]
    lines = [record for record in caplog.records if record.name == "dlqconsole.core.taskargs"]
    assert [record.getMessage() for record in lines] == [
        "task tests.probe refused its arguments, did nothing: export_format: '../x' is not one of csv",
        "task tests.probe refused its arguments, did nothing: too many positional arguments",
        "task tests.probe refused its arguments, did nothing: got an unexpected keyword argument 'extra'",
    ]
    assert all(record.levelname == "ERROR" and record.exc_info is None for record in lines)
