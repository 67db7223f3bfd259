from __future__ import annotations

from django.apps import AppConfig


class IngestConfig(AppConfig):
    name = "dlqconsole.ingest"
    label = "ingest"
    verbose_name = "Ingest"
