from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.deadletters.models import DeadLetter
from dlqconsole.operations.models import Operation, OperationStatus
from tests.factories import EnvelopeFactory, store, synthetic_dead_letters
from tests.support import declare_with_dlq, wait_for_depth

pytestmark = pytest.mark.django_db


def dlq(*args: str) -> str:
    out = StringIO()
    call_command("dlq", *args, stdout=out)
    return out.getvalue()


@pytest.mark.sqlite
def test_dry_run_prints_the_plan_and_changes_nothing():
    synthetic_dead_letters(queue="orders", count=3)

    output = dlq("archive", "--queue", "orders.dlq", "--reason", "timeout", "--dry-run")

    assert "Plan (dry run): archive 3 dead letters" in output and "Operation #" not in output
    assert "filter: queue=['orders.dlq'], reason=['TIMEOUT']" in output
    assert "by queue: orders.dlq 3" in output
    assert "Dry run: nothing was changed." in output
    assert not Operation.objects.exists()
    assert not AuditEntry.objects.exists()
    assert set(DeadLetter.objects.values_list("status", flat=True)) == {"parked"}


@pytest.mark.sqlite
def test_archive_with_yes_and_inline_runs_here_and_draws_the_progress_bar():
    ids = synthetic_dead_letters(queue="orders", count=4)

    output = dlq("archive", "--id", f"{ids[0]},{ids[1]}", "--id", str(ids[2]), "--yes", "--inline")

    assert "[##############################] 100% 3/3 ok 3 failed 0 skipped 0 done" in output
    assert list(DeadLetter.objects.order_by("pk").values_list("status", flat=True)) == ["archived"] * 3 + ["parked"]


@pytest.mark.sqlite
def test_purge_asks_for_the_count_typed_out(monkeypatch):
    synthetic_dead_letters(queue="orders", count=2)
    monkeypatch.setattr("builtins.input", lambda prompt: "yes")

    refused = dlq("purge", "--queue", "orders.dlq", "--inline")

    assert "Cancelled operation" in refused
    assert DeadLetter.objects.count() == 2
    assert Operation.objects.get().status == OperationStatus.CANCELLED
    monkeypatch.setattr("builtins.input", lambda prompt: "purge 2")

    dlq("purge", "--queue", "orders.dlq", "--inline")

    assert not DeadLetter.objects.exists()


@pytest.mark.sqlite
def test_no_answer_to_the_question_cancels_the_plan_without_a_traceback(monkeypatch):
    """Input closed (`< /dev/null`, a pipe, a cron job without --yes): the plan is cancelled, nothing is done."""
    synthetic_dead_letters(queue="orders", count=2)

    def closed(prompt: str) -> str:
        raise EOFError

    monkeypatch.setattr("builtins.input", closed)

    output = dlq("purge", "--queue", "orders.dlq", "--inline")

    assert "No answer (give --yes to run without asking)." in output
    assert "Cancelled operation" in output
    assert DeadLetter.objects.count() == 2
    assert Operation.objects.get().status == OperationStatus.CANCELLED


def test_retry_hands_the_operation_to_a_worker(channel, queue_name, django_capture_on_commit_callbacks):
    orders = queue_name("orders")
    declare_with_dlq(channel, orders)
    synthetic_dead_letters(queue=orders, count=2)

    with django_capture_on_commit_callbacks() as callbacks:
        output = dlq("retry", "--queue", orders, "--rate", "50/1s", "--canary", "1", "--yes")

    operation = Operation.objects.get()
    assert f"Started operation #{operation.pk}." in output
    assert "rate 50/1s; canary 1, then wait 60s" in output
    assert f"by destination: queue {orders} 2" in output
    assert (operation.status, operation.rate, operation.canary_size, len(callbacks)) == ("canary", "50/1s", 1, 1)
    assert wait_for_depth(channel, orders, 1, timeout=0.5) == 0  # nothing published until a worker runs it


@pytest.mark.sqlite
def test_filters_by_correlation_id_and_app_version():
    """The filters the messages page has: correlation ids (repeatable, comma-separated) and the app version."""
    first, second, third = store(
        EnvelopeFactory.build(version="1.4.2"),
        EnvelopeFactory.build(version="2.0.0"),
        EnvelopeFactory.build(version="2.0.0"),
    )
    DeadLetter.objects.filter(pk=first.pk).update(correlation_id="order-7")
    DeadLetter.objects.filter(pk=second.pk).update(correlation_id="order-8")
    DeadLetter.objects.filter(pk=third.pk).update(correlation_id="order-9")

    by_correlation = dlq("archive", "--correlation-id", "order-7,order-8", "--correlation-id", "nope", "--dry-run")
    by_version = dlq("archive", "--app-version", "2.0.0", "--dry-run")
    both = dlq("archive", "--app-version", "2.0.0", "--correlation-id", "order-9", "--dry-run")

    assert "archive 2 dead letters" in by_correlation
    assert "correlation_id=['order-7', 'order-8', 'nope']" in by_correlation
    assert "archive 2 dead letters" in by_version and "version=2.0.0" in by_version
    assert "archive 1 dead letters" in both


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["retry", "--reason", "NOPE", "--yes"], "unknown reason 'NOPE'"),
        (["retry", "--rate", "fast", "--yes"], "has no '/'"),
        (["move", "--yes"], "needs a target queue"),
        (["archive", "--since", "yesterday", "--yes"], "since must be an ISO date/time"),
        (["archive", "--correlation-id", "a\x00b", "--yes"], "correlation_id cannot hold a NUL"),
        (["operation", "pause", "999"], "no operation #999"),
    ],
)
def test_bad_input_is_a_clear_command_error(args, message):
    with pytest.raises(CommandError, match=message):
        dlq(*args)


@pytest.mark.sqlite
def test_operation_subcommands_control_a_running_operation():
    synthetic_dead_letters(queue="orders", count=2)
    dlq("retry", "--queue", "orders.dlq", "--yes")
    operation = Operation.objects.get()

    paused = dlq("operation", "pause", str(operation.pk))
    changed = dlq("operation", "rate", str(operation.pk), "5/1s")
    cancelled = dlq("operation", "cancel", str(operation.pk))

    assert "paused" in paused
    assert "rate 5/1s" in changed
    operation.refresh_from_db()
    assert (operation.status, operation.rate, operation.skipped) == ("cancelled", "5/1s", 2)
    assert "cancelled" in cancelled
