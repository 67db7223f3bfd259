"""Rate limits for replays: `N/period[:burst]` token buckets, shared by every worker through Redis.

The bucket is a GCRA (generic cell rate algorithm), the token bucket written as a single time: `tat`, when the
next token would be due if no burst were allowed. With an interval `I` (period / N) and a burst tolerance
`(burst - 1) * I`, token `i` of a request is due at `tat - tolerance + i * I`, never before now; granting `k`
tokens moves `tat` on by `k * I`. An idle bucket needs no state, so the Redis key simply expires.

A request may reserve tokens that fall due within a `horizon` (say 0.1 s) in one round trip and then pace them
locally: at 5000/s that is 500 messages per round trip, at 200/s 20 messages spaced 5 ms apart, so a windowed
publisher stays smooth without calling Redis per message. Reserved tokens are spent even if the caller does not
use them, so a short horizon wastes little when an operation is paused or cancelled.

Every call carries the caller's rate, so an operator's change of rate applies to the next request. The bucket
also remembers when its latest token was due (`last`) and never lets the next one fall due later than one new
interval (plus the new burst) after it: without that, a speed-up from 1/1h would first wait out the old hour.
While the rate is unchanged this bound never binds.

Time comes from the Redis server (TIME inside the script), so the clocks of the workers' hosts do not matter.
Without REDIS_URL, `LocalRateLimiter` does the same arithmetic in process.
"""

from __future__ import annotations

import functools
import math
import re
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600}
MAX_COUNT = 1_000_000
MAX_BURST = 1_000_000
MAX_PERIOD_SECONDS = 24 * 3600
# Faster than this a limit means nothing here (the replayer publishes a few thousand messages a second); a caller
# that wants no limit passes no rate at all.
MAX_PER_SECOND = 100_000
# The longest rate written out (operations and retry policies store it in 32 characters).
MAX_RATE_TEXT = 32
RATE_FORMAT = "N/period[:burst] with a unit s, m or h, e.g. 50/1s, 10/60s or 4000/3h:50"
DEFAULT_PREFIX = "dlq:rate:"
# A horizon long enough to mean "whatever it takes" without handing Lua an infinity.
UNBOUNDED = 1e9
# Floating-point slack when counting how many intervals fit in a span, so a token due exactly at the horizon
# is not refused for a rounding error.
EPSILON = 1e-9


@dataclass(frozen=True)
class Rate:
    """`count` tokens per `amount` `unit`s, of which up to `burst` may be taken at once (1: evenly spaced)."""

    count: int
    amount: int
    unit: str
    burst: int = 1

    def __post_init__(self) -> None:
        if self.unit not in UNIT_SECONDS:
            raise ValueError(f"rate {self}: unknown unit {self.unit!r}; use s, m or h")
        if not 1 <= self.count <= MAX_COUNT:
            raise ValueError(f"rate {self}: the count must be between 1 and {MAX_COUNT:,}")
        if self.amount < 1:
            raise ValueError(f"rate {self}: the period must be at least 1{self.unit}")
        if self.period > MAX_PERIOD_SECONDS:
            raise ValueError(f"rate {self}: the period must be at most 24h")
        if not 1 <= self.burst <= MAX_BURST:
            raise ValueError(f"rate {self}: the burst must be between 1 and {MAX_BURST:,}")
        if self.per_second > MAX_PER_SECOND:
            raise ValueError(f"rate {self}: more than {MAX_PER_SECOND:,} per second; leave the rate empty for no limit")

    def __str__(self) -> str:
        burst = f":{self.burst}" if self.burst != 1 else ""
        return f"{self.count}/{self.amount}{self.unit}{burst}"

    @property
    def period(self) -> float:
        """The period in seconds."""
        return float(self.amount * UNIT_SECONDS.get(self.unit, 1))

    @property
    def per_second(self) -> float:
        return self.count / self.period

    @property
    def interval(self) -> float:
        """Seconds between two tokens once the burst is spent."""
        return self.period / self.count

    @property
    def tolerance(self) -> float:
        """How far ahead of the even spacing a burst may run, in seconds."""
        return (self.burst - 1) * self.interval


def parse_rate(text: str) -> Rate:
    """Parse `N/period[:burst]` (`10/60s`, `5/1m`, `4000/3h:50`, `200/s`); raise ValueError saying what is wrong."""
    cleaned = text.strip().lower().replace(" ", "")
    if len(cleaned) > MAX_RATE_TEXT:
        raise ValueError(f"rate {text[:40]!r}... is longer than {MAX_RATE_TEXT} characters: write {RATE_FORMAT}")
    count_text, slash, rest = cleaned.partition("/")
    if not slash:
        raise ValueError(f"rate {text!r} has no '/': write {RATE_FORMAT}")
    period_text, colon, burst_text = rest.partition(":")
    period = re.fullmatch(r"([0-9]*)([a-z]+)", period_text)
    if period is None:
        raise ValueError(f"rate {text!r}: the period {period_text!r} must be a number and a unit, e.g. 1s or 60s")
    amount_text, unit = period.groups()
    if unit not in UNIT_SECONDS:
        raise ValueError(f"rate {text!r}: unknown unit {unit!r}; use s, m or h")
    return Rate(
        count=_whole(count_text, "count", text),
        amount=_whole(amount_text or "1", "period", text),
        unit=unit,
        burst=_whole(burst_text, "burst", text) if colon else 1,
    )


def _whole(value: str, name: str, text: str) -> int:
    if not re.fullmatch(r"[+-]?[0-9]+", value):
        raise ValueError(f"rate {text!r}: the {name} must be a whole number, not {value!r}")
    if len(value) > 12:
        raise ValueError(f"rate {text!r}: the {name} {value} is absurdly large")
    number = int(value)
    if number < 1:
        raise ValueError(f"rate {text!r}: the {name} must be at least 1, not {number}")
    return number


class RateLimiterUnavailable(Exception):
    """The shared bucket cannot be reached (Redis is down or refuses writes): pause and try again later."""


class RateLimitTimeout(Exception):
    """The tokens would not be due within `max_wait`; nothing was taken. `wait` says how long they would take."""

    def __init__(self, message: str, *, wait: float) -> None:
        super().__init__(message)
        self.wait = wait


@dataclass(frozen=True)
class Grant:
    """The answer to `reserve`: `count` tokens, token `i` due `due(i)` seconds after the grant.

    `clock` is the limiter's clock at the grant (Redis server time, or time.monotonic() in process) and `at` is
    time.monotonic() when the answer arrived, which is what `sleep_until` measures from. When `count` is 0,
    `due(0)` says when the next token falls due.
    """

    count: int
    start: float
    interval: float
    clock: float
    at: float

    def due(self, index: int) -> float:
        # Tokens inside a burst were due already: start is negative for them.
        return max(0.0, self.start + index * self.interval)

    @property
    def next_due(self) -> float:
        """Seconds from the grant until the first token after this grant falls due."""
        return self.due(self.count)

    def sleep_until(self, index: int) -> float:
        """Sleep until token `index` is due; return the seconds slept (0 when it is due already)."""
        delay = self.at + self.due(index) - time.monotonic()
        if delay <= 0:
            return 0.0
        time.sleep(delay)
        return delay


class RateLimiter(ABC):
    """Token buckets keyed by destination (a queue name, scoped by its broker: `scoped_key`); the Redis and
    in-process buckets share this API."""

    def reserve(
        self, key: str, rate: Rate, wanted: int = 1, *, horizon: float = 0.0, now: float | None = None
    ) -> Grant:
        """Take as many of `wanted` tokens as fall due within `horizon` seconds (possibly none); never blocks.

        The tokens are taken at once, with the times they may be used: pace them with `Grant.sleep_until`. When
        none is granted, the next falls due within the horizon after `grant.due(0) - horizon` seconds.
        `now` replaces the limiter's clock (tests only).
        """
        count, start, clock = self._take(key, rate, _positive(wanted), _horizon(horizon), whole=False, now=now)
        return Grant(count=count, start=start, interval=rate.interval, clock=clock, at=time.monotonic())

    def try_acquire(self, key: str, rate: Rate, tokens: int = 1, *, now: float | None = None) -> float:
        """Take `tokens` if they are all available now and return 0.0; else take none and return the seconds until
        they would be. `tokens` may not exceed the burst (use `acquire`)."""
        if _positive(tokens) > rate.burst:
            raise ValueError(f"cannot take {tokens} tokens at once with rate {rate}: the burst is {rate.burst}")
        count, start, _ = self._take(key, rate, tokens, 0.0, whole=True, now=now)
        return 0.0 if count else max(0.0, start + (tokens - 1) * rate.interval)

    def acquire(self, key: str, rate: Rate, tokens: int = 1, *, max_wait: float | None = None) -> float:
        """Block until `tokens` are granted and return the seconds waited.

        The tokens are reserved at once (first come, first served) and then waited for. If they would not all be
        due within `max_wait` seconds, nothing is taken and RateLimitTimeout is raised.
        """
        horizon = UNBOUNDED if max_wait is None else _horizon(max_wait)
        count, start, _ = self._take(key, rate, _positive(tokens), horizon, whole=True, now=None)
        wait = max(0.0, start + (tokens - 1) * rate.interval)
        if not count:
            raise RateLimitTimeout(f"{tokens} token(s) of {key} at {rate} are {wait:.3f}s away", wait=wait)
        if wait > 0:
            time.sleep(wait)
        return wait

    @abstractmethod
    def _take(
        self, key: str, rate: Rate, wanted: int, horizon: float, *, whole: bool, now: float | None
    ) -> tuple[int, float, float]:
        """Grant up to `wanted` tokens due within `horizon` (all or none when `whole`): (granted, start, clock)."""


def _positive(tokens: int) -> int:
    if not 1 <= tokens <= MAX_COUNT:
        raise ValueError(f"the number of tokens must be between 1 and {MAX_COUNT:,}, not {tokens}")
    return tokens


def _horizon(seconds: float) -> float:
    if not 0 <= seconds <= UNBOUNDED:
        raise ValueError(f"a wait must be between 0 and {UNBOUNDED:g} seconds, not {seconds}")
    return float(seconds)


def advance(
    state: tuple[float, float] | None, *, now: float, rate: Rate, wanted: int, horizon: float, whole: bool
) -> tuple[int, float, tuple[float, float]]:
    """The bucket arithmetic, identical to TAKE_SCRIPT: (granted, start, new (tat, last))."""
    tat, last = state if state is not None else (now, now)
    tat = max(min(tat, last + rate.interval + rate.tolerance), now)
    start = tat - rate.tolerance - now
    granted = min(wanted, max(0, math.floor((horizon - start) / rate.interval + EPSILON) + 1))
    if whole and granted < wanted:
        granted = 0
    if granted:
        last = max(now, now + start + (granted - 1) * rate.interval)
        tat += granted * rate.interval
    return granted, start, (tat, last)


# KEYS[1] the bucket; ARGV interval, tolerance, wanted, horizon, whole ("1" or "0"), now ("" for server time).
# Numbers travel as text formatted with %.17g so that no precision is lost between calls.
TAKE_SCRIPT = """
local interval = tonumber(ARGV[1])
local tolerance = tonumber(ARGV[2])
local wanted = tonumber(ARGV[3])
local horizon = tonumber(ARGV[4])
local now = tonumber(ARGV[6])
if not now then
  local time = redis.call('TIME')
  now = tonumber(time[1]) + tonumber(time[2]) / 1000000
end
local state = redis.call('HMGET', KEYS[1], 'tat', 'last')
local tat = tonumber(state[1]) or now
local last = tonumber(state[2]) or now
tat = math.max(math.min(tat, last + interval + tolerance), now)
local start = tat - tolerance - now
local granted = math.min(wanted, math.max(0, math.floor((horizon - start) / interval + 1e-9) + 1))
if ARGV[5] == '1' and granted < wanted then
  granted = 0
end
if granted > 0 then
  last = math.max(now, now + start + (granted - 1) * interval)
  tat = tat + granted * interval
  redis.call('HSET', KEYS[1], 'tat', string.format('%.17g', tat), 'last', string.format('%.17g', last))
  redis.call('PEXPIRE', KEYS[1], math.ceil((tat - now) * 1000) + 1000)
end
return {granted, string.format('%.17g', start), string.format('%.17g', now)}
"""

# Errors that mean "Redis cannot serve us right now", as opposed to a bug in the script.
UNAVAILABLE_ERRORS = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.OutOfMemoryError,
)


def redis_client(url: str, *, timeout: float = 5.0) -> redis.Redis:
    """A client for the state every worker shares in Redis (rate limits, leases, circuit breakers). One quick retry
    covers a dropped connection; a Redis that is down fails fast, so that the caller can pause or fail open."""
    return redis.Redis.from_url(
        url,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(ExponentialBackoff(cap=1.0, base=0.1), 1),
    )


class RedisRateLimiter(RateLimiter):
    """Buckets in Redis under `prefix + key`, shared by every process that uses the same Redis."""

    def __init__(self, url: str, *, prefix: str = DEFAULT_PREFIX, timeout: float = 5.0) -> None:
        self.prefix = prefix
        self.client = redis_client(url, timeout=timeout)
        # redis-py sends EVALSHA and loads the script again if the server answers NOSCRIPT (after a restart).
        self.script = self.client.register_script(TAKE_SCRIPT)

    def _take(
        self, key: str, rate: Rate, wanted: int, horizon: float, *, whole: bool, now: float | None
    ) -> tuple[int, float, float]:
        arguments = [repr(rate.interval), repr(rate.tolerance), str(wanted), repr(horizon), "1" if whole else "0"]
        arguments.append("" if now is None else repr(float(now)))
        try:
            granted, start, clock = self.script(keys=[self.prefix + key], args=arguments)
        except UNAVAILABLE_ERRORS as error:
            raise RateLimiterUnavailable(f"rate limiter unavailable: {error}") from error
        return int(granted), float(start), float(clock)


class LocalRateLimiter(RateLimiter):
    """Buckets in this process only (thread-safe): for a single worker when REDIS_URL is unset."""

    # Above this many buckets, idle ones (whose state has expired) are dropped on the next call.
    PRUNE_ABOVE = 1000

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.buckets: dict[str, tuple[float, float]] = {}

    def _take(
        self, key: str, rate: Rate, wanted: int, horizon: float, *, whole: bool, now: float | None
    ) -> tuple[int, float, float]:
        with self.lock:
            clock = time.monotonic() if now is None else float(now)
            granted, start, state = advance(
                self.buckets.get(key), now=clock, rate=rate, wanted=wanted, horizon=horizon, whole=whole
            )
            if granted:
                self.buckets[key] = state
            if len(self.buckets) > self.PRUNE_ABOVE:
                self.buckets = {name: kept for name, kept in self.buckets.items() if kept[0] > clock}
        return granted, start, clock


def scoped_key(key: str, *, broker: str = "") -> str:
    """The bucket of destination `key` on `broker`: `key` itself on the broker default (given as ""), so a console
    with one broker keeps the buckets it always had; `broker:<name>:<key>` on any other, so that `queue:orders` on
    two vhosts are two buckets. A broker's name holds no colon, and no destination key starts with "broker:", so
    the keys of two brokers never meet."""
    return f"broker:{broker}:{key}" if broker else key


def exchange_key(exchange: str, routing_key: str) -> str:
    """The destination key of an exchange and routing key: `exchange:<exchange>/<routing key>`, with "%" and "/" in
    the exchange written %25 and %2F, so that the first "/" is the separator and exchange "a/b" with key "c" is not
    exchange "a" with key "b/c"."""
    escaped = exchange.replace("%", "%25").replace("/", "%2F")
    return f"exchange:{escaped}/{routing_key}"


def exchange_of_key(text: str) -> tuple[str, str]:
    """(exchange, routing key) of what follows "exchange:" in a key made by `exchange_key`."""
    escaped, _, routing_key = text.partition("/")
    return escaped.replace("%2F", "/").replace("%25", "%"), routing_key


def get_rate_limiter() -> RateLimiter:
    """The process's limiter: shared through settings.REDIS_URL, or in process when it is unset."""
    from django.conf import settings

    return _limiter_for(settings.REDIS_URL)


@functools.cache
def _limiter_for(url: str) -> RateLimiter:
    return RedisRateLimiter(url) if url else LocalRateLimiter()
