"""Leases on the real Redis (and in process): a pool holds at most its limit, a holder gives its place back, and
one that stops renewing loses it when its lease runs out."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator

import pytest
import redis

from dlqconsole.core.leases import Leases, LeasesUnavailable, LocalLeases, RedisLeases


@pytest.fixture
def redis_leases(redis_url: str) -> Iterator[Callable[[], RedisLeases]]:
    """Makes Redis leases (each with its own connections, as separate processes have) under one prefix unique to
    the test."""
    prefix = f"test-leases-{uuid.uuid4().hex[:12]}:"
    made: list[RedisLeases] = []

    def make() -> RedisLeases:
        made.append(RedisLeases(redis_url, prefix=prefix))
        return made[-1]

    yield make
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=prefix + "*"))
    if keys:
        client.delete(*keys)
    client.close()
    for leases in made:
        leases.client.close()


@pytest.fixture(params=["redis", "local"])
def leases(request: pytest.FixtureRequest, redis_leases: Callable[[], RedisLeases]) -> Leases:
    return redis_leases() if request.param == "redis" else LocalLeases()


def test_a_pool_holds_at_most_its_limit_until_a_holder_gives_its_place_back(leases: Leases) -> None:
    assert leases.take("pool", "a", limit=2, seconds=60)
    assert leases.take("pool", "b", limit=2, seconds=60)

    assert not leases.take("pool", "c", limit=2, seconds=60)
    assert leases.holders("pool") == {"a", "b"}

    leases.give_back("pool", "a")

    assert leases.take("pool", "c", limit=2, seconds=60)
    assert leases.holders("pool") == {"b", "c"}


def test_a_holder_taking_again_keeps_its_one_place(leases: Leases) -> None:
    assert leases.take("pool", "a", limit=1, seconds=60)

    assert leases.take("pool", "a", limit=1, seconds=60)
    assert leases.holders("pool") == {"a"}


def test_pools_are_counted_apart(leases: Leases) -> None:
    assert leases.take("user:1", "a", limit=1, seconds=60)

    assert leases.take("user:2", "b", limit=1, seconds=60)
    assert not leases.take("user:1", "b", limit=1, seconds=60)


def test_a_holder_that_stops_renewing_loses_its_place_when_the_lease_runs_out(leases: Leases) -> None:
    assert leases.take("pool", "crashed", limit=1, seconds=0.2)
    assert leases.take("pool", "working", limit=2, seconds=60)
    time.sleep(0.3)

    assert leases.holders("pool") == {"working"}
    assert not leases.renew("pool", "crashed", seconds=60)
    assert leases.take("pool", "next", limit=2, seconds=60)
    assert leases.holders("pool") == {"working", "next"}


def test_renewing_keeps_a_place_past_its_first_lease(leases: Leases) -> None:
    assert leases.take("pool", "a", limit=1, seconds=0.3)

    assert leases.renew("pool", "a", seconds=60)
    time.sleep(0.4)

    assert leases.holders("pool") == {"a"}
    assert not leases.take("pool", "b", limit=1, seconds=60)


def test_two_processes_share_one_pool_through_redis(redis_leases: Callable[[], RedisLeases]) -> None:
    web, worker = redis_leases(), redis_leases()
    assert web.take("pool", "export", limit=1, seconds=60)

    assert not worker.take("pool", "other", limit=1, seconds=60)
    assert worker.holders("pool") == {"export"}

    worker.give_back("pool", "export")

    assert web.take("pool", "other", limit=1, seconds=60)


def test_redis_out_of_reach_is_a_clear_error() -> None:
    # A port nobody listens on: the connection is refused at once.
    leases = RedisLeases("redis://127.0.0.1:1/0", timeout=0.5)

    with pytest.raises(LeasesUnavailable):
        leases.take("pool", "a", limit=1, seconds=60)
