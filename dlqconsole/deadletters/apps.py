from __future__ import annotations

from django.apps import AppConfig


class DeadLettersConfig(AppConfig):
    name = "dlqconsole.deadletters"
    label = "deadletters"
    verbose_name = "Dead letters"
