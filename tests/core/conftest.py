"""Rate limiters and circuit breakers on the real Redis (REDIS_URL), each test under its own key prefix, removed
afterwards."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from django.conf import settings

from dlqconsole.core.breaker import RedisBreakers
from dlqconsole.core.ratelimit import LocalRateLimiter, RateLimiter, RedisRateLimiter

# scripts/test sets REDIS_URL; this default matches it so a bare `pytest` run also talks to a real Redis.
TEST_REDIS_URL = "redis://127.0.0.1:6379/15"


@pytest.fixture
def redis_url() -> str:
    return settings.REDIS_URL or TEST_REDIS_URL


def made_under_a_prefix(redis_url: str, name: str, make: Callable[..., Any]) -> Iterator[Callable[[], Any]]:
    """Yields a maker of `make(redis_url, prefix=...)` objects (each with its own connections) that share one key
    prefix unique to the test; afterwards deletes their keys and closes their connections."""
    prefix = f"test-{name}-{uuid.uuid4().hex[:12]}:"
    made: list[Any] = []

    def maker() -> Any:
        made.append(make(redis_url, prefix=prefix))
        return made[-1]

    yield maker
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=prefix + "*"))
    if keys:
        client.delete(*keys)
    client.close()
    for each in made:
        each.client.close()


@pytest.fixture
def redis_limiter(redis_url: str) -> Iterator[Callable[[], RedisRateLimiter]]:
    """Makes Redis limiters that share one key prefix unique to the test."""
    yield from made_under_a_prefix(redis_url, "ratelimit", RedisRateLimiter)


@pytest.fixture
def redis_breakers(redis_url: str) -> Iterator[Callable[[], RedisBreakers]]:
    """Makes Redis circuit breakers that share one key prefix unique to the test."""
    yield from made_under_a_prefix(redis_url, "breaker", RedisBreakers)


@pytest.fixture(params=["redis", "local"])
def limiter(request: pytest.FixtureRequest, redis_limiter: Callable[[], RedisRateLimiter]) -> RateLimiter:
    return redis_limiter() if request.param == "redis" else LocalRateLimiter()
