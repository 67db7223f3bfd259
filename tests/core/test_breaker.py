"""The circuit breaker's state machine on the real Redis (and in process), time passed in."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from dlqconsole.core.breaker import (
    BOOMERANG,
    CLOSED,
    CONFIRM,
    HALF_OPEN,
    NACK,
    OPEN,
    RELEASE,
    BreakerConfig,
    Breakers,
    BreakerUnavailable,
    Event,
    LocalBreakers,
    RedisBreakers,
)

T = 1_800_000_000.0
CONFIG = BreakerConfig(failures=5, share=0.5, min_sample=10, cooldown=30, probe=5, watch=60, window=300)


@pytest.fixture(params=["redis", "local"])
def breakers(request: pytest.FixtureRequest, redis_breakers: Callable[[], RedisBreakers]) -> Breakers:
    return redis_breakers() if request.param == "redis" else LocalBreakers()


def events(*kinds: str) -> list[Event]:
    return [Event(kind, reason="nacked by the broker" if kind == NACK else "") for kind in kinds]


def open_breaker(breakers: Breakers, key: str = "queue:orders", *, at: float = T) -> None:
    breakers.record(key, events(*[NACK] * CONFIG.failures), config=CONFIG, now=at)
    assert breakers.peek(key, config=CONFIG, now=at).state == OPEN


def test_refusals_in_a_row_open_the_breaker_and_a_confirm_breaks_the_row(breakers: Breakers) -> None:
    state = breakers.record("queue:orders", events(NACK, NACK, NACK, NACK, CONFIRM, NACK), config=CONFIG, now=T)
    assert (state.state, state.streak) == (CLOSED, 1)
    assert breakers.allow("queue:orders", 10, config=CONFIG, now=T).granted == 10

    state = breakers.record("queue:orders", events(NACK, NACK, NACK, NACK), config=CONFIG, now=T + 1)

    assert state.state == OPEN
    assert state.reason == "5 failures in a row; the last: nacked by the broker"
    assert (state.opened_at, state.probe_at) == (T + 1, T + 31)
    assert breakers.allow("queue:orders", 10, config=CONFIG, now=T + 2).granted == 0
    # Other destinations are not affected.
    assert breakers.allow("queue:payments", 10, config=CONFIG, now=T + 2).granted == 10


def test_a_share_of_failures_over_the_minimum_sample_opens_it(breakers: Breakers) -> None:
    # 4 of 9: under the minimum sample, and then 5 of 10 scattered (never 5 in a row).
    mixed = [CONFIRM, NACK, CONFIRM, NACK, CONFIRM, NACK, CONFIRM, NACK, CONFIRM]
    assert breakers.record("queue:orders", events(*mixed), config=CONFIG, now=T).state == CLOSED

    state = breakers.record("queue:orders", events(NACK), config=CONFIG, now=T)

    assert state.state == OPEN
    assert state.reason.startswith("5 of the last 10 replays failed")


def test_boomerangs_turn_confirmed_replays_into_failures(breakers: Breakers) -> None:
    state = breakers.record("queue:orders", events(*[CONFIRM] * 8), config=CONFIG, now=T)
    assert state.recent == "00000000"

    # Ingest reports without thresholds: those the runs used are kept with the state.
    state = breakers.record("queue:orders", events(BOOMERANG, BOOMERANG, BOOMERANG, BOOMERANG), now=T + 5)
    assert (state.state, state.recent) == (CLOSED, "00001111")

    state = breakers.record("queue:orders", [Event(BOOMERANG, reason="a replay came back (rejected)")], now=T + 6)
    assert state.state == OPEN
    assert state.reason == "5 failures in a row; the last: a replay came back (rejected)"


def test_a_boomerang_before_its_confirm_counts_once(breakers: Breakers) -> None:
    # Ingest was faster than the run's report of the confirms: the boomerangs count as failures already...
    state = breakers.record("queue:orders", events(BOOMERANG, BOOMERANG), config=CONFIG, now=T)
    assert (state.recent, state.owed, state.streak) == ("", 2, 2)

    # ...and the confirms that come next are those failures, not successes beside them.
    state = breakers.record("queue:orders", events(CONFIRM, CONFIRM, CONFIRM), config=CONFIG, now=T + 1)
    assert (state.recent, state.owed, state.streak) == ("110", 0, 0)


def test_a_replay_is_one_outcome_however_its_news_arrive(breakers: Breakers) -> None:
    # Ten replays, all of which came back, half before their confirms were reported: ten failures, not twenty outcomes.
    config = BreakerConfig(failures=100, share=0.5, min_sample=20, cooldown=30, probe=5, watch=60, window=300)
    breakers.record("queue:orders", events(*[BOOMERANG] * 5), config=config, now=T)
    breakers.record("queue:orders", events(*[CONFIRM] * 10), config=config, now=T)

    state = breakers.record("queue:orders", events(*[BOOMERANG] * 5), config=config, now=T)

    assert (state.state, state.recent, state.owed) == (CLOSED, "1" * 10, 0)


def test_recent_outcomes_are_forgotten_after_a_quiet_window(breakers: Breakers) -> None:
    breakers.record("queue:orders", events(NACK, NACK, NACK, NACK), config=CONFIG, now=T)

    state = breakers.record("queue:orders", events(NACK), config=CONFIG, now=T + CONFIG.window + 1)

    assert (state.state, state.recent) == (CLOSED, "1")


def test_after_the_cool_down_a_probe_of_exactly_its_size_goes_out(breakers: Breakers) -> None:
    open_breaker(breakers)
    assert breakers.allow("queue:orders", 3, config=CONFIG, now=T + 29).granted == 0

    first = breakers.allow("queue:orders", 3, config=CONFIG, now=T + 30)
    second = breakers.allow("queue:orders", 3, config=CONFIG, now=T + 31)
    third = breakers.allow("queue:orders", 3, config=CONFIG, now=T + 31)

    assert (first.granted, second.granted, third.granted) == (3, 2, 0)
    assert first.state.state == HALF_OPEN
    assert (third.state.probe_left, third.state.probe_out) == (0, 5)


def test_workers_asking_at_once_share_one_probe(redis_breakers: Callable[[], RedisBreakers]) -> None:
    workers = [redis_breakers() for _ in range(4)]
    open_breaker(workers[0])

    with ThreadPoolExecutor(max_workers=8) as pool:
        grants = list(
            pool.map(
                lambda index: workers[index % 4].allow("queue:orders", 2, config=CONFIG, now=T + 40).granted,
                range(16),
            )
        )

    assert sum(grants) == 5


def test_a_probe_that_stays_away_for_the_watch_closes_the_breaker(breakers: Breakers) -> None:
    open_breaker(breakers)
    assert breakers.allow("queue:orders", 10, config=CONFIG, now=T + 30).granted == 5
    state = breakers.record("queue:orders", events(*[CONFIRM] * 5), config=CONFIG, now=T + 31)
    assert (state.state, state.watch_until) == (HALF_OPEN, T + 91)
    # While the probe is watched nothing else goes, and waiting runs are told when to look again.
    waiting = breakers.allow("queue:orders", 10, config=CONFIG, now=T + 90)
    assert waiting.granted == 0
    assert waiting.state.retry_at(CONFIG) == T + 91

    assert breakers.allow("queue:orders", 10, config=CONFIG, now=T + 91).granted == 10
    assert breakers.peek("queue:orders", config=CONFIG, now=T + 91).state == CLOSED


def test_a_probe_that_comes_back_opens_it_again(breakers: Breakers) -> None:
    open_breaker(breakers)
    breakers.allow("queue:orders", 5, config=CONFIG, now=T + 30)
    breakers.record("queue:orders", events(*[CONFIRM] * 5), config=CONFIG, now=T + 31)

    state = breakers.record("queue:orders", [Event(BOOMERANG, replayed_at=T + 31)], now=T + 40)

    assert (state.state, state.probe_at) == (OPEN, T + 70)
    assert state.reason == "a probe came back"


def test_a_refused_probe_opens_it_again(breakers: Breakers) -> None:
    open_breaker(breakers)
    breakers.allow("queue:orders", 5, config=CONFIG, now=T + 30)

    state = breakers.record("queue:orders", events(CONFIRM, NACK), config=CONFIG, now=T + 31)

    assert state.state == OPEN


def test_a_late_boomerang_of_a_replay_sent_before_the_probe_does_not_reopen_it(breakers: Breakers) -> None:
    open_breaker(breakers)
    breakers.allow("queue:orders", 5, config=CONFIG, now=T + 30)

    state = breakers.record("queue:orders", [Event(BOOMERANG, replayed_at=T - 5)], now=T + 32)

    assert state.state == HALF_OPEN


def test_a_boomerang_whose_replay_is_not_recorded_yet_reopens_a_half_open_breaker(breakers: Breakers) -> None:
    """A probe that came back before the record of its confirm landed is a probe that came back (ingest reports
    such a return only from its origin's own dead-letter queue)."""
    open_breaker(breakers)
    breakers.allow("queue:orders", 5, config=CONFIG, now=T + 30)

    state = breakers.record("queue:orders", [Event(BOOMERANG)], now=T + 32)

    assert state.state == OPEN


def test_a_probe_not_sent_goes_back_to_the_probe(breakers: Breakers) -> None:
    open_breaker(breakers)
    breakers.allow("queue:orders", 5, config=CONFIG, now=T + 30)

    state = breakers.record(
        "queue:orders", events(CONFIRM, CONFIRM, RELEASE, RELEASE, RELEASE), config=CONFIG, now=T + 31
    )

    assert (state.probe_left, state.probe_out, state.probe_confirmed) == (3, 0, 2)
    assert breakers.allow("queue:orders", 10, config=CONFIG, now=T + 32).granted == 3


def test_a_probe_lost_with_its_worker_is_handed_out_again_after_the_watch(breakers: Breakers) -> None:
    open_breaker(breakers)
    breakers.allow("queue:orders", 5, config=CONFIG, now=T + 30)
    assert breakers.allow("queue:orders", 5, config=CONFIG, now=T + 89).granted == 0

    assert breakers.allow("queue:orders", 5, config=CONFIG, now=T + 90).granted == 5


def test_outcomes_that_arrive_while_open_are_ignored(breakers: Breakers) -> None:
    open_breaker(breakers)

    state = breakers.record("queue:orders", events(CONFIRM, NACK, BOOMERANG), config=CONFIG, now=T + 1)

    assert (state.state, state.recent, state.probe_at) == (OPEN, "", T + 30)


def test_closing_by_hand_lets_everything_go(breakers: Breakers) -> None:
    open_breaker(breakers)

    state = breakers.close("queue:orders", now=T + 1)

    assert (state.state, state.reason) == (CLOSED, "")
    assert breakers.allow("queue:orders", 7, config=CONFIG, now=T + 1).granted == 7


def test_the_states_are_listed_by_key(breakers: Breakers) -> None:
    open_breaker(breakers, "queue:orders")
    breakers.record("broker:staging:queue:orders", events(CONFIRM), config=CONFIG, now=T)

    assert breakers.keys() == ["broker:staging:queue:orders", "queue:orders"]


def test_every_state_expires_from_redis_an_abandoned_open_one_after_its_cooldown_watch_and_window(
    redis_breakers: Callable[[], RedisBreakers],
) -> None:
    breakers = redis_breakers()
    breakers.record("queue:quiet", events(CONFIRM), config=CONFIG, now=T)
    open_breaker(breakers, "queue:failing")
    open_breaker(breakers, "queue:probing")
    breakers.allow("queue:probing", 1, config=CONFIG, now=T + 30)

    assert 0 < breakers.client.ttl(breakers.prefix + "state:queue:quiet") <= 2 * CONFIG.window
    kept = CONFIG.cooldown + CONFIG.watch + CONFIG.window
    assert kept - 5 < breakers.client.ttl(breakers.prefix + "state:queue:failing") <= kept
    assert breakers.peek("queue:probing", config=CONFIG, now=T + 30).state == HALF_OPEN
    assert kept - 5 < breakers.client.ttl(breakers.prefix + "state:queue:probing") <= kept


def test_an_unreadable_state_starts_closed(redis_breakers: Callable[[], RedisBreakers]) -> None:
    breakers = redis_breakers()
    breakers.client.set(breakers.prefix + "state:queue:orders", b"\xff not json")

    assert breakers.allow("queue:orders", 3, config=CONFIG, now=T).granted == 3


def test_redis_time_is_used_without_now(redis_breakers: Callable[[], RedisBreakers]) -> None:
    breakers = redis_breakers()
    seconds, _ = breakers.client.time()

    state = breakers.record("queue:orders", events(*[NACK] * 5), config=CONFIG)

    assert abs(state.opened_at - seconds) < 5


def test_unreachable_redis_raises_breaker_unavailable() -> None:
    breakers = RedisBreakers("redis://127.0.0.1:1/0", timeout=1.0)
    with pytest.raises(BreakerUnavailable, match="circuit breakers unavailable"):
        breakers.allow("queue:orders", 1, config=CONFIG)
    with pytest.raises(BreakerUnavailable):
        breakers.record("queue:orders", events(NACK))


def test_many_states_are_read_at_once_as_of_now(breakers: Breakers) -> None:
    open_breaker(breakers, "queue:orders")
    breakers.record("queue:payments", events(CONFIRM), config=CONFIG, now=T)

    states = breakers.peek_many(
        ["queue:orders", "queue:payments", "queue:unknown"], config_for=lambda key: CONFIG, now=T + 31
    )

    assert {key: state.state for key, state in states.items()} == {
        "queue:orders": HALF_OPEN,
        "queue:payments": CLOSED,
        "queue:unknown": CLOSED,
    }
