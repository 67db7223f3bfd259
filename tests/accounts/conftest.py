"""Sign-in tests count failures in a cache of their own: the shared Redis keeps counts for 15 minutes, and a run's
wrong passwords must not lock a later run (or the browser tests) out."""

from __future__ import annotations

import uuid
from typing import Any

import pytest


@pytest.fixture(autouse=True)
def _local_cache(settings: Any) -> None:
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": uuid.uuid4().hex}
    }
