"""`dlq fingerprint` and `dlq report failure-patterns`."""

from __future__ import annotations

import json
import sys
from typing import Any

from django.core.management.base import BaseCommand

from dlqconsole.deadletters.fingerprint import fingerprint
from dlqconsole.deadletters.models import FailurePattern


def add_subcommands(subcommands: Any, *, command: BaseCommand) -> None:
    parser = subcommands.add_parser(
        "fingerprint", help="Read error messages from stdin, print '<pattern key>\\t<template>' per line."
    )
    parser.set_defaults(handler=run_fingerprint)
    report = subcommands.add_parser("report", help="Reports.")
    report.add_argument("report", choices=["failure-patterns"])
    report.add_argument("--json", action="store_true", help="One JSON object per pattern.")
    report.set_defaults(handler=run_report)


def run_fingerprint(command: BaseCommand, **options: Any) -> None:
    for line in sys.stdin:
        found = fingerprint(error_type="", message=line.rstrip("\n"))
        command.stdout.write(f"{found.key}\t{found.template}")


def run_report(command: BaseCommand, *, json: bool = False, **options: Any) -> None:  # noqa: A002
    patterns = FailurePattern.objects.active().order_by("-last_seen_at")
    for pattern in patterns:
        row = {
            "key": pattern.key,
            "template": pattern.template,
            "error_type": pattern.error_type,
            "reason": pattern.failure_reason,
            "status": pattern.status,
            "total": pattern.total_count,
            "last_seen": pattern.last_seen_at.isoformat(),
        }
        if json:
            command.stdout.write(_json_dumps(row))
        else:
            command.stdout.write(f"{row['total']:>8}  {row['status']:<12} {row['reason']:<18} {row['template']}")


def _json_dumps(row: dict[str, Any]) -> str:
    return json.dumps(row, ensure_ascii=False)
