"""Django's error reports (the DEBUG page, error e-mails) with broker URLs hidden: Django hides settings whose
names say API, KEY, PASS, SECRET, TOKEN and the like, but `AMQP_URL`, `CELERY_BROKER_URL`, `DATABASE_URL` and
`DLQ_BROKERS` hold passwords in URLs under other names."""

from __future__ import annotations

import re

from django.views.debug import SafeExceptionReporterFilter


class ReporterFilter(SafeExceptionReporterFilter):
    hidden_settings = re.compile(
        r"API|AUTH|TOKEN|KEY|SECRET|PASS|SIGNATURE|HTTP_COOKIE|URL|BROKER|DATABASE", flags=re.I
    )
