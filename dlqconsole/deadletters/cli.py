"""`dlq fingerprint`, `dlq report failure-patterns` and `dlq regroup`: FINGERPRINT_HELP says what the first does.
`dlq regroup` merges the stored patterns that the current grouping rules make one (see deadletters/regroup.py);
`--dry-run` prints what it would merge and changes nothing.
"""

from __future__ import annotations

import io
import json
import sys
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from dlqconsole.deadletters.classify import classify
from dlqconsole.deadletters.filters import FilterError, broker_ids
from dlqconsole.deadletters.fingerprint import leading_error_type, split_error_type
from dlqconsole.deadletters.grouping import assign_patterns
from dlqconsole.deadletters.grouping.engine import Grouper, group_lines
from dlqconsole.deadletters.models import DeadLetterCount, DeathReason, FailurePattern, PatternStatus
from dlqconsole.deadletters.regroup import MergeGroup, MergeOutcome, apply_regroup, plan_regroup

FINGERPRINT_HELP = """`dlq fingerprint` reads every line of stdin first, then groups them all together (masking,
stack-trace-free text fingerprints, template mining over the whole set), then prints one `<pattern key>\\t<template>`
line per input line, in input order. The keys are those ingest would give the same messages in an empty database, in
any order and in any number of consumers. Without `--save` it never touches the database; with `--save` the
lines are filed through the database as ingest files dead letters (custom rules, merges and splits apply, and
the fingerprints and patterns are stored), and the printed keys are the database's.

With `--records`, each line of stdin is a JSON object, `{"message": ..., "error_type": ..., "stack_trace": ...,
"headers": {...}}` (all but "message" optional), so that multi-line messages and stack traces are grouped exactly
as ingest groups a dead letter with those headers: the type read from the front of the message when none is
given, as ingest reads it, and the headers matched by custom rules (with `--save`). Empty lines are skipped; a line
that is no such object stops the command with its line number, before anything is filed.
"""


def add_subcommands(subcommands: Any, *, command: BaseCommand) -> None:
    parser = subcommands.add_parser(
        "fingerprint",
        help="Read error messages from stdin (one per line, or JSON records with --records), print "
        "'<pattern key>\\t<template>' for each.",
        description=FINGERPRINT_HELP,
    )
    parser.add_argument(
        "--save", action="store_true", help="File the lines through the database as ingest would, and store them."
    )
    parser.add_argument("--json", action="store_true", dest="as_json", help="One JSON object per line.")
    parser.add_argument(
        "--records",
        action="store_true",
        help='Read one JSON object per line: {"message", "error_type", "stack_trace", "headers"}, all but message '
        "optional.",
    )
    parser.set_defaults(handler=run_fingerprint)
    report = subcommands.add_parser("report", help="Reports.")
    report.add_argument("report", choices=["failure-patterns"])
    report.add_argument("--json", action="store_true", dest="as_json", help="One JSON object per pattern.")
    report.add_argument("--status", choices=PatternStatus.values, help="Only patterns with this triage status.")
    report.add_argument("--limit", type=int, default=0, help="At most this many patterns (most recent first).")
    report.add_argument(
        "--broker",
        default="",
        metavar="NAME",
        help="Only patterns with dead letters on this broker; parked counts that broker's (total stays the pattern's).",
    )
    report.set_defaults(handler=run_report)
    regroup = subcommands.add_parser(
        "regroup",
        help="Merge the stored patterns that the current grouping rules make one (never splits).",
        description="Groups every stored dead letter under the current grouping rules and merges the patterns whose "
        "dead letters all land in one group into the busiest of them; then files the current rules' fingerprints "
        "of the stored texts under the patterns that hold them.",
    )
    regroup.add_argument("--dry-run", action="store_true", help="show what would be merged; change nothing")
    regroup.add_argument(
        "--user", default="", help="the account to act as in the history and audit log (default: none, the system)"
    )
    regroup.set_defaults(handler=run_regroup)


def _read_lines() -> list[str]:
    # Bytes that are not UTF-8 must not stop the command: they become replacement characters.
    stream = getattr(sys.stdin, "buffer", None)
    text = io.TextIOWrapper(stream, encoding="utf-8", errors="replace") if stream is not None else sys.stdin
    return [line.rstrip("\r\n") for line in text]


def run_fingerprint(
    command: BaseCommand, *, save: bool = False, as_json: bool = False, records: bool = False, **options: Any
) -> None:
    lines = _read_lines()
    if records:
        letters = _read_records(lines)
        rows = _file(letters) if save else _group(letters)
    elif save:
        rows = _file(_letters_of_lines(lines))
    else:
        rows = [(pattern.key, pattern.template, pattern.error_type) for pattern in group_lines(lines)]
    if as_json:
        output = [
            json.dumps({"key": key, "template": template, "error_type": error_type}, ensure_ascii=False)
            for key, template, error_type in rows
        ]
    else:
        # A line read as "Type: message" is shown the same way.
        output = [f"{key}\t{_with_type(template, error_type)}" for key, template, error_type in rows]
    if output:
        command.stdout.write("\n".join(output))


def _with_type(template: str, error_type: str) -> str:
    # A stack trace's template names the type already, shortened ("IllegalStateException at ...").
    if not error_type or template.startswith((error_type, error_type.rsplit(".", 1)[-1] + " at ")):
        return template
    return f"{error_type}: {template}"


@dataclass(slots=True)
class _Line:
    """One line of stdin as a dead letter to file: what grouping reads of one (grouping.Letter), with the
    defaults of a parsed dead letter that says nothing else."""

    error_type: str
    error_message: str
    failure_reason: str
    source_queue: str = "dlq-fingerprint"
    original_queue: str = ""
    death_reason: str = DeathReason.UNKNOWN
    transient: bool = True
    task_name: str = ""
    stack_trace: str = ""
    headers: dict[str, Any] = field(default_factory=dict)
    fingerprint: str = ""


def _letter(error_type: str, message: str, stack_trace: str = "", headers: dict[str, Any] | None = None) -> _Line:
    reason = classify(error_type=error_type, message=message)
    return _Line(
        error_type=error_type,
        error_message=message,
        failure_reason=str(reason or "UNKNOWN"),
        stack_trace=stack_trace,
        headers=headers or {},
    )


def _letters_of_lines(lines: list[str]) -> list[_Line]:
    return [_letter(*split_error_type(line)) for line in lines]


def _read_records(lines: list[str]) -> list[_Line]:
    letters: list[_Line] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as error:
            raise CommandError(f"line {number}: not JSON ({error})") from None
        if not isinstance(record, dict):
            raise CommandError(f"line {number}: a JSON object is needed, not {type(record).__name__}")
        if "message" not in record:
            raise CommandError(f'line {number}: no "message" (every record needs one; the other keys are optional)')
        message = record["message"]
        if not isinstance(message, str):
            raise CommandError(f'line {number}: "message" must be text')
        texts = {name: record.get(name) or "" for name in ("error_type", "stack_trace")}
        for name, value in texts.items():
            if not isinstance(value, str):
                raise CommandError(f'line {number}: "{name}" must be text')
        headers = record.get("headers") or {}
        if not isinstance(headers, dict):
            raise CommandError(f'line {number}: "headers" must be an object')
        error_type, message = (texts["error_type"], message) if texts["error_type"] else leading_error_type(message)
        letters.append(_letter(error_type, message, texts["stack_trace"], headers))
    return letters


def _group(letters: list[_Line]) -> list[tuple[str, str, str]]:
    """In memory, as `group_lines` groups lines: all the records mined together."""
    grouper = Grouper()
    keys = [
        grouper.add(
            error_type=letter.error_type,
            message=letter.error_message,
            stack_trace=letter.stack_trace,
            reason=letter.failure_reason,
        )
        for letter in letters
    ]
    patterns = grouper.patterns()
    return [(patterns[key].key, patterns[key].template, patterns[key].error_type) for key in keys]


def _file(letters: list[_Line]) -> list[tuple[str, str, str]]:
    # An empty line is no failure to file: it gets the in-memory answer, "(no error message)".
    texts = [letter for letter in letters if letter.error_type or letter.error_message or letter.stack_trace]
    with transaction.atomic():
        filing = assign_patterns(letters=texts, now=timezone.now()) if texts else {}
    patterns = {pattern.pk: pattern for pattern in FailurePattern.objects.filter(pk__in=set(filing.values()))}
    if len(patterns) != len(set(filing.values())):
        raise CommandError("A pattern disappeared while filing; run the command again.")
    empty = group_lines([""])[0]
    return [
        (patterns[filing[letter.fingerprint]].key, patterns[filing[letter.fingerprint]].template, letter.error_type)
        if letter.error_type or letter.error_message or letter.stack_trace
        else (empty.key, empty.template, "")
        for letter in letters
    ]


# The text report's columns, in the line every row and the header are written with.
REPORT_COLUMNS = ("id", "total", "parked", "status", "reason", "template")
REPORT_LINE = "{id:>6} {total:>9} {parked:>9}  {status:<12} {reason:<18} {template}"


def run_report(
    command: BaseCommand,
    *,
    as_json: bool = False,
    status: str | None = None,
    limit: int = 0,
    broker: str = "",
    **options: Any,
) -> None:
    patterns = FailurePattern.objects.active().select_related("owner").order_by("-last_seen_at", "-id")
    cells = DeadLetterCount.objects.all()
    if broker:
        try:
            cells = cells.filter(broker_id__in=broker_ids([broker]))
        except FilterError as error:
            raise CommandError(str(error)) from None
        patterns = patterns.filter(pk__in=cells.filter(count__gt=0).values("pattern_id"))
    if status:
        patterns = patterns.filter(status=status)
    if limit > 0:
        patterns = patterns[:limit]
    chosen = list(patterns)
    # Counts come from the counters, never from COUNT(*) over the dead letters.
    by_broker: dict[int, dict[str, int]] = {}
    for pattern_id, name, total in (
        cells.filter(pattern__in=chosen, status="parked", count__gt=0)
        .values("pattern", "broker__name")
        .annotate(total=Sum("count"))
        .values_list("pattern", "broker__name", "total")
    ):
        by_broker.setdefault(pattern_id, {})[name] = int(total or 0)
    if not as_json:
        # Named as in --json, so a reader of either knows the other.
        command.stdout.write(REPORT_LINE.format(**{name: name for name in REPORT_COLUMNS}))
    for pattern in chosen:
        row = {
            "id": pattern.pk,
            "key": pattern.key,
            "template": pattern.template,
            "error_type": pattern.error_type,
            "reason": pattern.failure_reason,
            "origin": pattern.origin,
            "status": pattern.status,
            "owner": pattern.owner.get_username() if pattern.owner else "",
            "total": pattern.total_count,
            "parked": sum(by_broker.get(pattern.pk, {}).values()),
            "parked_by_broker": by_broker.get(pattern.pk, {}),
            "first_seen": pattern.first_seen_at.isoformat(),
            "last_seen": pattern.last_seen_at.isoformat(),
        }
        if as_json:
            command.stdout.write(json.dumps(row, ensure_ascii=False))
        else:
            command.stdout.write(REPORT_LINE.format(**row))


# `dlq regroup` prints a line every this many dead letters read.
REGROUP_PROGRESS = 100_000


def run_regroup(command: BaseCommand, *, dry_run: bool = False, user: str = "", **options: Any) -> None:
    write = command.stdout.write
    actor = None
    if user:
        try:
            actor = get_user_model().objects.get(username=user)
        except get_user_model().DoesNotExist:
            raise CommandError(f"no user {user!r}") from None
    shown = [0]

    def progress(read: int) -> None:
        if read >= shown[0] + REGROUP_PROGRESS:
            shown[0] = read
            write(f"  read {read:,} dead letters")

    plan = plan_regroup(progress=progress)
    write(
        f"Read {_many(plan.letters, 'dead letter')} in {_many(plan.patterns, 'pattern')}: "
        f"{_many(plan.distinct, 'distinct failure')}; {_many(plan.spanning, 'pattern')} spanning several groups "
        "under the current rules (left as they are)."
    )
    for held in plan.held_back:
        write(f"Left as it is: #{held.pattern.id} ({_many(held.pattern.letters, 'dead letter')}), {held.reason}")
    if dry_run:
        for group in plan.merges:
            _write_group(command, group)
        absorbed = sum(len(group.absorbed) for group in plan.merges)
        moving = sum(pattern.letters for group in plan.merges for pattern in group.absorbed)
        write(
            f"Would merge {_many(absorbed, 'pattern')} into {len(plan.merges):,} ({_many(moving, 'dead letter')} "
            f"would move) and file {_many(plan.to_file, 'new fingerprint')}{_unfiled(plan.unfiled)}."
        )
        write("Dry run: nothing was changed.")
        return
    if not plan.merges:
        write("Nothing to merge: the stored patterns are in line with the current grouping rules.")

    def report(outcome: MergeOutcome) -> None:
        _write_group(command, outcome.group, outcome=outcome)

    result = apply_regroup(plan, actor=actor, report=report)
    if plan.merges:
        absorbed = sum(len(outcome.group.absorbed) for outcome in result.merged)
        write(
            f"Merged {_many(absorbed, 'pattern')} into {len(result.merged):,} "
            f"({_many(result.moved, 'dead letter')} moved)."
        )
    write(
        f"Filed {_many(result.filed, 'new fingerprint')} under the patterns that hold their dead letters"
        f"{_unfiled(result.unfiled)}."
    )
    if result.skipped:
        write(f"Skipped {_many(len(result.skipped), 'merge')}: their patterns changed while regroup ran; run it again.")


def _many(count: int, thing: str) -> str:
    return f"{count:,} {thing}{'' if count == 1 else 's'}"


def _unfiled(count: int) -> str:
    return f" ({count:,} left to ingest: the dead letters of each sit in several patterns)" if count else ""


def _write_group(command: BaseCommand, group: MergeGroup, *, outcome: MergeOutcome | None = None) -> None:
    survivor = group.survivor
    head = f"#{survivor.id} ({_many(survivor.letters, 'dead letter')}"
    if outcome is None:
        head = f"Merge into {head})"
    elif outcome.skipped:
        head = f"Skipped, {outcome.skipped}: {head})"
    else:
        head = f"Merged into {head} before, {outcome.moved:,} moved in)"
    write = command.stdout.write
    write(f"{head}: {_shortened(survivor.template)}")
    for pattern in group.absorbed:
        write(f"  #{pattern.id} ({_many(pattern.letters, 'dead letter')}): {_shortened(pattern.template)}")


def _shortened(template: str, limit: int = 200) -> str:
    return template if len(template) <= limit else template[: limit - 1] + "…"
