"""Rate limiters on the real Redis (REDIS_URL), each test under its own key prefix, removed afterwards."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest
import redis
from django.conf import settings

from dlqconsole.core.ratelimit import LocalRateLimiter, RateLimiter, RedisRateLimiter

# scripts/test sets REDIS_URL; this default matches it so a bare `pytest` run also talks to a real Redis.
TEST_REDIS_URL = "redis://127.0.0.1:6379/15"


@pytest.fixture
def redis_url() -> str:
    return settings.REDIS_URL or TEST_REDIS_URL


@pytest.fixture
def redis_limiter(redis_url: str) -> Iterator[Callable[[], RedisRateLimiter]]:
    """Makes Redis limiters (each with its own connections) that share one key prefix unique to the test."""
    prefix = f"test-ratelimit-{uuid.uuid4().hex[:12]}:"
    made: list[RedisRateLimiter] = []

    def make() -> RedisRateLimiter:
        made.append(RedisRateLimiter(redis_url, prefix=prefix))
        return made[-1]

    yield make
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=prefix + "*"))
    if keys:
        client.delete(*keys)
    client.close()
    for limiter in made:
        limiter.client.close()


@pytest.fixture(params=["redis", "local"])
def limiter(request: pytest.FixtureRequest, redis_limiter: Callable[[], RedisRateLimiter]) -> RateLimiter:
    return redis_limiter() if request.param == "redis" else LocalRateLimiter()
