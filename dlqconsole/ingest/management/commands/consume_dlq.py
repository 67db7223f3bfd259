"""Drain dead-letter queues into the database (see dlqconsole.ingest.consumer for how)."""

from __future__ import annotations

import signal
from functools import partial
from types import FrameType
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection

from dlqconsole.brokers import registry
from dlqconsole.ingest.broker_consumers import BrokerConsumers
from dlqconsole.ingest.consumer import ConsumerStats, DeadLetterConsumer
from dlqconsole.ingest.supervisor import Supervisor, default_processes


class Command(BaseCommand):
    help = (
        "Consume dead-letter queues and store every message in the database, acking only after the commit. "
        "Brokers: every enabled one (AMQP_URL as default, DLQ_BROKERS, the admin's), each on a connection of its "
        "own, or those --broker names. Queues: --queues, else DLQ_QUEUES (broker default), else the DLQ of every "
        "enabled watched queue of the broker. Stops cleanly on SIGTERM or SIGINT. Runs one consumer process per "
        "core on PostgreSQL (--processes)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--queues", default="", help="comma-separated dead-letter queue names")
        parser.add_argument(
            "--broker",
            action="append",
            default=[],
            metavar="NAME",
            help="consume only this broker (repeat, or comma-separate, for several); default every enabled broker",
        )
        parser.add_argument(
            "--batch-size", type=int, default=None, help="messages per transaction (DLQ_CONSUMER_BATCH_SIZE)"
        )
        parser.add_argument(
            "--batch-seconds",
            type=float,
            default=None,
            help="longest wait before a partial batch is written (DLQ_CONSUMER_BATCH_SECONDS)",
        )
        parser.add_argument(
            "--prefetch", type=int, default=None, help="unacked messages per queue (DLQ_CONSUMER_PREFETCH)"
        )
        parser.add_argument(
            "--processes",
            type=int,
            default=None,
            help="consumer processes on the same queues (DLQ_CONSUMER_PROCESSES; default one per core, at most 4, "
            "on PostgreSQL, one on SQLite)",
        )
        parser.add_argument(
            "--exit-when-idle",
            type=float,
            default=None,
            metavar="SECONDS",
            help="exit after this many seconds without a message (tests, benchmarks, one-off drains)",
        )
        parser.add_argument(
            "--refresh-seconds",
            type=float,
            default=5.0,
            help="how often the watched queues are read again (one query) and missing queues are tried again",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        for name in ("batch_size", "prefetch", "processes"):
            if options[name] is not None and options[name] < 1:
                raise CommandError(f"--{name.replace('_', '-')} must be at least 1")
        for name in ("batch_seconds", "exit_when_idle", "refresh_seconds"):
            if options[name] is not None and options[name] < 0:
                raise CommandError(f"--{name.replace('_', '-')} must not be negative")
        names = [name.strip() for value in options["broker"] for name in value.split(",") if name.strip()]
        try:
            registry.named(names)
        except registry.UnknownBroker as error:
            raise CommandError(str(error)) from None
        make_broker_consumer = partial(
            DeadLetterConsumer,
            queues=[name.strip() for name in options["queues"].split(",") if name.strip()],
            batch_size=options["batch_size"],
            batch_seconds=options["batch_seconds"],
            prefetch=options["prefetch"],
            exit_when_idle=options["exit_when_idle"],
            refresh_seconds=options["refresh_seconds"],
        )
        make_consumer = partial(
            BrokerConsumers,
            lambda broker: make_broker_consumer(broker=broker),
            broker_names=names,
            refresh_seconds=options["refresh_seconds"],
            exit_when_idle=options["exit_when_idle"] is not None,
        )
        processes = options["processes"] or settings.DLQ_CONSUMER_PROCESSES or default_processes(connection.vendor)
        failed = False
        if processes > 1:
            self.stdout.write(f"consume_dlq: {processes} consumer processes")
            supervisor = Supervisor(processes, make_consumer, exit_when_idle=options["exit_when_idle"] is not None)
            stats = supervisor.run()
            failed = supervisor.failed
        else:
            stats = self.run_one(make_consumer())
        self.stdout.write(
            f"consume_dlq: {stats.received} received, {stats.inserted} new, {stats.duplicates} duplicates, "
            f"{stats.batches} batches, {stats.reduced} stored reduced, "
            f"{stats.broker_errors} broker errors, {stats.database_errors} database errors"
        )
        if failed:
            raise CommandError("a consumer process failed (see the log above); nothing unacked is lost")

    def run_one(self, consumer: BrokerConsumers) -> ConsumerStats:
        self.consumer = consumer
        previous = {number: signal.signal(number, self.on_signal) for number in (signal.SIGTERM, signal.SIGINT)}
        try:
            consumer.run()
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)
        return consumer.stats

    def on_signal(self, number: int, frame: FrameType | None) -> None:
        name = signal.Signals(number).name
        self.stdout.write(f"{name} received; writing the current batch and stopping")
        self.consumer.stop()
