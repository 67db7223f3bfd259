"""The circuit breakers of replay destinations as operations use them (the state machine is core/breaker.py): the
thresholds of a destination (settings, else a BreakerSetting row of the admin), what pages show, closing one by
hand.

A breaker is keyed like the shared rate limit (Destination.limit_key): the destination queue, else the exchange and
routing key, on its broker. Every operation and retry policy replaying into it shares it."""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from dataclasses import dataclass

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from dlqconsole.brokers.models import DEFAULT, Broker, default_broker_id
from dlqconsole.core.breaker import (
    CLOSED,
    OPEN,
    BreakerConfig,
    Breakers,
    BreakerState,
    BreakerUnavailable,
    get_breakers,
)
from dlqconsole.core.ratelimit import exchange_of_key
from dlqconsole.operations.destinations import Destination, on_broker

logger = logging.getLogger(__name__)

# A run reads the admin's thresholds at most this often.
CONFIG_SECONDS = 10.0


class BreakerSetting(models.Model):
    """Thresholds of one destination's circuit breaker; an empty field takes its DLQ_BREAKER_* setting."""

    broker = models.ForeignKey(Broker, on_delete=models.CASCADE, related_name="+", default=default_broker_id)
    queue = models.CharField(max_length=255, blank=True, help_text="The destination queue (or an exchange below).")
    exchange = models.CharField(max_length=255, blank=True)
    routing_key = models.CharField(max_length=255, blank=True)
    failures = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(1000)],
        help_text="Refusals or boomerangs in a row that open it (empty: DLQ_BREAKER_FAILURES).",
    )
    failure_share = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0.01), MaxValueValidator(1.0)],
        help_text="Share of recent outcomes failed that opens it (empty: DLQ_BREAKER_FAILURE_SHARE).",
    )
    min_sample = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(1000)],
        help_text="Recent outcomes needed before the share counts (empty: DLQ_BREAKER_MIN_SAMPLE).",
    )
    cooldown_seconds = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Seconds open before a probe (empty: DLQ_BREAKER_COOLDOWN_SECONDS).",
    )
    probe_size = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(1000)],
        help_text="Messages in a probe (empty: DLQ_BREAKER_PROBE_SIZE).",
    )
    watch_seconds = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Seconds a probe is watched before it closes (empty: DLQ_BREAKER_WATCH_SECONDS).",
    )

    class Meta:
        app_label = "operations"
        constraints = [
            models.UniqueConstraint(fields=["broker", "queue", "exchange", "routing_key"], name="breaker_destination")
        ]

    def __str__(self) -> str:
        return str(self.destination)

    def clean(self) -> None:
        if not self.queue and not self.routing_key:
            raise ValidationError("Name a queue, or an exchange and routing key.")
        if self.queue and (self.exchange or self.routing_key):
            raise ValidationError("Name a queue or an exchange and routing key, not both.")

    @property
    def destination(self) -> Destination:
        name = self.broker.name if self.broker_id else DEFAULT
        if self.queue:
            return Destination(exchange="", routing_key=self.queue, queue=self.queue, broker=name)
        return Destination(exchange=self.exchange, routing_key=self.routing_key, broker=name)

    @property
    def config(self) -> BreakerConfig:
        return BreakerConfig.from_settings(
            failures=self.failures,
            share=self.failure_share,
            min_sample=self.min_sample,
            cooldown=None if self.cooldown_seconds is None else float(self.cooldown_seconds),
            probe=self.probe_size,
            watch=None if self.watch_seconds is None else float(self.watch_seconds),
        )


class Thresholds:
    """The thresholds of each destination, read again from the admin's rows every CONFIG_SECONDS (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._read_at = -CONFIG_SECONDS
        self._by_key: dict[str, BreakerConfig] = {}

    def for_key(self, key: str) -> BreakerConfig:
        with self._lock:
            if time.monotonic() - self._read_at >= CONFIG_SECONDS:
                rows = BreakerSetting.objects.select_related("broker")
                self._by_key = {row.destination.limit_key: row.config for row in rows}
                self._read_at = time.monotonic()
            return self._by_key.get(key) or BreakerConfig.from_settings()


def epoch_time(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, tz=dt.UTC)


def waiting_text(destination: Destination | str, state: BreakerState, config: BreakerConfig) -> str:
    """What a replay waiting for this breaker says: "circuit open for queue orders, probing at 07:45:10 UTC"."""
    at = f"{timezone.localtime(epoch_time(state.retry_at(config))):%H:%M:%S %Z}"
    if state.state == OPEN:
        return f"circuit open for {destination}, probing at {at}"
    return f"circuit half-open for {destination}: its probe is out, watched until {at}"


@dataclass(frozen=True)
class BreakerView:
    """A breaker as pages, /metrics and alerts show it."""

    key: str
    destination: str
    state: BreakerState
    retry_at: dt.datetime | None

    @property
    def label(self) -> str:
        return self.state.label

    @property
    def is_closed(self) -> bool:
        return self.state.state == CLOSED


def split_key(key: str) -> tuple[str, str]:
    """(broker name, queue) of a breaker key; the queue is "" for an exchange and routing key."""
    broker = DEFAULT
    if key.startswith("broker:"):
        broker, _, key = key.removeprefix("broker:").partition(":")
    kind, _, name = key.partition(":")
    return broker, name if kind == "queue" else ""


def describe_key(key: str) -> str:
    """A breaker key as pages show a destination ("queue:orders" → "queue orders", on its broker)."""
    broker, queue = split_key(key)
    if queue:
        return on_broker(broker, f"queue {queue}")
    exchange, routing_key = exchange_of_key(key.split("exchange:", 1)[-1])
    return on_broker(broker, f"exchange {exchange} / {routing_key}")


def breaker_views(keys: list[str] | None = None, *, breakers: Breakers | None = None) -> list[BreakerView]:
    """The breakers with a stored state (or those of `keys`), by key; [] when Redis cannot be reached."""
    breakers = breakers or get_breakers()
    thresholds = Thresholds()
    try:
        wanted = breakers.keys() if keys is None else keys
        states = breakers.peek_many(wanted, config_for=thresholds.for_key)
        views = []
        for key, state in states.items():
            at = state.retry_at(thresholds.for_key(key))
            views.append(BreakerView(key, describe_key(key), state, epoch_time(at) if at else None))
    except BreakerUnavailable as error:
        logger.warning("cannot read the circuit breakers: %s", error)
        return []
    return views


def wanted_keys(views: list[BreakerView]) -> set[str]:
    """The keys among `views` someone needs to see: destinations an operation is waiting for and those set in the
    admin (a breaker any publisher of a dead letter can make, through a forged boomerang, must not hide them)."""
    # Imported here: operations/models.py imports this module (BreakerSetting lives here) at its end.
    from dlqconsole.operations.models import Operation

    configured = {row.destination.limit_key for row in BreakerSetting.objects.select_related("broker")}
    waits = list(Operation.objects.filter(breaker_wait_until__isnull=False).values_list("breaker_wait", flat=True))
    waited = {
        view.key
        for view in views
        if any(f"for {view.destination}," in text or f"for {view.destination}:" in text for text in waits)
    }
    return configured | waited


def ranked(views: list[BreakerView], *, limit: int) -> tuple[list[BreakerView], int]:
    """At most `limit` of `views`, not closed before closed, by key; when they do not all fit, those waited for or set
    in the admin first (only then are those looked up); and how many were left out."""
    order = sorted(views, key=lambda view: (view.is_closed, view.key))
    if len(order) <= limit:
        return order, 0
    wanted = wanted_keys(views)
    order.sort(key=lambda view: view.key not in wanted)
    return order[:limit], len(order) - limit


def queue_breaker(*, broker: str, queue: str) -> BreakerView | None:
    """The breaker of replays into `queue` on `broker`, when it is not closed."""
    key = Destination(exchange="", routing_key=queue, queue=queue, broker=broker).limit_key
    views = breaker_views([key])
    return views[0] if views and not views[0].is_closed else None
