"""What one run of an operation keeps, and the steps every part of the run uses: the heartbeat that keeps its
claim, the rate, the next items, the publisher, an automatic pause."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Hashable
from concurrent.futures import Future

from django.conf import settings
from django.utils import timezone

from dlqconsole.accounts.services import record_audit
from dlqconsole.core import amqp
from dlqconsole.core.publish import ConfirmedPublisher
from dlqconsole.core.ratelimit import RateLimiter, get_rate_limiter, parse_rate
from dlqconsole.deadletters.models import DeadLetterStatus
from dlqconsole.operations.destinations import Destination
from dlqconsole.operations.models import ACTIVE_STATUSES, ItemStatus, Operation, OperationItem, OperationStatus
from dlqconsole.operations.pacing import Pacer
from dlqconsole.operations.pipeline import Batch, Lane, Read, Take

logger = logging.getLogger(__name__)


class RunState:
    """What one run of an operation keeps between its steps, and the steps every part of it uses."""

    def __init__(self, operation_id: int, *, continue_later: Callable[[float], None] | None = None) -> None:
        self.operation_id = operation_id
        self.continue_later = continue_later
        self.token = uuid.uuid4().hex
        self.publisher: ConfirmedPublisher | None = None
        self.destination_problems: dict[Destination, str] = {}
        self.failure_streak = 0
        self.connection_failures = 0
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

    def _open_publisher(self) -> ConfirmedPublisher:
        if self.publisher is None or not self.publisher.is_open:
            self._close_publisher()
            publisher = ConfirmedPublisher(
                amqp.connection_parameters(),
                key_header=settings.DLQ_REPLAYED_FROM_HEADER,
                window=settings.DLQ_PUBLISH_WINDOW,
            )
            publisher.open()
            self.publisher = publisher
        return self.publisher

    def _close_publisher(self) -> None:
        if self.publisher is not None:
            try:
                self.publisher.close()
            except Exception:  # noqa: BLE001  (closing a broken connection must not hide the real problem)
                logger.debug("closing the publisher failed", exc_info=True)
            self.publisher = None

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
