"""Requests per personal token (DLQ_API_TOKEN_RATE), in the replay rate limiter's buckets (Redis, shared by every
web process). Over the rate: 429 with Retry-After. A session (the docs page) is limited per user the same way."""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle

from dlqconsole.accounts.models import ApiToken
from dlqconsole.core.ratelimit import RateLimiterUnavailable, get_rate_limiter, parse_rate

log = logging.getLogger(__name__)


class TokenRateThrottle(BaseThrottle):
    def __init__(self) -> None:
        self.seconds = 0.0

    def allow_request(self, request: Request, view: Any) -> bool:
        if isinstance(request.auth, ApiToken):
            key = f"api:token:{request.auth.prefix}"
        elif request.user and request.user.is_authenticated:
            key = f"api:user:{request.user.pk}"
        else:
            return True
        try:
            self.seconds = get_rate_limiter().try_acquire(key, parse_rate(settings.DLQ_API_TOKEN_RATE))
        except RateLimiterUnavailable as problem:
            # Serving without a limit beats refusing every script while Redis is away.
            log.warning("API rate limit not applied: %s", problem)
            return True
        return self.seconds == 0.0

    def wait(self) -> float:
        return self.seconds
