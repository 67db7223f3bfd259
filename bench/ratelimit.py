"""Benchmark of the rate limiter on the real Redis.

1. Accuracy: 2,000 acquisitions at 200/1s should take 10 s (the last token is due 1,999 intervals after the first,
   9.995 s), with one consumer and with two consumer processes sharing the key; once with `acquire` per message
   and once with windowed `reserve` (horizon 0.1 s) paced locally, as the replayer publishes. Also 5000/1s
   windowed, with the number of Redis round trips it took.
2. Overhead: the cost of one acquisition at a rate high enough never to wait, against a bare Redis round trip
   (INCR) in the same run.

    .venv/bin/python bench/ratelimit.py [--url redis://127.0.0.1:6379/5] [--count 2000] [--overhead-count 20000]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from collections.abc import Callable
from multiprocessing import get_context
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dlqconsole.core.ratelimit import LocalRateLimiter, Rate, RedisRateLimiter, parse_rate  # noqa: E402

HORIZON = 0.1


def consume(url: str, prefix: str, rate_text: str, count: int, windowed: bool) -> tuple[float, float, int]:
    """Take `count` tokens one message at a time; return (start, end) wall-clock times and Redis calls made."""
    limiter = RedisRateLimiter(url, prefix=prefix)
    rate = parse_rate(rate_text)
    calls = 0
    start = time.time()
    if windowed:
        left = count
        while left:
            grant = limiter.reserve("bench", rate, min(left, 500), horizon=HORIZON)
            calls += 1
            if not grant.count:
                time.sleep(max(0.0, grant.due(0) - HORIZON))
                continue
            for index in range(grant.count):
                grant.sleep_until(index)  # here the replayer would publish one message
            left -= grant.count
    else:
        for _ in range(count):
            limiter.acquire("bench", rate)
            calls += 1
    return start, time.time(), calls


def accuracy(url: str, rate_text: str, count: int, consumers: int, windowed: bool) -> None:
    prefix = f"bench-ratelimit-{uuid.uuid4().hex[:8]}:"
    share = count // consumers
    with get_context("spawn").Pool(consumers) as pool:
        results = pool.starmap(consume, [(url, prefix, rate_text, share, windowed)] * consumers)
    elapsed = max(end for _, end, _ in results) - min(start for start, _, _ in results)
    calls = sum(made for _, _, made in results)
    rate = parse_rate(rate_text)
    nominal = count / rate.per_second
    ideal = (count - 1) * rate.interval
    mode = "reserve(window, horizon 0.1s)" if windowed else "acquire() per message"
    print(
        f"{rate_text:>8} x {count:>6}, {consumers} consumer(s), {mode:<30} elapsed {elapsed:7.3f} s"
        f"  vs {nominal:g} s: {100 * (elapsed / nominal - 1):+6.2f}%"
        f"  (vs ideal {ideal:.3f} s: {100 * (elapsed / ideal - 1):+6.2f}%)  Redis calls {calls}"
    )


def per_call(function: Callable[[], object], count: int) -> float:
    start = time.perf_counter()
    for _ in range(count):
        function()
    return (time.perf_counter() - start) / count


def overhead(url: str, count: int) -> None:
    prefix = f"bench-ratelimit-{uuid.uuid4().hex[:8]}:"
    limiter = RedisRateLimiter(url, prefix=prefix)
    client = redis.Redis.from_url(url)
    # Fast enough that no acquisition ever waits: what is measured is the limiter's own cost.
    high = Rate(count=100_000, amount=1, unit="s", burst=100_000)
    local = LocalRateLimiter()
    client.incr(prefix + "incr")
    limiter.try_acquire("warm", high)
    incr = per_call(lambda: client.incr(prefix + "incr"), count)
    acquire = per_call(lambda: limiter.acquire("acquire", high), count)
    try_acquire = per_call(lambda: limiter.try_acquire("try", high), count)
    windows = count // 500
    start = time.perf_counter()
    taken = 0
    for _ in range(windows):
        grant = limiter.reserve("window", high, 500, horizon=HORIZON)
        taken += grant.count
        for index in range(grant.count):
            grant.sleep_until(index)
    windowed = (time.perf_counter() - start) / max(taken, 1)
    local_acquire = per_call(lambda: local.acquire("local", high), count)
    print(f"overhead over {count:,} calls (rate {high}, never waits):")
    print(f"  INCR round trip            {incr * 1e6:8.1f} us")
    print(f"  acquire()                  {acquire * 1e6:8.1f} us   {acquire / incr:5.2f} x INCR")
    print(f"  try_acquire()              {try_acquire * 1e6:8.1f} us   {try_acquire / incr:5.2f} x INCR")
    print(
        f"  reserve(500) per token     {windowed * 1e6:8.1f} us   {windowed / incr:5.2f} x INCR"
        f"  (windows of 500 tokens, each checked with sleep_until)"
    )
    print(f"  local acquire()            {local_acquire * 1e6:8.1f} us   {local_acquire / incr:5.2f} x INCR")
    keys = list(client.scan_iter(match=prefix + "*"))
    if keys:
        client.delete(*keys)
    client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/5")
    parser.add_argument("--count", type=int, default=2000, help="acquisitions at 200/1s (default 2000: 10 s)")
    parser.add_argument("--overhead-count", type=int, default=20_000)
    arguments = parser.parse_args()
    redis_server = redis.Redis.from_url(arguments.url).info("server")
    print(f"Redis {redis_server['redis_version']} at {arguments.url}, {os.cpu_count()} CPUs")
    for windowed in (False, True):
        for consumers in (1, 2):
            accuracy(arguments.url, "200/1s", arguments.count, consumers, windowed)
    accuracy(arguments.url, "5000/1s", arguments.count * 5, 1, True)
    accuracy(arguments.url, "5000/1s", arguments.count * 5, 2, True)
    overhead(arguments.url, arguments.overhead_count)


if __name__ == "__main__":
    main()
