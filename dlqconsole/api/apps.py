from __future__ import annotations

from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "dlqconsole.api"
    label = "api"
    verbose_name = "JSON API"
