"""Watching what a run published: the canary's wait and verdict, replays that came back to a dead-letter queue (a
pause on too many; counted on after the run stopped), and finishing the operation."""

from __future__ import annotations

import datetime as dt
import logging
import time

from django.core.cache import cache
from django.utils import timezone

from dlqconsole.accounts.services import record_audit
from dlqconsole.operations.item_sql import CameBack, count_came_back
from dlqconsole.operations.models import ACTIVE_STATUSES, Operation, OperationStatus
from dlqconsole.operations.run_state import RunState

logger = logging.getLogger(__name__)

# Look for replays that came back at most this often (a query over recent arrivals).
RETURN_CHECK_SECONDS = 2.0
# A share of returns means little before this many replays.
RETURN_SHARE_MIN_SAMPLE = 20
# Waiting in process (without continue_later), the longest sleep between two heartbeats.
TICK_SECONDS = 2.0
# During a canary's wait, how often its messages are looked for in the dead-letter queues.
CANARY_LOOK_SECONDS = 2.0


class CanarySteps(RunState):
    """The canary, the returns and the finish of OperationRunner."""

    def _start_canary_wait(self) -> None:
        operation = Operation.objects.get(pk=self.operation_id)
        until = timezone.now() + dt.timedelta(seconds=operation.canary_wait_seconds)
        Operation.objects.filter(pk=self.operation_id, runner=self.token).update(canary_until=until)

    def _canary_waited(self, operation: Operation) -> bool:
        """Judge the canary: failed as soon as one of its messages comes back (or could not be published),
        passed once its wait is over without that. False when the runner should stop for now.

        A resume after a pause during the wait comes back here: the watch goes on until `canary_until`, and a
        pause that outlasted it leaves the canary judged at once."""
        assert operation.canary_until is not None
        came_back = self._check_returns(force=True)
        if came_back.count or operation.failed:
            parts = []
            if came_back.count:
                parts.append(
                    f"{came_back.count} came back to a dead-letter queue within {operation.canary_wait_seconds}s "
                    f"({came_back.words})"
                )
            if operation.failed:
                parts.append(f"{operation.failed} could not be published ({operation.last_error})")
            self._pause(f"canary of {operation.canary_size}: " + "; ".join(parts), canary_failed=True)
            return True
        remaining = (operation.canary_until - timezone.now()).total_seconds()
        if remaining > 0:
            # Look again soon: a canary that comes back stops the operation then, not at the end of the wait.
            if self.continue_later is not None:
                self.continue_later(min(remaining, CANARY_LOOK_SECONDS))
                return False
            time.sleep(min(remaining, TICK_SECONDS, CANARY_LOOK_SECONDS))
            return self._heartbeat()
        Operation.objects.filter(pk=self.operation_id, status=OperationStatus.CANARY).update(
            status=OperationStatus.RUNNING, canary_passed=True
        )
        return True

    def _check_returns(self, *, force: bool, may_pause: bool = True) -> CameBack:
        """Count our replays that died again (linked by ingest through `previous`), each once, and why; pause on
        too many. Once no worker runs the operation, its page, its API and the sweep count them
        (refresh_came_back)."""
        if not force and time.monotonic() - self.last_return_check < RETURN_CHECK_SECONDS:
            return CameBack()
        self.last_return_check = time.monotonic()
        operation = Operation.objects.get(pk=self.operation_id)
        if not operation.publishes or operation.started_at is None:
            return CameBack()
        came_back = count_came_back(operation=operation)
        returned = came_back.count
        Operation.objects.filter(pk=self.operation_id).update(returned=returned, returned_reasons=came_back.reasons)
        published = max(operation.succeeded, self.succeeded_at_start + self.confirmed) - operation.succeeded_baseline
        fresh = returned - operation.returned_baseline
        if (
            may_pause
            and operation.status == OperationStatus.RUNNING
            and published >= RETURN_SHARE_MIN_SAMPLE
            and fresh > operation.max_return_share * published
            # An open breaker guards the destination: the run waits for its probe and goes on by itself.
            and not self._breaker_guards()
        ):
            self._pause(
                f"{fresh} of {published} replayed messages came back to a dead-letter queue "
                f"(more than {operation.max_return_share:.0%}): {came_back.words}"
            )
        return came_back

    def _finish(self, operation: Operation) -> None:
        now = timezone.now()
        if operation.publishes:
            self._check_returns(force=True, may_pause=False)
        finished = Operation.objects.filter(pk=self.operation_id, status__in=ACTIVE_STATUSES, runner=self.token).update(
            status=OperationStatus.DONE, finished_at=now, in_flight=0, heartbeat_at=now
        )
        if finished:
            operation.refresh_from_db()
            record_audit(
                actor=None,
                action=f"operation.{operation.kind}.done",
                target=f"operation:{operation.pk}",
                filter=operation.filter,
                count=operation.succeeded,
                detail=f"succeeded {operation.succeeded}, failed {operation.failed}, skipped {operation.skipped}",
            )


# A stopped operation's boomerangs are counted on read (its page, its API) until this long after it finished: they
# come back within minutes as a rule, later only when a TTL kept them in a queue. Past it, its figures stand.
CAME_BACK_WATCH = dt.timedelta(days=1)
# A page or an API read counts again at most this often for each operation.
RECOUNT_ON_READ_SECONDS = 5


def refresh_came_back(*, operation: Operation, now: dt.datetime | None = None, on_read: bool = False) -> bool:
    """Count again what came back of an operation no worker is running: paused (a failed canary paused it on the
    first boomerang, and the others arrive after), cancelled, done, or waiting for a worker. A running worker counts
    its own every few seconds. True when the figures changed (the row and `operation` are updated).

    `on_read` (its page, its API): at most once per RECOUNT_ON_READ_SECONDS for each operation, across every web
    process (the shared cache), so that pages polling it, or many readers, cost one count, however many boomerangs
    there are; with the cache out of reach, the figures stand until the sweep counts them."""
    now = now or timezone.now()
    if not operation.publishes or operation.started_at is None or operation.items_removed_at is not None:
        return False
    if operation.status in ACTIVE_STATUSES and operation.runner:
        return False
    if operation.finished_at is not None and now - operation.finished_at > CAME_BACK_WATCH:
        return False
    if on_read:
        try:
            if not cache.add(f"came-back-counted:{operation.pk}", True, timeout=RECOUNT_ON_READ_SECONDS):
                return False
        except Exception:  # noqa: BLE001  (any error of the cache's backend: the sweep counts instead)
            logger.warning("the cache cannot be reached; operation %s is counted by the sweep", operation.pk)
            return False
    came_back = count_came_back(operation=operation)
    if came_back.count == operation.returned and came_back == CameBack.of(operation):
        return False
    Operation.objects.filter(pk=operation.pk).update(returned=came_back.count, returned_reasons=came_back.reasons)
    operation.returned, operation.returned_reasons = came_back.count, came_back.reasons
    return True
