from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from dlqconsole.deadletters.search_fill import BATCH_SIZE, fill_search_text, pending_count

# Rows filled between two lines of progress.
ROWS_PER_REPORT = 50_000


class Command(BaseCommand):
    help = (
        "Fill in the search text of every dead letter stored before it existed, now, with a line of progress every "
        f"{ROWS_PER_REPORT:,} rows. Beat does the same a batch a minute; run this after upgrading a large database "
        "to have text searches read the index at once. Safe to stop (Ctrl-C) and to run again: every batch is "
        "written when done, and the next run goes on from there."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--batch-size", type=int, default=BATCH_SIZE, help="rows per UPDATE")

    def handle(self, *args: Any, batch_size: int, **options: Any) -> None:
        if batch_size < 1:
            raise CommandError("--batch-size must be at least 1")
        total = pending_count()
        if not total:
            self.stdout.write("Every dead letter has its search text: nothing to do.")
            return
        self.stdout.write(f"{total:,} dead letters without search text; filling them in.")
        started = time.monotonic()
        done = 0
        while filled := fill_search_text(limit=ROWS_PER_REPORT, batch_size=batch_size):
            done += filled
            elapsed = time.monotonic() - started
            rate = done / elapsed if elapsed else 0.0
            left = max(total - done, 0)
            eta = f", about {left / rate:.0f} s left" if rate and left else ""
            self.stdout.write(f"{done:,} of {total:,} ({min(done / total, 1):.0%}), {rate:,.0f} rows/s{eta}")
        self.stdout.write(self.style.SUCCESS(f"Done: {done:,} dead letters filled in."))
