"""A circuit breaker per replay destination, shared by every worker through Redis (beside the rate limiter).

States:
- closed: replays go out. Each outcome is remembered in a short ring of recent ones (`recent`, "0" for a confirm,
  "1" for a failure, oldest first): a broker refusal (nack) adds a failure; a boomerang (a replay that died again
  within `window` seconds, reported by ingest) turns the newest success into a failure, since it is a replay that
  was confirmed and then came back. A boomerang that comes before its confirm is reported (the run reports confirms
  a batch later) is owed (`owed`): it counts as a failure at the end of the ring, and the confirm that comes next
  is recorded as that failure, so a replay is one outcome however its news arrive. It opens after `failures`
  failures at the end of the ring ("in a row"), or when at least `min_sample` outcomes are remembered and `share`
  of them failed.
  A ring idle for `window` seconds is forgotten. An unroutable return is a configuration error of that item, not a
  sign the destination is failing: it is not reported here.
- open: nothing goes out until `probe_at` (opened + `cooldown`); outcomes that still arrive are ignored.
- half-open: from `probe_at`, `probe` messages in all are let out (`allow` hands them out atomically, however many
  workers ask). Each probe confirm starts the watch again (`watch` seconds). Once every probe handed out is
  confirmed and the watch is over without a refusal or a boomerang of a replay sent since the breaker went
  half-open, it closes; a refusal or such a boomerang opens it again for another cool-down. Probes handed out but
  neither confirmed nor given back within `watch` seconds (a worker died with them) may be handed out again.

Atomicity: the state of a destination is one JSON value under `prefix + key`, changed with WATCH/MULTI (optimistic:
a concurrent change makes the change run again on the new state), so the state machine is written once, in Python,
and `LocalBreakers` (no REDIS_URL: one process) runs the same steps under a lock. Time is the Redis server's (epoch
seconds, so pages can show it), or `now` (tests). When Redis cannot be reached the breakers fail open: replays go on
(paced by the rate limiter, which pauses them then) and a boomerang is not counted; a warning is logged.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import redis

from dlqconsole.core.ratelimit import UNAVAILABLE_ERRORS, exchange_key, redis_client, scoped_key

logger = logging.getLogger(__name__)

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"
STATE_LABELS = {CLOSED: "closed", OPEN: "open", HALF_OPEN: "half-open"}
# The value of dlq_breaker_state in /metrics.
STATE_VALUES = {CLOSED: 0, HALF_OPEN: 1, OPEN: 2}
# Outcomes reported by a run (CONFIRM, NACK, RELEASE) or by ingest (BOOMERANG).
CONFIRM = "confirm"
NACK = "nack"
BOOMERANG = "boomerang"
# A probe handed out that did not go out (never sent, held back, unroutable, lost with its connection): back to the
# probe for another message.
RELEASE = "release"
DEFAULT_PREFIX = "dlq:breaker:"
INDEX_SUFFIX = "index"
# The ring of recent outcomes keeps at least this many.
RING_AT_LEAST = 100
MAX_REASON = 500
# Closed state is kept this many windows after its last outcome, then expires (an idle breaker needs no state).
CLOSED_TTL_WINDOWS = 2
# An open or half-open state nothing changes is kept at least this long.
OPEN_TTL_AT_LEAST = 300


@dataclass(frozen=True)
class BreakerConfig:
    failures: int = 20
    share: float = 0.5
    min_sample: int = 20
    cooldown: float = 60.0
    probe: int = 5
    watch: float = 60.0
    window: float = 300.0

    @property
    def ring(self) -> int:
        return max(RING_AT_LEAST, self.min_sample, self.failures)

    @classmethod
    def from_settings(cls, **overrides: Any) -> BreakerConfig:
        """DLQ_BREAKER_* settings, with per-destination `overrides` (None: the setting)."""
        from django.conf import settings

        values: dict[str, Any] = {
            "failures": settings.DLQ_BREAKER_FAILURES,
            "share": settings.DLQ_BREAKER_FAILURE_SHARE,
            "min_sample": settings.DLQ_BREAKER_MIN_SAMPLE,
            "cooldown": float(settings.DLQ_BREAKER_COOLDOWN_SECONDS),
            "probe": settings.DLQ_BREAKER_PROBE_SIZE,
            "watch": float(settings.DLQ_BREAKER_WATCH_SECONDS),
            "window": float(settings.DLQ_BREAKER_WINDOW_SECONDS),
        }
        values.update({name: value for name, value in overrides.items() if value is not None})
        return cls(**values)


@dataclass
class BreakerState:
    state: str = CLOSED
    recent: str = ""
    owed: int = 0
    last_event_at: float = 0.0
    opened_at: float = 0.0
    probe_at: float = 0.0
    half_open_at: float = 0.0
    probe_left: int = 0
    probe_out: int = 0
    probe_confirmed: int = 0
    probe_granted_at: float = 0.0
    watch_until: float = 0.0
    reason: str = ""
    # What the newest failure said (a refusal's error, a boomerang's death).
    last_failure: str = ""
    # The thresholds last used for this destination (a run passes them; ingest, which does not know them, uses these).
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def outcomes(self) -> str:
        """The recent outcomes with the owed boomerangs at their end."""
        return self.recent + "1" * self.owed

    @property
    def streak(self) -> int:
        outcomes = self.outcomes
        return len(outcomes) - len(outcomes.rstrip("1"))

    @property
    def label(self) -> str:
        return STATE_LABELS.get(self.state, self.state)

    def retry_at(self, config: BreakerConfig) -> float:
        """When a replay waiting for this breaker should ask again (epoch seconds; 0 when it need not wait)."""
        if self.state == OPEN:
            return self.probe_at
        if self.state == HALF_OPEN and self.probe_left <= 0:
            if self.probe_out:
                return self.probe_granted_at + config.watch
            return self.watch_until
        return 0.0

    def admits(self) -> bool:
        """Whether a replay may go out now (closed, or half-open with probes left)."""
        return self.state == CLOSED or (self.state == HALF_OPEN and self.probe_left > 0)


@dataclass(frozen=True)
class Event:
    kind: str
    # A boomerang's replay (epoch seconds; None: just now, its record not landed yet): in half-open, a boomerang of a
    # replay sent before the breaker went half-open does not open it again.
    replayed_at: float | None = None
    reason: str = ""


@dataclass(frozen=True)
class Allowance:
    granted: int
    state: BreakerState


# The state machine ---------------------------------------------------------------------------------------------


def advance(state: BreakerState, *, now: float, config: BreakerConfig) -> None:
    """The changes time alone makes: open → half-open after the cool-down; a lost probe handed out again; half-open →
    closed once the watch is over; a closed ring forgotten after a quiet window."""
    if state.state == OPEN and now >= state.probe_at:
        state.state = HALF_OPEN
        state.half_open_at = now
        state.probe_left, state.probe_out, state.probe_confirmed = config.probe, 0, 0
        state.watch_until = 0.0
    if state.state == HALF_OPEN:
        if state.probe_out and now >= state.probe_granted_at + config.watch:
            state.probe_left += state.probe_out
            state.probe_out = 0
        if state.probe_confirmed and not state.probe_out and now >= state.watch_until:
            _close(state)
    if state.state == CLOSED and state.outcomes and now - state.last_event_at > config.window:
        state.recent, state.owed = "", 0


def allow(state: BreakerState, wanted: int, *, now: float, config: BreakerConfig) -> int:
    """How many of `wanted` replays may go out now (half-open: taken from the probe)."""
    advance(state, now=now, config=config)
    if state.state == CLOSED:
        return wanted
    if state.state == OPEN:
        return 0
    granted = max(0, min(wanted, state.probe_left))
    if granted:
        state.probe_left -= granted
        state.probe_out += granted
        state.probe_granted_at = now
    return granted


def record(state: BreakerState, events: Iterable[Event], *, now: float, config: BreakerConfig) -> None:
    """Apply outcomes in order (see the module docstring)."""
    advance(state, now=now, config=config)
    for event in events:
        if state.state == CLOSED:
            _record_closed(state, event, now=now, config=config)
        elif state.state == HALF_OPEN:
            _record_half_open(state, event, now=now, config=config)


def _record_closed(state: BreakerState, event: Event, *, now: float, config: BreakerConfig) -> None:
    if event.kind == CONFIRM and state.owed:
        state.owed -= 1
        state.recent += "1"
    elif event.kind == CONFIRM:
        state.recent += "0"
    elif event.kind == NACK:
        state.recent += "1"
    elif event.kind == BOOMERANG:
        newest = state.recent.rfind("0")
        if newest >= 0:
            state.recent = state.recent[:newest] + "1" + state.recent[newest + 1 :]
        else:
            state.owed = min(state.owed + 1, config.ring)
    else:
        return
    state.recent = state.recent[-config.ring :]
    state.last_event_at = now
    if event.kind != CONFIRM:
        state.last_failure = event.reason[:MAX_REASON]
    outcomes = state.outcomes[-config.ring :]
    failed = outcomes.count("1")
    if state.streak >= config.failures:
        _open(state, now=now, config=config, why=f"{state.streak} failures in a row")
    elif len(outcomes) >= config.min_sample and failed >= config.share * len(outcomes):
        _open(state, now=now, config=config, why=f"{failed} of the last {len(outcomes)} replays failed")


def _record_half_open(state: BreakerState, event: Event, *, now: float, config: BreakerConfig) -> None:
    if event.kind == CONFIRM and state.probe_out:
        state.probe_out -= 1
        state.probe_confirmed += 1
        state.watch_until = now + config.watch
    elif event.kind == RELEASE and state.probe_out:
        state.probe_out -= 1
        state.probe_left += 1
    elif event.kind == NACK or (
        event.kind == BOOMERANG and (event.replayed_at is None or event.replayed_at >= state.half_open_at)
    ):
        state.last_failure = event.reason[:MAX_REASON]
        _open(state, now=now, config=config, why=f"a probe {'was refused' if event.kind == NACK else 'came back'}")


def _open(state: BreakerState, *, now: float, config: BreakerConfig, why: str) -> None:
    last = f"; the last: {state.last_failure}" if state.last_failure else ""
    state.state = OPEN
    state.opened_at = now
    state.probe_at = now + config.cooldown
    state.recent, state.owed = "", 0
    state.probe_left = state.probe_out = state.probe_confirmed = 0
    state.watch_until = 0.0
    state.reason = f"{why}{last}"[:MAX_REASON]


def _close(state: BreakerState) -> None:
    state.state = CLOSED
    state.recent, state.owed = "", 0
    state.probe_left = state.probe_out = state.probe_confirmed = 0
    state.watch_until = 0.0


def close(state: BreakerState, *, now: float, config: BreakerConfig) -> None:
    """Closed by hand (an operator): replays go out at once."""
    _close(state)
    state.reason = state.last_failure = ""


def _encode(state: BreakerState) -> str:
    return json.dumps(dataclasses.asdict(state), sort_keys=True, separators=(",", ":"))


def _decode(raw: bytes | str | None) -> BreakerState:
    if not raw:
        return BreakerState()
    try:
        values = json.loads(raw)
        names = {item.name for item in dataclasses.fields(BreakerState)}
        return BreakerState(**{name: value for name, value in values.items() if name in names})
    except (ValueError, TypeError):
        logger.warning("unreadable breaker state %r: starting closed", raw[:200] if raw else raw)
        return BreakerState()


# Stores -------------------------------------------------------------------------------------------------------


class BreakerUnavailable(Exception):
    """The shared state cannot be reached (Redis is down)."""


class Breakers(ABC):
    """Breakers keyed by destination (Destination.limit_key, `destination_key`)."""

    def allow(self, key: str, wanted: int, *, config: BreakerConfig, now: float | None = None) -> Allowance:
        def step(state: BreakerState, clock: float) -> int:
            state.config = dataclasses.asdict(config)
            return allow(state, wanted, now=clock, config=config)

        granted, state = self._change(key, step, now=now)
        return Allowance(granted=granted, state=state)

    def record(
        self, key: str, events: list[Event], *, config: BreakerConfig | None = None, now: float | None = None
    ) -> BreakerState:
        """Apply outcomes; without `config` (ingest) the thresholds last used for the destination, else the
        settings."""

        def step(state: BreakerState, clock: float) -> None:
            used = config or _stored_config(state)
            if config is not None:
                state.config = dataclasses.asdict(config)
            record(state, events, now=clock, config=used)

        return self._change(key, step, now=now)[1]

    def close(self, key: str, *, now: float | None = None) -> BreakerState:
        def step(state: BreakerState, clock: float) -> None:
            close(state, now=clock, config=_stored_config(state))

        return self._change(key, step, now=now)[1]

    def peek(self, key: str, *, config: BreakerConfig | None = None, now: float | None = None) -> BreakerState:
        """The state as of now (time's changes applied, nothing stored)."""
        state, clock = self._read(key, now=now)
        advance(state, now=clock, config=config or _stored_config(state))
        return state

    def peek_many(
        self, keys: list[str], *, config_for: Callable[[str], BreakerConfig], now: float | None = None
    ) -> dict[str, BreakerState]:
        """The states of `keys` as of now, in one read (pages, /metrics, alerts)."""
        states, clock = self._read_many(keys, now=now)
        for key, state in states.items():
            advance(state, now=clock, config=config_for(key))
        return states

    def _read_many(self, keys: list[str], *, now: float | None) -> tuple[dict[str, BreakerState], float]:
        clock = self.clock() if now is None else float(now)
        return {key: self._read(key, now=clock)[0] for key in keys}, clock

    @abstractmethod
    def _change(
        self, key: str, step: Callable[[BreakerState, float], Any], *, now: float | None
    ) -> tuple[Any, BreakerState]:
        """Run `step` on the state of `key` atomically and store it; (what it returned, the new state)."""

    @abstractmethod
    def _read(self, key: str, *, now: float | None) -> tuple[BreakerState, float]:
        """The stored state and the clock."""

    @abstractmethod
    def keys(self) -> list[str]:
        """Every destination with a stored state."""

    def clock(self) -> float:
        return self._read("", now=None)[1]


def _stored_config(state: BreakerState) -> BreakerConfig:
    names = {item.name for item in dataclasses.fields(BreakerConfig)}
    try:
        return BreakerConfig.from_settings(**{name: state.config[name] for name in names if name in state.config})
    except (TypeError, ValueError):
        return BreakerConfig.from_settings()


def _ttl(state: BreakerState) -> int:
    """Seconds to keep a state: a closed one a quiet while (CLOSED_TTL_WINDOWS windows); an open or half-open one its
    cool-down, watch and window after its last change (at least OPEN_TTL_AT_LEAST), so a breaker nothing replays
    into any more (a half-open one no probe ever closes) goes away instead of staying forever."""
    config = _stored_config(state)
    if state.state == CLOSED:
        return max(60, int(config.window * CLOSED_TTL_WINDOWS))
    return max(OPEN_TTL_AT_LEAST, int(config.cooldown + config.watch + config.window))


class RedisBreakers(Breakers):
    def __init__(self, url: str, *, prefix: str = DEFAULT_PREFIX, timeout: float = 5.0) -> None:
        self.prefix = prefix
        self.client = redis_client(url, timeout=timeout)

    def _change(
        self, key: str, step: Callable[[BreakerState, float], Any], *, now: float | None
    ) -> tuple[Any, BreakerState]:
        name = self.prefix + "state:" + key
        try:
            with self.client.pipeline() as pipe:
                while True:
                    try:
                        pipe.watch(name)
                        raw = pipe.get(name)
                        clock = _server_time(pipe) if now is None else float(now)
                        state = _decode(raw)
                        before = _encode(state)
                        result = step(state, clock)
                        after = _encode(state)
                        if after == before:
                            pipe.unwatch()
                            return result, state
                        pipe.multi()
                        pipe.set(name, after, ex=_ttl(state))
                        pipe.sadd(self.prefix + INDEX_SUFFIX, key)
                        pipe.execute()
                        return result, state
                    except redis.WatchError:
                        continue
        except UNAVAILABLE_ERRORS as error:
            raise BreakerUnavailable(f"circuit breakers unavailable: {error}") from error

    def _read(self, key: str, *, now: float | None) -> tuple[BreakerState, float]:
        try:
            with self.client.pipeline(transaction=False) as pipe:
                pipe.get(self.prefix + "state:" + key)
                pipe.time()
                raw, (seconds, micros) = pipe.execute()
        except UNAVAILABLE_ERRORS as error:
            raise BreakerUnavailable(f"circuit breakers unavailable: {error}") from error
        return _decode(raw) if key else BreakerState(), seconds + micros / 1e6 if now is None else float(now)

    def _read_many(self, keys: list[str], *, now: float | None) -> tuple[dict[str, BreakerState], float]:
        if not keys:
            return {}, self.clock() if now is None else float(now)
        try:
            with self.client.pipeline(transaction=False) as pipe:
                pipe.mget([self.prefix + "state:" + key for key in keys])
                pipe.time()
                raws, (seconds, micros) = pipe.execute()
        except UNAVAILABLE_ERRORS as error:
            raise BreakerUnavailable(f"circuit breakers unavailable: {error}") from error
        clock = seconds + micros / 1e6 if now is None else float(now)
        return {key: _decode(raw) for key, raw in zip(keys, raws, strict=True)}, clock

    def keys(self) -> list[str]:
        index = self.prefix + INDEX_SUFFIX
        try:
            keys = sorted(_text(member) for member in self.client.smembers(index))
            if not keys:
                return []
            present = self.client.mget([self.prefix + "state:" + key for key in keys])
            gone = [key for key, raw in zip(keys, present, strict=True) if raw is None]
            if gone:
                self.client.srem(index, *gone)
        except UNAVAILABLE_ERRORS as error:
            raise BreakerUnavailable(f"circuit breakers unavailable: {error}") from error
        return [key for key in keys if key not in gone]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _server_time(pipe: Any) -> float:
    seconds, micros = pipe.time()
    return float(seconds) + micros / 1e6


class LocalBreakers(Breakers):
    """Breakers in this process only: for a single worker when REDIS_URL is unset."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.states: dict[str, str] = {}

    def _change(
        self, key: str, step: Callable[[BreakerState, float], Any], *, now: float | None
    ) -> tuple[Any, BreakerState]:
        with self.lock:
            state = _decode(self.states.get(key))
            result = step(state, time.time() if now is None else float(now))
            self.states[key] = _encode(state)
            return result, state

    def _read(self, key: str, *, now: float | None) -> tuple[BreakerState, float]:
        with self.lock:
            return _decode(self.states.get(key)), time.time() if now is None else float(now)

    def keys(self) -> list[str]:
        with self.lock:
            return sorted(self.states)


def destination_key(*, exchange: str, routing_keys: list[Any], queue: str, broker: str = "") -> str:
    """The breaker (and rate limit) key of a retry to where a dead letter died, as Destination.limit_key computes it
    for operations.destinations.retry_destination (`broker` "" for the default broker): the queue, else the
    exchange and first routing key. Ingest keys a boomerang by it."""
    keys = [str(key) for key in routing_keys or [] if key is not None]
    if keys:
        queue = queue or (keys[0] if not exchange else "")
        key = f"queue:{queue}" if queue else exchange_key(exchange, keys[0])
    elif queue:
        key = f"queue:{queue}"
    else:
        return ""
    return scoped_key(key, broker=broker)


def get_breakers() -> Breakers:
    """The process's breakers: shared through settings.REDIS_URL, or in process when it is unset."""
    from django.conf import settings

    return _breakers_for(settings.REDIS_URL)


@functools.cache
def _breakers_for(url: str) -> Breakers:
    return RedisBreakers(url) if url else LocalBreakers()
