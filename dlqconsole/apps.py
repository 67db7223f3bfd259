"""The console itself, as an app of its own: what sits above every app (dashboard.py, metrics.py) is wired up
here when Django starts, so that no app has to import a module above it."""

from __future__ import annotations

from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "dlqconsole"
    label = "dlqconsole"
    verbose_name = "DLQ console"

    def ready(self) -> None:
        # The dead-letter gauges of /metrics; registered here so every process that serves /metrics has them.
        # Imported here: Django imports this module while it loads the apps, before models may be imported.
        from dlqconsole.ingest.shedding import ShedStorage
        from dlqconsole.metrics import register_collector
        from dlqconsole.operations.shed_queue import register_storage

        register_collector()
        # A shed (operations) stores what it takes as dead letters the way ingest stores them: lent here, as the
        # two apps cannot import each other.
        register_storage(ShedStorage())
