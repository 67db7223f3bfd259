"""`python manage.py dlq <subcommand>`: recover dead letters from the shell.

Each subcommand parses its arguments and calls one service; the handlers live with the app that owns the
capability (`deadletters.cli` for fingerprint and report, `operations.cli` for the bulk operations).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from dlqconsole.deadletters import cli as deadletters_cli
from dlqconsole.operations import cli as operations_cli


class Command(BaseCommand):
    help = (
        "Retry, move, archive, restore or purge dead letters; shed low-priority messages off a flooded work queue; "
        "report failure patterns; fingerprint errors."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        subcommands = parser.add_subparsers(dest="subcommand", required=True, parser_class=type(parser))
        deadletters_cli.add_subcommands(subcommands, command=self)
        operations_cli.add_subcommands(subcommands, command=self)

    def handle(self, *args: Any, **options: Any) -> None:
        options.pop("handler")(self, **options)
