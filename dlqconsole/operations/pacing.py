"""Pacing a run's publishes by the shared rate limiter, per destination."""

from __future__ import annotations

import time
from collections import defaultdict, deque

from dlqconsole.core.ratelimit import Rate, RateLimiter

# The rate limiter hands out the tokens due within this many seconds in one round trip. Tokens left over at the end
# of a batch carry over to the next, so a pause between batches shorter than this costs no rate; at the end of an
# operation they are wasted (a quarter of a second of its rate at most).
RESERVE_HORIZON = 0.25
RESERVE_AT_MOST = 1000


class Pacer:
    """Spaces publishes per destination by the shared rate limiter, reserving the tokens due shortly at once and
    spending them at their due times (kept as monotonic-clock deadlines)."""

    def __init__(self, limiter: RateLimiter, rate: Rate) -> None:
        self.limiter = limiter
        self.rate = rate
        self.tokens: dict[str, deque[float]] = defaultdict(deque)

    def delay_for(self, key: str) -> float:
        # Tokens that fell due during a pause are spent at once. They are few: at most what was reserved ahead,
        # a horizon's worth when the pause began and another primed at its start.
        tokens = self.tokens[key]
        if not tokens:
            wait = self._reserve(key)
            if wait:
                return wait
        delay = tokens[0] - time.monotonic()
        if delay > 0.0005:
            return delay
        tokens.popleft()
        return 0.0

    def prime(self, keys: set[str]) -> None:
        """Reserve ahead for these destinations now, between batches: the tokens falling due while the next batch
        is taken are spent as soon as it is ready, instead of the rate dropping for the length of the gap."""
        for key in keys:
            tokens = self.tokens[key]
            if not tokens or tokens[-1] < time.monotonic() + RESERVE_HORIZON:
                self._reserve(key)

    def _reserve(self, key: str) -> float:
        """Add the tokens due within the horizon; when none is, the seconds until asking again is worth it."""
        grant = self.limiter.reserve(key, self.rate, RESERVE_AT_MOST, horizon=RESERVE_HORIZON)
        if grant.count == 0:
            return max(0.001, grant.at + grant.due(0) - RESERVE_HORIZON - time.monotonic())
        self.tokens[key].extend(grant.at + grant.due(index) for index in range(grant.count))
        return 0.0
