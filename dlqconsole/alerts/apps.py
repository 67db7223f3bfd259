from __future__ import annotations

from django.apps import AppConfig


class AlertsConfig(AppConfig):
    name = "dlqconsole.alerts"
    label = "alerts"
    verbose_name = "Alerts"

    def ready(self) -> None:
        # The dead-letter gauges of /metrics; registered here so every process that serves /metrics has them.
        from dlqconsole.metrics import register_collector

        register_collector()
