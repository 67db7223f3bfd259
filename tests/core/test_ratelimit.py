"""The rate limiter: parsing, the bucket arithmetic (with an explicit clock), sharing a key, rate changes.

Schedules are asserted on the due times the limiter computes, never on how long anything took.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import pytest
import redis
from pytest_django import Settings

from dlqconsole.core import ratelimit
from dlqconsole.core.ratelimit import (
    UNBOUNDED,
    LocalRateLimiter,
    Rate,
    RateLimiter,
    RateLimiterUnavailable,
    RateLimitTimeout,
    RedisRateLimiter,
    get_rate_limiter,
    parse_rate,
    scoped_key,
)

T = 1_000.0  # an explicit clock reading for the arithmetic tests


@pytest.mark.parametrize(
    ("text", "count", "period", "burst", "interval"),
    [
        ("10/60s", 10, 60.0, 1, 6.0),
        ("5/1m", 5, 60.0, 1, 12.0),
        ("4000/3h:50", 4000, 10_800.0, 50, 2.7),
        ("200/1s", 200, 1.0, 1, 0.005),
        ("200/s", 200, 1.0, 1, 0.005),
        (" 50 / 1S ", 50, 1.0, 1, 0.02),
    ],
)
def test_parse_rate_reads_count_period_and_burst(
    text: str, count: int, period: float, burst: int, interval: float
) -> None:
    rate = parse_rate(text)
    assert (rate.count, rate.period, rate.burst) == (count, period, burst)
    assert rate.interval == pytest.approx(interval)


@pytest.mark.parametrize("text", ["10/60s", "5/1m", "4000/3h:50", "200/1s", "200/s", "1/24h:3"])
def test_rate_text_round_trips(text: str) -> None:
    rate = parse_rate(text)
    assert parse_rate(str(rate)) == rate


def test_rate_text_names_the_burst_only_when_there_is_one() -> None:
    assert str(parse_rate("4000/3h:50")) == "4000/3h:50"
    assert str(parse_rate("200/s:1")) == "200/1s"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0/1s", "the count must be at least 1, not 0"),
        ("-5/1s", "the count must be at least 1, not -5"),
        ("5/0s", "the period must be at least 1, not 0"),
        ("5/1s:0", "the burst must be at least 1, not 0"),
        ("5/1d", "unknown unit 'd'; use s, m or h"),
        ("5/60", "must be a number and a unit"),
        ("five/1s", "the count must be a whole number, not 'five'"),
        ("1.5/1s", "the count must be a whole number"),
        ("5/1s:2:3", "the burst must be a whole number, not '2:3'"),
        ("50", "has no '/'"),
        ("", "has no '/'"),
        ("2000000/1h", "the count must be between 1 and 1,000,000"),
        ("1/48h", "the period must be at most 24h"),
        ("200000/1s", "more than 100,000 per second"),
        ("1/1s:9999999", "the burst must be between 1 and 1,000,000"),
        ("99999999999999999999/1s", "the count 99999999999999999999 is absurdly large"),
        ("0000000000000000000000000000001/1s", "is longer than 32 characters"),
    ],
)
def test_parse_rate_rejects_bad_input_with_a_clear_message(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        parse_rate(text)


def test_rate_built_directly_is_validated() -> None:
    with pytest.raises(ValueError, match="unknown unit 'd'"):
        Rate(count=5, amount=1, unit="d")
    with pytest.raises(ValueError, match="count must be between"):
        Rate(count=0, amount=1, unit="s")


def test_smooth_rate_spaces_tokens_evenly(limiter: RateLimiter) -> None:
    rate = parse_rate("200/1s")
    assert limiter.try_acquire("orders", rate, now=T) == 0.0
    assert limiter.try_acquire("orders", rate, now=T) == pytest.approx(0.005)
    assert limiter.try_acquire("orders", rate, now=T + 0.004) == pytest.approx(0.001)
    assert limiter.try_acquire("orders", rate, now=T + 0.005) == 0.0
    assert limiter.try_acquire("orders", rate, now=T + 0.0051) == pytest.approx(0.0049)


def test_reserve_grants_the_tokens_due_within_the_horizon_evenly_spaced(limiter: RateLimiter) -> None:
    rate = parse_rate("200/1s")
    grant = limiter.reserve("orders", rate, 50, horizon=0.1, now=T)
    assert grant.count == 21  # due at 0, 5 ms, ..., 100 ms
    assert [grant.due(index) for index in range(21)] == pytest.approx([index * 0.005 for index in range(21)])
    assert grant.next_due == pytest.approx(0.105)

    none_yet = limiter.reserve("orders", rate, 50, horizon=0.1, now=T)
    assert none_yet.count == 0
    assert none_yet.due(0) == pytest.approx(0.105)

    later = limiter.reserve("orders", rate, 50, horizon=0.1, now=T + 0.1)
    assert later.count == 20
    assert later.due(0) == pytest.approx(0.005)
    assert later.due(19) == pytest.approx(0.1)


def test_windowed_publisher_at_5000_per_second_needs_one_call_per_window(limiter: RateLimiter) -> None:
    rate = parse_rate("5000/1s")
    now = T
    schedule: list[float] = []
    calls = 0
    while len(schedule) < 5000:
        grant = limiter.reserve("orders", rate, 500, horizon=0.1, now=now)
        calls += 1
        schedule += [grant.clock + grant.due(index) for index in range(grant.count)]
        # The publisher asks again once it has published the last token of the window.
        now = grant.clock + grant.due(grant.count - 1)
    assert calls == 10
    gaps = [later - earlier for earlier, later in zip(schedule, schedule[1:], strict=False)]
    assert min(gaps) == pytest.approx(0.0002)
    assert max(gaps) == pytest.approx(0.0002)
    assert schedule[-1] - schedule[0] == pytest.approx(4999 * 0.0002)


def test_burst_is_granted_at_once_then_evenly_spaced_and_refills_when_idle(limiter: RateLimiter) -> None:
    rate = parse_rate("4000/3h:50")
    grant = limiter.reserve("orders", rate, 100, now=T)
    assert grant.count == 50
    assert grant.due(49) == pytest.approx(0.0, abs=1e-9)
    assert limiter.try_acquire("orders", rate, now=T) == pytest.approx(2.7)
    assert limiter.try_acquire("orders", rate, now=T + 2.7) == 0.0
    assert limiter.reserve("orders", rate, 100, now=T + 2.7).count == 0
    # Refilled: 51 tokens were taken, 51 intervals later the whole burst is back.
    assert limiter.reserve("orders", rate, 100, now=T + 51 * 2.7).count == 50


def test_whole_request_takes_all_tokens_or_none(limiter: RateLimiter) -> None:
    rate = parse_rate("10/1s:5")
    assert limiter.try_acquire("orders", rate, 3, now=T) == 0.0
    # Two are left; three more are 100 ms away, and the refused request took nothing.
    assert limiter.try_acquire("orders", rate, 3, now=T) == pytest.approx(0.1)
    assert limiter.try_acquire("orders", rate, 2, now=T) == 0.0
    assert limiter.try_acquire("orders", rate, 1, now=T) == pytest.approx(0.1)


def test_try_acquire_refuses_more_tokens_than_the_burst(limiter: RateLimiter) -> None:
    with pytest.raises(ValueError, match="the burst is 1"):
        limiter.try_acquire("orders", parse_rate("10/1s"), 2)


def test_speeding_up_takes_effect_at_once(limiter: RateLimiter) -> None:
    slow, fast = parse_rate("1/1h"), parse_rate("200/1s")
    assert limiter.try_acquire("orders", slow, now=T) == 0.0
    assert limiter.try_acquire("orders", slow, now=T + 1) == pytest.approx(3599)
    assert limiter.try_acquire("orders", fast, now=T + 1) == 0.0
    assert limiter.try_acquire("orders", fast, now=T + 1) == pytest.approx(0.005)


def test_slowing_down_takes_effect_after_the_tokens_already_granted(limiter: RateLimiter) -> None:
    fast, slow = parse_rate("200/1s"), parse_rate("1/1m")
    assert limiter.reserve("orders", fast, 10, horizon=0.1, now=T).count == 10  # due until T + 45 ms
    assert limiter.try_acquire("orders", slow, now=T) == pytest.approx(0.05)
    assert limiter.try_acquire("orders", slow, now=T + 0.05) == 0.0
    assert limiter.try_acquire("orders", slow, now=T + 0.06) == pytest.approx(59.99)


def test_burst_of_a_faster_rate_is_earned_again_after_a_speed_up(limiter: RateLimiter) -> None:
    slow, fast = parse_rate("1/1h"), parse_rate("100/1s:10")
    assert limiter.try_acquire("orders", slow, now=T) == 0.0
    # The next token is one new interval after the latest; the burst is earned again at the new rate.
    assert limiter.reserve("orders", fast, 20, now=T).due(0) == pytest.approx(0.01)
    assert limiter.reserve("orders", fast, 20, now=T + 1).count == 10


@pytest.mark.parametrize("kind", ["redis", "local"])
def test_the_same_queue_on_two_brokers_has_two_buckets(
    kind: str, redis_limiter: Callable[[], RedisRateLimiter]
) -> None:
    """`orders` on the broker default and on staging (two vhosts) are two destinations: spending one's tokens leaves
    the other's whole. The broker default keeps the key it had before brokers existed."""
    limiter = redis_limiter() if kind == "redis" else LocalRateLimiter()
    rate = parse_rate("1/1h")
    on_default, on_staging = scoped_key("queue:orders"), scoped_key("queue:orders", broker="staging")

    assert (on_default, on_staging) == ("queue:orders", "broker:staging:queue:orders")
    assert limiter.try_acquire(on_default, rate, now=T) == 0.0
    assert limiter.try_acquire(on_staging, rate, now=T) == 0.0
    assert limiter.try_acquire(on_staging, rate, now=T) == pytest.approx(3600.0)
    assert limiter.try_acquire(on_default, rate, now=T) == pytest.approx(3600.0)
    # No broker name can make a key of another broker's, nor of default's.
    assert scoped_key("queue:x", broker="a") != scoped_key("queue:x", broker="a.b")
    assert not scoped_key("queue:x", broker="a").startswith(("queue:", "exchange:"))


@pytest.mark.parametrize("kind", ["redis", "local"])
def test_consumers_sharing_a_key_share_its_limit(kind: str, redis_limiter: Callable[[], RedisRateLimiter]) -> None:
    """Two consumers (two Redis connections, or two threads on one local bucket) asking for 200 tokens each at the
    same instant get 400 distinct slots 5 ms apart: together they span 2 s, as one consumer would."""
    rate = parse_rate("200/1s")
    local = LocalRateLimiter()
    limiters = [redis_limiter(), redis_limiter()] if kind == "redis" else [local, local]
    schedules: list[list[float]] = [[], []]

    def consume(limiter: RateLimiter, schedule: list[float]) -> None:
        for _ in range(200):
            grant = limiter.reserve("orders", rate, 1, horizon=UNBOUNDED, now=T)
            schedule.append(grant.clock + grant.due(0))

    threads = [threading.Thread(target=consume, args=pair) for pair in zip(limiters, schedules, strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    merged = sorted(schedules[0] + schedules[1])
    assert len(schedules[0]) == len(schedules[1]) == 200
    assert merged == pytest.approx([T + index * 0.005 for index in range(400)], abs=1e-6)


def reserve_on_server_time(url: str, prefix: str, count: int) -> list[float]:
    """Run in a separate process: reserve `count` tokens at 200/1s one by one, return when each is due."""
    limiter = RedisRateLimiter(url, prefix=prefix)
    rate = parse_rate("200/1s")
    dues = []
    for _ in range(count):
        grant = limiter.reserve("orders", rate, 1, horizon=UNBOUNDED)
        dues.append(grant.clock + grant.due(0))
    return dues


def test_processes_sharing_a_key_share_its_limit_on_redis_server_time(
    redis_limiter: Callable[[], RedisRateLimiter], redis_url: str
) -> None:
    prefix = redis_limiter().prefix
    with ProcessPoolExecutor(max_workers=2, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(reserve_on_server_time, redis_url, prefix, 200) for _ in range(2)]
        merged = sorted(futures[0].result() + futures[1].result())
    gaps = [later - earlier for earlier, later in zip(merged, merged[1:], strict=False)]
    assert len(merged) == 400
    # No two of the 400 slots, whichever process took them, fall closer than one token interval (5 ms): they are
    # one bucket's. How far apart the slots spread depends on when each process ran, so only the floor is checked.
    assert min(gaps) >= 0.005 - 1e-6
    assert merged[-1] - merged[0] >= 399 * 0.005 - 1e-6


def test_lua_script_and_python_arithmetic_agree(redis_limiter: Callable[[], RedisRateLimiter]) -> None:
    shared, local = redis_limiter(), LocalRateLimiter()
    rates = [parse_rate(text) for text in ("200/1s", "5000/1s", "10/1s:5", "1/1m", "4000/3h:50", "3/7s:2")]
    chooser = random.Random(4)
    now = T
    for _ in range(400):
        now += chooser.choice([0.0, 0.0001, 0.003, 0.05, 1.0])
        rate = chooser.choice(rates)
        wanted = chooser.randint(1, 60)
        horizon = chooser.choice([0.0, 0.01, 0.1, 5.0])
        if chooser.random() < 0.3:
            tokens = min(wanted, rate.burst)
            waits = [limiter.try_acquire("orders", rate, tokens, now=now) for limiter in (shared, local)]
            assert waits[0] == pytest.approx(waits[1], abs=1e-9)
        else:
            grants = [limiter.reserve("orders", rate, wanted, horizon=horizon, now=now) for limiter in (shared, local)]
            assert grants[0].count == grants[1].count
            assert grants[0].start == pytest.approx(grants[1].start, abs=1e-9)


def test_acquire_waits_for_its_turn_and_returns_the_wait(limiter: RateLimiter) -> None:
    rate = parse_rate("20/1s")
    assert limiter.acquire("orders", rate) == 0.0
    assert 0.0 < limiter.acquire("orders", rate) <= 0.05


def test_acquire_more_tokens_than_the_burst_waits_for_the_last(limiter: RateLimiter) -> None:
    assert limiter.acquire("orders", parse_rate("200/1s"), 3) == pytest.approx(0.01)


def test_acquire_beyond_max_wait_takes_nothing(limiter: RateLimiter) -> None:
    rate = parse_rate("1/1m")
    assert limiter.acquire("orders", rate) == 0.0
    with pytest.raises(RateLimitTimeout) as refused:
        limiter.acquire("orders", rate, max_wait=0.01)
    assert 59 < refused.value.wait <= 60
    assert 59 < limiter.try_acquire("orders", rate) <= 60


def test_bucket_state_expires_from_redis_when_idle(
    redis_limiter: Callable[[], RedisRateLimiter], redis_url: str
) -> None:
    limiter = redis_limiter()
    limiter.acquire("slow", parse_rate("1/1m"))
    limiter.acquire("fast", parse_rate("200/1s"))
    client = redis.Redis.from_url(redis_url)
    # Kept as long as the bucket is not full again (plus a second), then gone; the script rounds the wait up to
    # the next millisecond, and 0.005 s in floating point can round up to 6 ms.
    assert 60_000 < client.pttl(limiter.prefix + "slow") <= 61_001
    assert 0 < client.pttl(limiter.prefix + "fast") <= 1_006
    client.close()


def test_script_unknown_to_the_server_is_loaded_on_first_use(redis_limiter: Callable[[], RedisRateLimiter]) -> None:
    limiter = redis_limiter()
    limiter.script = limiter.client.register_script(ratelimit.TAKE_SCRIPT + f"-- {limiter.prefix}\n")
    assert limiter.client.script_exists(limiter.script.sha) == [False]
    assert limiter.try_acquire("orders", parse_rate("1/1s")) == 0.0
    assert limiter.client.script_exists(limiter.script.sha) == [True]


def test_unreachable_redis_raises_rate_limiter_unavailable() -> None:
    limiter = RedisRateLimiter("redis://127.0.0.1:1/0", timeout=1.0)
    rate = parse_rate("1/1s")
    with pytest.raises(RateLimiterUnavailable, match="rate limiter unavailable"):
        limiter.acquire("orders", rate)
    with pytest.raises(RateLimiterUnavailable):
        limiter.reserve("orders", rate, 10, horizon=0.1)


def test_local_limiter_drops_idle_buckets() -> None:
    limiter = LocalRateLimiter()
    limiter.PRUNE_ABOVE = 3
    rate = parse_rate("1/1s")
    for name in "abcd":
        limiter.try_acquire(name, rate, now=T)
    limiter.try_acquire("e", rate, now=T + 10)
    assert list(limiter.buckets) == ["e"]


def test_get_rate_limiter_shares_redis_when_configured_else_stays_in_process(
    settings: Settings, redis_url: str
) -> None:
    settings.REDIS_URL = redis_url
    shared = get_rate_limiter()
    assert isinstance(shared, RedisRateLimiter)
    assert get_rate_limiter() is shared
    settings.REDIS_URL = ""
    assert isinstance(get_rate_limiter(), LocalRateLimiter)
    assert get_rate_limiter() is get_rate_limiter()
