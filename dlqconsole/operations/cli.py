"""`dlq retry|move|purge|archive|restore`, `dlq shed` and `dlq operation show|pause|resume|cancel|rate`.

Each handler parses its options, calls one service and prints what happened. Without --yes the plan is shown and
confirmed first; --dry-run shows the plan and changes nothing; --wait follows the worker with a progress bar;
--inline runs the operation in this process instead of a Celery worker.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import PermissionDenied
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from django.utils import timezone

from dlqconsole.core.durations import parse_duration
from dlqconsole.deadletters.filters import DeadLetterFilter, FilterError
from dlqconsole.operations.models import FINISHED_STATUSES, Operation, OperationKind
from dlqconsole.operations.planning import plan_operation
from dlqconsole.operations.services import (
    OperationError,
    cancel_operation,
    change_rate,
    pause_operation,
    resume_operation,
    run_operation,
    start_operation,
)
from dlqconsole.operations.shed import describe_shed, plan_shed, whole_number

# (option, filter field, help); list fields take several values, repeated or comma-separated.
LIST_FILTERS = (
    ("--pattern", "pattern", "failure pattern id"),
    ("--broker", "broker", "broker name (DLQ_BROKERS, the admin; default is AMQP_URL)"),
    ("--queue", "queue", "dead-letter queue or original queue"),
    ("--reason", "reason", "failure reason, e.g. TIMEOUT"),
    ("--status", "status", "dead-letter status, e.g. parked, failed, archived"),
    ("--message-id", "message_id", "message id"),
    ("--correlation-id", "correlation_id", "correlation id"),
    ("--id", "ids", "dead letter id"),
)
TEXT_FILTERS = (
    ("--error-type", "error_type", "exact error type"),
    ("--since", "since", "arrived at or after: ISO date/time or an age like 2h, 7d"),
    ("--until", "until", "arrived before: ISO date/time or an age"),
    ("--priority", "priority", "priority or a range like 5-9"),
    ("--text", "text", "text in the error type, message or body head (any case, 3 characters or more)"),
    ("--host", "host", "processing host"),
    # Not --version: Django's commands own it.
    ("--app-version", "version", "application version (exact)"),
    ("--payload", "payload", "text in the body"),
)
VERBS = {
    OperationKind.RETRY: "Retry (republish to the original queues)",
    OperationKind.MOVE: "Move to another queue or exchange",
    OperationKind.PURGE: "Purge: delete for good (needs --yes or a typed confirmation)",
    OperationKind.ARCHIVE: "Archive: hide from default views (restorable)",
    OperationKind.RESTORE: "Restore archived dead letters",
}


def add_subcommands(subcommands: Any, *, command: BaseCommand) -> None:
    for kind, help_text in VERBS.items():
        parser = subcommands.add_parser(str(kind), help=help_text)
        for option, _, text in LIST_FILTERS:
            parser.add_argument(option, action="append", default=[], metavar="VALUE", help=f"{text} (repeatable)")
        for option, _, text in TEXT_FILTERS:
            # None when left out, so that one given blank can be told apart (filter_from_options).
            parser.add_argument(option, default=None, help=text)
        parser.add_argument("--limit", type=int, default=None, help="at most this many dead letters (oldest first)")
        if kind in (OperationKind.RETRY, OperationKind.MOVE):
            parser.add_argument("--rate", default="", help="N/period[:burst], e.g. 50/1s; default: no limit")
            parser.add_argument("--canary", type=int, default=0, metavar="N", help="replay N first, then wait")
            parser.add_argument("--canary-wait", type=int, default=None, metavar="SECONDS")
        if kind == OperationKind.MOVE:
            parser.add_argument("--target-queue", default="")
            parser.add_argument("--target-exchange", default="")
            parser.add_argument("--routing-key", default="")
            parser.add_argument(
                "--target-broker",
                default="",
                metavar="NAME",
                help="the broker to move to (DLQ_BROKERS, the admin); default: each dead letter's own broker",
            )
        parser.add_argument("--dry-run", action="store_true", help="show the plan; change nothing")
        parser.add_argument("--yes", action="store_true", help="do not ask for confirmation")
        parser.add_argument("--wait", action="store_true", help="follow the operation with a progress bar")
        parser.add_argument("--inline", action="store_true", help="run it in this process, not a Celery worker")
        parser.add_argument("--user", default="", help="the account to act as (for roles and the audit log)")
        parser.set_defaults(handler=run_kind, kind=str(kind))

    add_shed(subcommands)

    operation = subcommands.add_parser("operation", help="Show or control an operation.")
    operation.add_argument("action", choices=["show", "pause", "resume", "cancel", "rate"])
    operation.add_argument("operation_id", type=int)
    operation.add_argument("rate", nargs="?", default="", help="the new rate (for `rate`); empty for no limit")
    operation.add_argument("--wait", action="store_true")
    operation.add_argument("--user", default="")
    operation.set_defaults(handler=run_control)


def add_shed(subcommands: Any) -> None:
    parser = subcommands.add_parser(
        "shed",
        help="Shed: take the low-priority messages out of a flooded work queue into archived dead letters",
        description="Consume QUEUE once, keeping the messages of priority below N (and older than D) as archived "
        "dead letters (reason SHED) and giving the others back. Classic queues only. Restore and retry put them back.",
    )
    parser.add_argument("queue", help="the work queue to shed")
    parser.add_argument("--priority-below", type=_whole, required=True, metavar="N", help="shed priorities below N")
    parser.add_argument("--older-than", default=None, metavar="D", help="only messages whose timestamp is older (2h)")
    parser.add_argument("--limit", type=_whole, default=None, help="shed at most this many")
    parser.add_argument("--rate", default="", help="N/period[:burst], e.g. 500/1s; default: no limit")
    parser.add_argument("--broker", default="", metavar="NAME", help="the broker of the queue; default: default")
    parser.add_argument("--dry-run", action="store_true", help="show the plan; take nothing")
    parser.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    parser.add_argument("--wait", action="store_true", help="follow the operation with a progress bar")
    parser.add_argument("--inline", action="store_true", help="run it in this process, not a Celery worker")
    parser.add_argument("--user", default="", help="the account to act as (for roles and the audit log)")
    parser.set_defaults(handler=run_shed_command)


def _whole(text: str) -> int:
    """argparse's type for the shed's numbers: ASCII digits only."""
    try:
        return whole_number(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def run_shed_command(command: BaseCommand, **options: Any) -> None:
    older_than = None
    if options["older_than"] is not None:
        try:
            older_than = parse_duration(options["older_than"])
        except ValueError as error:
            raise CommandError(f"--older-than: {error}") from None
    actor = _actor(options["user"])
    arguments: dict[str, Any] = {
        "queue": options["queue"],
        "priority_below": options["priority_below"],
        "older_than": older_than,
        "limit": options["limit"],
        "rate": options["rate"],
        "broker": options["broker"],
        "actor": actor,
    }
    try:
        if options["dry_run"]:
            with transaction.atomic():
                write_plan(command, plan_shed(**arguments), dry_run=True)
                command.stdout.write("Dry run: nothing was taken.")
                transaction.set_rollback(True)
            return
        operation = plan_shed(**arguments)
        write_plan(command, operation)
    except (OperationError, PermissionDenied) as error:
        raise CommandError(str(error)) from None
    if _confirm_start_follow(command, operation, actor=actor, **options):
        operation.refresh_from_db()
        if stopped := (operation.breakdown or {}).get("shed", {}).get("stopped"):
            command.stdout.write(f"Stopped: {stopped}.")


def _confirm_start_follow(command: BaseCommand, operation: Operation, *, actor: Any, **options: Any) -> bool:
    """Ask before starting a planned operation (unless --yes), start it, run it here with --inline and follow it
    with --wait or --inline; True when it was followed to its end."""
    try:
        if not options["yes"] and not _confirm(command, operation):
            cancel_operation(operation=operation, actor=actor)
            command.stdout.write(f"Cancelled operation #{operation.pk}.")
            return False
        operation = start_operation(operation=operation, actor=actor)
    except (OperationError, PermissionDenied) as error:
        raise CommandError(str(error)) from None
    command.stdout.write(f"Started operation #{operation.pk}.")
    if options["inline"]:
        run_operation(operation_id=operation.pk)
    if options["wait"] or options["inline"]:
        follow(command, operation)
        return True
    return False


def option_dest(option: str) -> str:
    """Where argparse keeps an option's value: `--app-version` in `app_version` (the filter field `version`)."""
    return option.removeprefix("--").replace("-", "_")


def filter_from_options(options: dict[str, Any]) -> DeadLetterFilter:
    """The filter the options give. An option given blank (`--text "$TERM"` with TERM empty) is refused: left out, a
    filter selects by nothing, so a blank one would widen a purge to every dead letter."""
    blank = [
        option
        for option, _, _ in LIST_FILTERS
        if any(not str(value).strip() for value in options.get(option_dest(option)) or [])
    ] + [
        option
        for option, _, _ in TEXT_FILTERS
        if options.get(option_dest(option)) is not None and not str(options[option_dest(option)]).strip()
    ]
    if blank:
        raise CommandError(
            f"{blank[0]} is blank: give it a value, or leave it out (a blank filter selects nothing by it)"
        )
    data: dict[str, Any] = {}
    for option, name, _ in LIST_FILTERS:
        values = options.get(option_dest(option)) or []
        data[name] = [part.strip() for value in values for part in str(value).split(",") if part.strip()]
    for option, name, _ in TEXT_FILTERS:
        data[name] = options.get(option_dest(option)) or ""
    try:
        return DeadLetterFilter.from_dict(data)
    except FilterError as error:
        raise CommandError(str(error)) from None


def _actor(username: str) -> AbstractBaseUser | None:
    if not username:
        return None
    try:
        return get_user_model().objects.get(username=username)
    except get_user_model().DoesNotExist:
        raise CommandError(f"no user {username!r}") from None


def run_kind(command: BaseCommand, **options: Any) -> None:
    kind = options["kind"]
    found = filter_from_options(options)
    actor = _actor(options["user"])
    arguments: dict[str, Any] = {
        "kind": kind,
        "filter": found,
        "actor": actor,
        "limit": options["limit"],
        "rate": options.get("rate", ""),
        "canary_size": options.get("canary", 0),
        "canary_wait_seconds": options.get("canary_wait"),
        "target_queue": options.get("target_queue", ""),
        "target_exchange": options.get("target_exchange", ""),
        "target_routing_key": options.get("routing_key", ""),
        "target_broker": options.get("target_broker", ""),
    }
    try:
        if options["dry_run"]:
            with transaction.atomic():
                operation = plan_operation(**arguments)
                write_plan(command, operation, dry_run=True)
                command.stdout.write("Dry run: nothing was changed.")
                transaction.set_rollback(True)
            return
        operation = plan_operation(**arguments)
        write_plan(command, operation)
    except (OperationError, PermissionDenied) as error:
        raise CommandError(str(error)) from None
    if operation.total == 0:
        command.stdout.write("Nothing to do.")
        return
    _confirm_start_follow(command, operation, actor=actor, **options)


def run_control(command: BaseCommand, *, action: str, operation_id: int, **options: Any) -> None:
    try:
        operation = Operation.objects.get(pk=operation_id)
    except Operation.DoesNotExist:
        raise CommandError(f"no operation #{operation_id}") from None
    actor = _actor(options["user"])
    try:
        if action == "pause":
            operation = pause_operation(operation=operation, actor=actor)
        elif action == "resume":
            operation = resume_operation(operation=operation, actor=actor)
        elif action == "cancel":
            operation = cancel_operation(operation=operation, actor=actor)
        elif action == "rate":
            operation = change_rate(operation=operation, rate=options["rate"], actor=actor)
    except (OperationError, PermissionDenied) as error:
        raise CommandError(str(error)) from None
    write_plan(command, operation)
    command.stdout.write(progress_line(operation))
    if options["wait"]:
        follow(command, operation)


def write_plan(command: BaseCommand, operation: Operation, *, dry_run: bool = False) -> None:
    write = command.stdout.write
    if operation.kind == OperationKind.SHED:
        name = "Plan (dry run)" if dry_run else f"Operation #{operation.pk}"
        write(f"{name}: {describe_shed(operation.shed_plan, rate=operation.rate)}")
        if operation.shed_plan.get("type_from") == "watched queue":
            write("  queue type: from the watched queue's row (the management API could not be asked)")
        if operation.last_error:
            write(f"  note: {operation.last_error}")
        return
    filter_text = ", ".join(f"{key}={value}" for key, value in operation.filter.items()) or "everything"
    # A dry run's plan is rolled back: it has no number anyone could look up.
    name = "Plan (dry run)" if dry_run else f"Operation #{operation.pk}"
    write(f"{name}: {operation.get_kind_display().lower()} {operation.total:,} dead letters")
    if operation.broker_span:
        # Said before anything else: a retry of production's and staging's dead letters at once is rarely meant.
        write(f"  ** {operation.broker_span} **")
    write(f"  filter: {filter_text}")
    if operation.target_display:
        write(f"  target: {operation.target_display}")
    if operation.rate or operation.canary_size:
        extra = [f"rate {operation.rate}" if operation.rate else "no rate limit"]
        if operation.canary_size:
            extra.append(f"canary {operation.canary_size}, then wait {operation.canary_wait_seconds}s")
        write("  " + "; ".join(extra))
    breakdown = operation.breakdown or {}
    if operation.names_brokers:
        write("  by broker: " + "; ".join(f"{broker} {n:,}" for broker, n in operation.broker_counts))
    if breakdown.get("queue"):
        write("  by queue: " + "; ".join(f"{name} {n:,}" for name, n in breakdown["queue"].items()))
    for row in breakdown.get("pattern", [])[:10]:
        write(f"  pattern #{row['id']}: {row['count']:>8,}  {row['template'][:90]}")
    if breakdown.get("destination"):
        write("  by destination: " + "; ".join(f"{name} {n:,}" for name, n in breakdown["destination"].items()))
    if operation.unreplayable:
        write(f"  cannot be replayed: {operation.unreplayable:,}")
        for reason, n in operation.unreplayable_reasons.items():
            write(f"    {n:>8,}  {reason}")
    if operation.bindings_note:
        write(f"  bindings: {operation.bindings_note}")
    if operation.last_error:
        write(f"  note: {operation.last_error}")
    if operation.items_removed_at is not None and operation.total:
        when = f"{timezone.localtime(operation.items_removed_at):%Y-%m-%d %H:%M %Z}"
        write(f"  per-message rows: removed by retention on {when}; the figures below are its summary")
        for error, n in (operation.items_summary or {}).get("errors", []):
            write(f"    failed {n:>8,}  {error[:120]}")


def _confirm(command: BaseCommand, operation: Operation) -> bool:
    """Ask on the terminal; no answer (no terminal, input closed, Ctrl-C) is a no: the plan is cancelled."""
    verb = operation.get_kind_display().lower()
    if operation.kind == OperationKind.PURGE:
        prompt, yes = f"Type 'purge {operation.total}' to delete {operation.total:,} dead letters for good: ", None
    elif operation.kind == OperationKind.SHED:
        queue = operation.shed_plan.get("queue")
        prompt, yes = f"Type 'shed {operation.total}' to scan the {operation.total:,} messages of {queue}: ", None
    else:
        spanned = operation.broker_counts
        brokers = f" on {len(spanned)} brokers" if len(spanned) > 1 else ""
        prompt, yes = f"{verb.capitalize()} {operation.total:,} dead letters{brokers}? [y/N] ", ("y", "yes")
    try:
        answer = input(prompt).strip()
    except (EOFError, KeyboardInterrupt):
        command.stdout.write("\nNo answer (give --yes to run without asking).")
        return False
    if yes is None:
        return answer == f"{operation.kind} {operation.total}"
    return answer.lower() in yes


def progress_line(operation: Operation, *, width: int = 30) -> str:
    done = int(operation.progress * width)
    bar = "#" * done + "." * (width - done)
    eta = operation.eta
    eta_text = f" eta {str(eta).split('.')[0]}" if eta is not None else ""
    reason = f" ({operation.pause_reason})" if operation.pause_reason and operation.status == "paused" else ""
    return (
        f"[{bar}] {operation.progress:4.0%} {operation.processed:,}/{operation.total:,} "
        f"ok {operation.succeeded:,} failed {operation.failed:,} skipped {operation.skipped:,} "
        f"{operation.status}{reason}{eta_text}"
    )


def follow(command: BaseCommand, operation: Operation, *, interval: float = 0.5) -> None:
    """Redraw a progress bar until the operation finishes or pauses."""
    tty = sys.stdout.isatty()
    last_print = 0.0
    while True:
        operation.refresh_from_db()
        line = progress_line(operation)
        over = operation.status in FINISHED_STATUSES or operation.status == "paused"
        if tty:
            command.stdout.write("\r" + line, ending="\n" if over else "")
            command.stdout.flush()
        elif over or time.monotonic() - last_print > 5:
            command.stdout.write(line)
            last_print = time.monotonic()
        if over:
            return
        time.sleep(interval)
