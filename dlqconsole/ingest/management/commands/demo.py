"""`demo [--rate N] [--burst N | --once] [--prefix demo.] [--no-celery]`: a faulty shop that dead-letters
realistic failures through the real broker (see dlqconsole.ingest.demo.service).

Runs until SIGTERM or SIGINT and then stops cleanly (its Celery worker too); `--burst N` emits N messages at
once, waits until they have all been handled, expired or dead-lettered, and exits; `--once` does that for one
round of every kind.
"""

from __future__ import annotations

import signal
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from dlqconsole.ingest.demo.faults import ROUND
from dlqconsole.ingest.demo.service import FaultyShop
from dlqconsole.ingest.topology import TopologyError


class Command(BaseCommand):
    help = "Declare demo queues and run a faulty service that dead-letters realistic failures."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--rate", type=float, default=2.0, help="Messages per second (default 2).")
        parser.add_argument(
            "--burst",
            type=int,
            metavar="N",
            help="Emit N messages at once (a stock batch counts once), let them settle, exit.",
        )
        parser.add_argument("--once", action="store_true", help="Emit one message of every kind, settle, exit.")
        parser.add_argument("--prefix", default="demo.", help="Prefix of every queue and exchange (default demo.).")
        parser.add_argument("--no-celery", action="store_true", help="No Celery worker and no task failures.")
        parser.add_argument("--seed", type=int, help="Seed of the random mix, for a reproducible run.")
        parser.add_argument(
            "--settle-timeout", type=float, default=120.0, help="Seconds --burst/--once wait for the messages."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["rate"] <= 0 or options["rate"] > 1000:
            raise CommandError("--rate must be above 0 and at most 1000 messages per second.")
        if options["burst"] is not None and options["burst"] < 1:
            raise CommandError("--burst must be at least 1.")
        shop = FaultyShop(
            prefix=options["prefix"],
            seed=options["seed"],
            celery=not options["no_celery"],
            log=self.stdout.write,
        )

        def on_signal(signum: int, frame: FrameType | None) -> None:
            shop.stop()

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            shop.setup()
            self.stdout.write("Dead-letter queues: " + ", ".join(t.dead_letter_queue for t in shop.topologies))
            count = options["burst"] or (len(ROUND) if options["once"] else None)
            if count is None:
                self.stdout.write(f"Emitting {options['rate']:g} messages/s; stop with Ctrl-C or SIGTERM.")
                shop.run(rate=options["rate"])
            else:
                shop.emit(count)
                if not shop.settle(timeout=options["settle_timeout"]) and not shop.stopping:
                    self.stderr.write("Some demo messages were still in flight when --settle-timeout ran out.")
        except TopologyError as error:
            raise CommandError(str(error)) from error
        finally:
            shop.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        self.stdout.write(shop.summary())
        self.stdout.write("By kind: " + ", ".join(f"{kind} {n}" for kind, n in sorted(shop.emitted.items())))
