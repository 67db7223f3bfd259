from __future__ import annotations

import os
from typing import Any

from celery import Celery, signals

from dlqconsole.checks import refuse_to_start_without_secret_key

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dlqconsole.settings")

app = Celery("dlqconsole")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


# Workers send notifications (with channel tags signed by SECRET_KEY) and beat starts them: neither starts with a
# public key. The signals fire for any Celery app in a process that imported this one (the demo's has its own
# worker), hence the check of the app.
@signals.celeryd_init.connect
def _worker_needs_a_secret_key(instance: Any, **kwargs: Any) -> None:
    if instance.app is app:
        refuse_to_start_without_secret_key("the Celery worker")


@signals.beat_init.connect
def _beat_needs_a_secret_key(sender: Any, **kwargs: Any) -> None:
    if sender.app is app:
        refuse_to_start_without_secret_key("Celery beat")
