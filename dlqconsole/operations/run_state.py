"""What one run of an operation keeps, and the steps every part of the run uses: the heartbeat that keeps its
claim, the rate, the next items, a publisher per broker and how each broker is doing, an automatic pause.

A run publishes to every broker its items go to, each through a connection of its own, opened when the first
message for it comes and closed after a while without one. A broker that cannot be reached holds back only its own
messages: they stay pending while the others go out, and are tried again after a wait (up to CONNECTION_ATTEMPTS
times in a row); the operation pauses, naming the broker, only when nothing else is left to publish."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Hashable
from concurrent.futures import Future

from django.conf import settings
from django.utils import timezone

from dlqconsole.accounts.services import record_audit
from dlqconsole.brokers import registry
from dlqconsole.brokers.models import DEFAULT
from dlqconsole.core.breaker import get_breakers
from dlqconsole.core.publish import ConfirmedPublisher, Outcome, PublishError
from dlqconsole.core.ratelimit import RateLimiter, get_rate_limiter, parse_rate
from dlqconsole.deadletters.models import DeadLetterStatus
from dlqconsole.operations.breakers import Thresholds
from dlqconsole.operations.destinations import Destination, KnownBrokers
from dlqconsole.operations.item_sql import CameBack
from dlqconsole.operations.models import ACTIVE_STATUSES, ItemStatus, Operation, OperationItem, OperationStatus
from dlqconsole.operations.pacing import Pacer
from dlqconsole.operations.pipeline import Batch, Lane, Read, Take

logger = logging.getLogger(__name__)

# Connection failures in a row before a broker is given up for this run (its messages then wait for a resume).
CONNECTION_ATTEMPTS = 3
# A publisher unused this long is closed (it is opened again when needed): it would miss its heartbeats while the
# run publishes to other brokers or waits, and the broker would close it under us.
IDLE_SECONDS = 15.0


def on_broker_error(name: str, error: str) -> str:
    """An error of a broker's connection, naming the broker unless it is default."""
    return error if name == DEFAULT else f"broker {name}: {error}"


class RunState:
    """What one run of an operation keeps between its steps, and the steps every part of it uses."""

    def __init__(self, operation_id: int, *, continue_later: Callable[[float], None] | None = None) -> None:
        self.operation_id = operation_id
        self.continue_later = continue_later
        self.token = uuid.uuid4().hex
        self.brokers = KnownBrokers()
        # By broker name: its publisher, when it was last used (time.monotonic()), and its connection failures in a
        # row, when it may be tried again and the last error.
        self.publishers: dict[str, ConfirmedPublisher] = {}
        self.used_at: dict[str, float] = {}
        self.connection_failures: dict[str, int] = {}
        self.retry_at: dict[str, float] = {}
        self.broker_errors: dict[str, str] = {}
        # Brokers whose pending items were passed over (left behind the cursor) while they could not be reached.
        self.held_back: set[str] = set()
        self.destination_problems: dict[Destination, str] = {}
        # The circuit breakers (breaking.py): their thresholds; by destination key, until when the take passes over
        # its items (epoch seconds), the destinations whose items were passed over and what they wait for; by message
        # key, the destination key of each message out (and which are probes).
        self.breakers = get_breakers()
        self.thresholds = Thresholds()
        self.blocked: dict[str, float] = {}
        self.breaker_held: dict[str, Destination] = {}
        self.breaker_waits: dict[str, str] = {}
        self.destination_of_key: dict[str, Destination] = {}
        self.breaker_key_of: dict[Hashable, str] = {}
        self.probes: set[Hashable] = set()
        # Set when the run stops to wait for a breaker (its task comes back later).
        self.suspended = False
        self.rate_text: str | None = None
        self.pacer: Pacer | None = None
        self.last_return_check = 0.0
        self.limiter: RateLimiter | None = None
        # Used by the database lane only: pending items are read by keyset from here, and items left in flight
        # (by a dead worker, or by a lost connection) are looked for first when this is set.
        self.cursor = 0
        self.look_for_in_flight = True
        self.cursor_lock = threading.Lock()
        self.new_status = DeadLetterStatus.REPLAYED
        # Confirmed in this run, counted as the confirms arrive (the recorded count lags a chunk behind).
        self.confirmed = 0
        self.succeeded_at_start = 0
        # Two database lanes: one reads batches ahead, the other records outcomes, both while the main thread
        # publishes.
        self.reader = Lane(threaded=False)
        self.taker = Lane(threaded=False)
        self.recorders = [Lane(threaded=False)]
        self.batches = 0
        self.read_ahead: Future[list[Read]] | None = None
        self.prefetched: Future[Take | None] | None = None
        # Every published batch's `landed`, oldest first; and the batch each unconfirmed message belongs to.
        self.recording: list[Future[None]] = []
        self.unconfirmed: dict[Hashable, Batch] = {}

    # Steps of other parts of the run, named here for those that call them.

    def _blocked(self, destination: Destination) -> bool:
        """Whether a destination's breaker holds its items back now (breaking.py)."""
        raise NotImplementedError

    def _breaker_guards(self) -> bool:
        """Whether a circuit breaker guards what this run publishes now (breaking.py)."""
        raise NotImplementedError

    def _settle(self) -> None:
        """Wait for everything in flight (runner.py)."""
        raise NotImplementedError

    def _sort_outcomes(self, outcomes: list[Outcome]) -> None:
        """File outcomes under their batches (runner.py)."""
        raise NotImplementedError

    def _check_returns(self, *, force: bool, may_pause: bool = True) -> CameBack:
        """Count the replays that came back, pausing on too many (canary.py)."""
        raise NotImplementedError

    def _heartbeat(self) -> bool:
        """Keep the claim alive; False when the operation was paused, cancelled, finished or taken over."""
        if not Operation.objects.filter(pk=self.operation_id, runner=self.token).update(heartbeat_at=timezone.now()):
            return False
        status, rate = Operation.objects.filter(pk=self.operation_id).values_list("status", "rate").get()
        if status not in ACTIVE_STATUSES:
            return False
        self._sync_rate(rate)
        return True

    def _sync_rate(self, text: str) -> None:
        if text == self.rate_text:
            return
        self.rate_text = text
        if not text:
            self.pacer = None
            return
        try:
            rate = parse_rate(text)
        except ValueError:
            logger.warning("operation %s has an unreadable rate %r; keeping the previous one", self.operation_id, text)
            return
        if self.limiter is None:
            self.limiter = get_rate_limiter()
        self.pacer = Pacer(self.limiter, rate)

    def _next_items(self, limit: int, *, resume: bool = True) -> list[tuple[int, int, str]]:
        """(pk, dead letter id, status) of the next items: ones left in flight first (when there may be some),
        then pending ones after the cursor.

        `resume=False` while a chunk of this run is in flight (a prefetch): its items are in flight too, and must
        not be taken for leftovers."""
        items = OperationItem.objects.filter(operation_id=self.operation_id).order_by("pk")
        fields = ("pk", "dead_letter_id", "status")
        with self.cursor_lock:
            if resume and self.look_for_in_flight:
                rows = list(items.filter(status=ItemStatus.IN_FLIGHT).values_list(*fields)[:limit])
                if rows:
                    return rows
                self.look_for_in_flight = False
            rows = list(items.filter(status=ItemStatus.PENDING, pk__gt=self.cursor).values_list(*fields)[:limit])
            if rows:
                self.cursor = rows[-1][0]
        return rows

    # Publishers and brokers ---------------------------------------------------------------------------------

    def _open_publisher(self, name: str) -> ConfirmedPublisher:
        """The open publisher of the broker called `name`, connecting first if needed; PublishError naming the
        broker when it cannot."""
        publisher = self.publishers.get(name)
        if publisher is None or not publisher.is_open:
            self._close_publisher(name)
            try:
                parameters = registry.connection_parameters(self.brokers.named(name))
            except Exception as error:  # noqa: BLE001  (a broker gone, or a URL that cannot be read)
                raise PublishError(on_broker_error(name, f"cannot connect: {type(error).__name__}")) from error
            publisher = ConfirmedPublisher(
                parameters, key_header=settings.DLQ_REPLAYED_FROM_HEADER, window=settings.DLQ_PUBLISH_WINDOW
            )
            try:
                publisher.open()
            except PublishError as error:
                raise PublishError(on_broker_error(name, str(error))) from error
            self.publishers[name] = publisher
        self.used_at[name] = time.monotonic()
        return publisher

    def _close_publisher(self, name: str) -> None:
        publisher = self.publishers.pop(name, None)
        if publisher is not None:
            try:
                publisher.close()
            except Exception:  # noqa: BLE001  (closing a broken connection must not hide the real problem)
                logger.debug("closing the publisher of broker %s failed", name, exc_info=True)

    def _close_publishers(self, *, idle_only: bool = False) -> None:
        """Close every publisher, or (`idle_only`) those unused for IDLE_SECONDS with nothing awaiting a confirm."""
        now = time.monotonic()
        for name, publisher in list(self.publishers.items()):
            idle = now - self.used_at.get(name, 0.0) > IDLE_SECONDS and not publisher.unconfirmed
            if not idle_only or idle:
                self._close_publisher(name)

    def _broker_failed(self, name: str, error: str) -> None:
        """A broker's connection failed or was lost: its messages are held back until it may be tried again."""
        self._close_publisher(name)
        # What was learnt of its destinations may have changed with it (an exchange deleted, a vhost rebuilt).
        self.destination_problems = {
            destination: problem
            for destination, problem in self.destination_problems.items()
            if destination.broker != name
        }
        failures = self.connection_failures[name] = self.connection_failures.get(name, 0) + 1
        self.retry_at[name] = time.monotonic() + min(2.0**failures, 10.0)
        self.broker_errors[name] = on_broker_error(name, error.removeprefix(f"broker {name}: "))
        logger.warning("operation %s: %s (failure %s in a row)", self.operation_id, self.broker_errors[name], failures)

    def _broker_down(self, name: str) -> str:
        """Why the broker called `name` is not tried now ("" when it may be): it failed and its wait is not over,
        or it failed CONNECTION_ATTEMPTS times in a row."""
        if not self.connection_failures.get(name):
            return ""
        if self._given_up(name) or time.monotonic() < self.retry_at.get(name, 0.0):
            return self.broker_errors.get(name, on_broker_error(name, "cannot connect"))
        return ""

    def _given_up(self, name: str) -> bool:
        return self.connection_failures.get(name, 0) >= CONNECTION_ATTEMPTS

    def _pause(self, reason: str, *, error: str = "", canary_failed: bool = False) -> None:
        paused = Operation.objects.filter(pk=self.operation_id, status__in=ACTIVE_STATUSES).update(
            status=OperationStatus.PAUSED,
            pause_reason=reason[:2000],
            paused_automatically=True,
            last_error=error or reason[:2000],
            **({"canary_failed": True} if canary_failed else {}),
        )
        if paused:
            logger.warning("operation %s paused: %s", self.operation_id, reason)
            record_audit(actor=None, action="operation.pause", target=f"operation:{self.operation_id}", detail=reason)
