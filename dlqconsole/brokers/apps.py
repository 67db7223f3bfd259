from __future__ import annotations

from django.apps import AppConfig


class BrokersConfig(AppConfig):
    name = "dlqconsole.brokers"
    label = "brokers"
    verbose_name = "Brokers"
