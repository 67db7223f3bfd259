"""The API's patterns resources (urlpatterns, included by api/urls.py)."""

from __future__ import annotations

from typing import Any

urlpatterns: list[Any] = []
