from __future__ import annotations

from django.apps import AppConfig


class AlertsConfig(AppConfig):
    name = "dlqconsole.alerts"
    label = "alerts"
    verbose_name = "Alerts"

    def ready(self) -> None:
        # Imported here: Django imports this module while it loads the apps, before models may be imported.
        from dlqconsole.alerts.models import AlertRule
        from dlqconsole.deadletters.services import register_pattern_scope

        # A rule watching one pattern follows it when the pattern is merged into another (deadletters/services.py).
        register_pattern_scope(AlertRule)
