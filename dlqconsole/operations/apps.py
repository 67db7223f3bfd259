from __future__ import annotations

from django.apps import AppConfig


class OperationsConfig(AppConfig):
    name = "dlqconsole.operations"
    label = "operations"
    verbose_name = "Operations"
