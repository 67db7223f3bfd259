"""Leases: at most `limit` holders of a named pool at once, shared by every process through Redis.

A holder takes a lease for a number of seconds and renews it while it works; one that gives it back frees its
place at once, and one that dies (a killed worker, a crashed web process) frees it when the lease runs out, so
nothing holds a place forever. Each pool is a Redis sorted set: member the holder, score the time its lease ends
(the Redis server's clock, so the hosts' clocks do not matter); taking a lease drops the ended ones first, all
in one script, so two processes never both take the last place.

Without REDIS_URL, `LocalLeases` keeps the pools in the process: right for a single process only.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator

import redis

from dlqconsole.core.ratelimit import redis_client

DEFAULT_PREFIX = "dlq:lease:"

# KEYS[1] the pool; ARGV holder, limit, seconds. Returns 1 when the holder has a lease now (taken, or renewed
# because it held one already), 0 when the pool is full.
TAKE_SCRIPT = """
local time = redis.call('TIME')
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000
local ends = now + tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  return 0
end
redis.call('ZADD', KEYS[1], ends, ARGV[1])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], math.ceil(tonumber(last[2]) * 1000) + 1000)
return 1
"""

# KEYS[1] the pool; ARGV holder, seconds. Moves the end of a lease the holder still has; one that ran out stays
# out (its place may have gone to another holder meanwhile).
RENEW_SCRIPT = """
local time = redis.call('TIME')
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  return 0
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], math.ceil(tonumber(last[2]) * 1000) + 1000)
return 1
"""

# KEYS[1] the pool. The holders whose lease has not ended.
HOLDERS_SCRIPT = """
local time = redis.call('TIME')
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000
return redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
"""

UNAVAILABLE_ERRORS = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.OutOfMemoryError,
)


class LeasesUnavailable(Exception):
    """The shared pools cannot be reached (Redis is down or refuses writes)."""


class Leases(ABC):
    @abstractmethod
    def take(self, pool: str, holder: str, *, limit: int, seconds: float) -> bool:
        """A lease in `pool` for `seconds` if fewer than `limit` others hold one (a holder's own lease is renewed);
        False when the pool is full."""

    @abstractmethod
    def renew(self, pool: str, holder: str, *, seconds: float) -> bool:
        """Extend the holder's lease to `seconds` from now; False when it had run out (and is not taken again)."""

    @abstractmethod
    def give_back(self, pool: str, holder: str) -> None:
        """End the holder's lease (nothing happens when it has none)."""

    @abstractmethod
    def holders(self, pool: str) -> set[str]:
        """Who holds a lease in `pool` now."""


class RedisLeases(Leases):
    def __init__(self, url: str, *, prefix: str = DEFAULT_PREFIX, timeout: float = 5.0) -> None:
        self.prefix = prefix
        self.client = redis_client(url, timeout=timeout)
        self.take_script = self.client.register_script(TAKE_SCRIPT)
        self.renew_script = self.client.register_script(RENEW_SCRIPT)
        self.holders_script = self.client.register_script(HOLDERS_SCRIPT)

    def take(self, pool: str, holder: str, *, limit: int, seconds: float) -> bool:
        with _unavailable():
            return bool(self.take_script(keys=[self.prefix + pool], args=[holder, limit, repr(float(seconds))]))

    def renew(self, pool: str, holder: str, *, seconds: float) -> bool:
        with _unavailable():
            return bool(self.renew_script(keys=[self.prefix + pool], args=[holder, repr(float(seconds))]))

    def give_back(self, pool: str, holder: str) -> None:
        with _unavailable():
            self.client.zrem(self.prefix + pool, holder)

    def holders(self, pool: str) -> set[str]:
        with _unavailable():
            found = self.holders_script(keys=[self.prefix + pool])
        return {item.decode() for item in found}


class LocalLeases(Leases):
    """Pools in this process only (thread-safe), for a single process when REDIS_URL is unset."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pools: dict[str, dict[str, float]] = {}

    def take(self, pool: str, holder: str, *, limit: int, seconds: float) -> bool:
        with self.lock:
            held = self._live(pool)
            if holder not in held and len(held) >= limit:
                return False
            held[holder] = time.monotonic() + seconds
            return True

    def renew(self, pool: str, holder: str, *, seconds: float) -> bool:
        with self.lock:
            held = self._live(pool)
            if holder not in held:
                return False
            held[holder] = time.monotonic() + seconds
            return True

    def give_back(self, pool: str, holder: str) -> None:
        with self.lock:
            self.pools.get(pool, {}).pop(holder, None)

    def holders(self, pool: str) -> set[str]:
        with self.lock:
            return set(self._live(pool))

    def _live(self, pool: str) -> dict[str, float]:
        now = time.monotonic()
        held = {holder: ends for holder, ends in self.pools.get(pool, {}).items() if ends > now}
        self.pools[pool] = held
        return held


@contextlib.contextmanager
def _unavailable() -> Iterator[None]:
    try:
        yield
    except UNAVAILABLE_ERRORS as error:
        raise LeasesUnavailable(f"leases unavailable: {error}") from error


def get_leases() -> Leases:
    """The process's pools: shared through settings.REDIS_URL, or in process when it is unset."""
    from django.conf import settings

    return _leases_for(settings.REDIS_URL)


@functools.cache
def _leases_for(url: str) -> Leases:
    return RedisLeases(url) if url else LocalLeases()
