"""The console's settings for a test worker with one slot: a solo worker otherwise prefetches as many messages as
the machine has cores, and a message it prefetched waits behind the task it runs."""

from __future__ import annotations

from dlqconsole.settings import *  # noqa: F403

CELERY_WORKER_CONCURRENCY = 1
