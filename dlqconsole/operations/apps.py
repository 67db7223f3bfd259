from __future__ import annotations

from django.apps import AppConfig


class OperationsConfig(AppConfig):
    name = "dlqconsole.operations"
    label = "operations"
    verbose_name = "Operations"

    def ready(self) -> None:
        # Imported here: Django imports this module while it loads the apps, before models may be imported.
        from dlqconsole.deadletters import replays
        from dlqconsole.deadletters.services import register_pattern_scope
        from dlqconsole.operations.message_page import MessageReplays
        from dlqconsole.operations.models import RetryPolicy

        # A dead letter's pages show and start replays, which are this app's: lend them (deadletters/replays.py).
        replays.register(MessageReplays())
        # A retry policy scoped to one pattern follows it when the pattern is merged into another.
        register_pattern_scope(RetryPolicy)
