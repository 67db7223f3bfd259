from __future__ import annotations

from typing import Any

import django.core.validators
from django.db import migrations, models


def create_default(apps: Any, schema_editor: Any) -> None:
    """The broker `default` (AMQP_URL) owns every row made before brokers existed; its URL is filled in from the
    environment when the console first reads its brokers."""
    Broker = apps.get_model("brokers", "Broker")
    Broker.objects.get_or_create(name="default", defaults={"url": "", "managed": True})


class Migration(migrations.Migration):
    initial = True
    dependencies: list[tuple[str, str]] = []

    operations = [
        migrations.CreateModel(
            name="Broker",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                (
                    "name",
                    models.CharField(
                        help_text=(
                            "Letters, digits, dot, dash and underscore, at most 64 (shown on every page; used in "
                            "--broker NAME)."
                        ),
                        max_length=64,
                        unique=True,
                        validators=[
                            django.core.validators.RegexValidator(
                                "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
                                "Letters, digits, dot, dash and underscore, at most 64 (shown on every page; used in "
                                "--broker NAME).",
                            )
                        ],
                    ),
                ),
                ("url", models.CharField(max_length=1000, verbose_name="AMQP URL")),
                ("url_secret", models.TextField(blank=True, editable=False)),
                ("api_url", models.CharField(blank=True, max_length=1000, verbose_name="management API URL")),
                ("api_secret", models.TextField(blank=True, editable=False)),
                ("tls_ca_certificate", models.TextField(blank=True, verbose_name="TLS CA certificate")),
                ("tls_verify", models.BooleanField(default=True, verbose_name="verify TLS certificates")),
                (
                    "managed",
                    models.BooleanField(default=False, editable=False, help_text="From AMQP_URL or DLQ_BROKERS."),
                ),
                (
                    "enabled",
                    models.BooleanField(
                        default=True, help_text="Disabled brokers are not consumed, sampled or replayed to."
                    ),
                ),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("updated_at", models.DateTimeField(auto_now=True)),
            ],
            options={"ordering": ["name"]},
        ),
        migrations.RunPython(create_default, migrations.RunPython.noop),
    ]
