"""The circuit breakers in a run (see runner.py; the breaker itself is core/breaker.py, its thresholds breakers.py).

Before a batch goes out, each destination's breaker says how many of its messages may go (all while closed, none
while open, what is left of the probe while half-open); the rest are held back: pending again, passed over by the
cursor, and the take passes over further items for that destination without claiming them until the breaker may
let them go. Confirms and refusals go back to the breaker as they arrive (an unroutable return fails its item and
does not count). When nothing else is left the run waits: the Celery task schedules itself again for when the
breaker probes (no worker is held meanwhile), the CLI's --inline waits in process; the operation's page says what it
waits for.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections import Counter
from collections.abc import Hashable

from django.db.models import F
from django.utils import timezone

from dlqconsole.core.breaker import (
    CLOSED,
    CONFIRM,
    HALF_OPEN,
    NACK,
    RELEASE,
    BreakerState,
    BreakerUnavailable,
    Event,
)
from dlqconsole.core.publish import CONFIRMED, NACKED, Message, Outcome
from dlqconsole.operations.breakers import epoch_time, waiting_text
from dlqconsole.operations.destinations import Destination
from dlqconsole.operations.models import Operation
from dlqconsole.operations.pipeline import HELD, Claimed
from dlqconsole.operations.run_state import RunState

logger = logging.getLogger(__name__)

# A continuation runs at least this long after the wait began; one that comes this much early is a stray (a second
# chain started by the sweeper or a resume) and leaves the wait to the one that comes on time.
MIN_WAIT_SECONDS = 1.0
EARLY_SLACK_SECONDS = 2.0
# Waiting in process (without continue_later), the longest sleep between two heartbeats.
TICK_SECONDS = 1.0


class BreakerSteps(RunState):
    """The breaker gate, its reports and the wait for it, of OperationRunner."""

    def _blocked(self, destination: Destination) -> bool:
        """Whether the take passes over items for `destination` (its breaker said no, and its wait is not over)."""
        until = self.blocked.get(destination.limit_key)
        if until is None or until <= time.time():
            return False
        self.breaker_held[destination.limit_key] = destination
        return True

    def _gate(self, claimed: list[Claimed], messages: list[Message]) -> list[Message]:
        """The messages each destination's breaker lets go now; the others are held back."""
        destination_of: dict[Hashable, Destination] = {entry.letter.pk: entry.destination for entry in claimed}
        wanted = Counter(destination_of[message.key].limit_key for message in messages)
        grants: dict[str, int] = {}
        probing: set[str] = set()
        for message in messages:
            destination = destination_of[message.key]
            key = destination.limit_key
            if key not in grants:
                self.destination_of_key[key] = destination
                grants[key], half_open = self._allow(destination, wanted[key])
                if half_open:
                    probing.add(key)
        allowed: list[Message] = []
        held: list[Outcome] = []
        for message in messages:
            key = destination_of[message.key].limit_key
            if grants[key] > 0:
                grants[key] -= 1
                allowed.append(message)
                self.breaker_key_of[message.key] = key
                if key in probing:
                    self.probes.add(message.key)
            else:
                # No error: what it waits for is the operation's breaker_wait, and goes when the wait does.
                held.append(Outcome(message.key, HELD, ""))
        if held:
            self._sort_outcomes(held)
        return allowed

    def _allow(self, destination: Destination, wanted: int) -> tuple[int, bool]:
        key = destination.limit_key
        config = self.thresholds.for_key(key)
        try:
            allowance = self.breakers.allow(key, wanted, config=config)
        except BreakerUnavailable as error:
            # Fail open: the breakers guard the destination, they must not stop the replay of all of them.
            logger.warning("operation %s: %s; publishing without them", self.operation_id, error)
            return wanted, False
        if allowance.granted < wanted:
            self._note_blocked(destination, allowance.state)
        return allowance.granted, allowance.state.state == HALF_OPEN

    def _note_blocked(self, destination: Destination, state: BreakerState) -> None:
        key = destination.limit_key
        config = self.thresholds.for_key(key)
        self.blocked[key] = max(state.retry_at(config), time.time() + MIN_WAIT_SECONDS)
        self.breaker_held[key] = destination
        self.breaker_waits[key] = waiting_text(destination, state, config)

    def _report_outcomes(self, outcomes: list[Outcome]) -> None:
        """Tell each destination's breaker what its messages came to: a confirm, a refusal, or (for a probe) that it
        did not go out after all."""
        events: dict[str, list[Event]] = {}
        for outcome in outcomes:
            key = self.breaker_key_of.pop(outcome.key, None)
            if key is None:
                continue
            probe = outcome.key in self.probes
            self.probes.discard(outcome.key)
            if outcome.status == CONFIRMED:
                events.setdefault(key, []).append(Event(CONFIRM))
            elif outcome.status == NACKED:
                events.setdefault(key, []).append(Event(NACK, reason=outcome.error))
            elif probe:
                events.setdefault(key, []).append(Event(RELEASE))
        for key, reported in events.items():
            try:
                state = self.breakers.record(key, reported, config=self.thresholds.for_key(key))
            except BreakerUnavailable as error:
                logger.warning("operation %s: %s; outcomes not counted", self.operation_id, error)
                continue
            if not state.admits():
                destination = self.destination_of_key.get(key)
                if destination is not None:
                    self._note_blocked(destination, state)

    def _wait_for_breakers(self) -> bool:
        """Everything else is done and items wait for breakers: go again if one lets messages go now; else wait for
        the first to probe (the task schedules itself again and stops here; --inline sleeps). Replays that came back
        meanwhile do not pause it: the breaker is what guards their destination (see _breaker_guards)."""
        self._settle()
        waiting = dict(self.breaker_held)
        states: dict[str, BreakerState] = {}
        try:
            for key in waiting:
                states[key] = self.breakers.peek(key, config=self.thresholds.for_key(key))
        except BreakerUnavailable as error:
            logger.warning("operation %s: %s; going on without them", self.operation_id, error)
            states = {}
        if not states or any(state.admits() for state in states.values()):
            self._go_on()
            return True
        now = time.time()
        until = max(
            now + MIN_WAIT_SECONDS,
            min(state.retry_at(self.thresholds.for_key(key)) for key, state in states.items()),
        )
        text = "; ".join(
            waiting_text(waiting[key], state, self.thresholds.for_key(key)) for key, state in sorted(states.items())
        )
        Operation.objects.filter(pk=self.operation_id, runner=self.token).update(
            breaker_wait=text[:1000], breaker_wait_until=epoch_time(until), heartbeat_at=timezone.now()
        )
        logger.info("operation %s waits: %s", self.operation_id, text)
        if self.continue_later is not None:
            self.suspended = True
            self.continue_later(until - now)
            return True
        while (left := until - time.time()) > 0:
            time.sleep(min(left, TICK_SECONDS))
            if not self._heartbeat():
                return True
        self._go_on()
        return True

    def _breaker_guards(self) -> bool:
        """Whether a circuit breaker guards what this run publishes now: it holds items back, or the breaker of a
        destination it published to is not closed. Then too many replays coming back is the breaker's to handle
        (the run waits for its probe and goes on by itself), not a pause that waits for a person."""
        if self.breaker_held or self.blocked:
            return True
        try:
            return any(
                self.breakers.peek(key, config=self.thresholds.for_key(key)).state != CLOSED
                for key in list(self.destination_of_key)
            )
        except BreakerUnavailable:
            return False

    def _go_on(self) -> None:
        """Read every item passed over again."""
        self.breaker_held.clear()
        self.blocked.clear()
        with self.cursor_lock:
            self.cursor = 0
            self.look_for_in_flight = True
        # What came back while the breaker was open belongs to that episode: the share that pauses the operation
        # starts again from here, as after a resume.
        Operation.objects.filter(pk=self.operation_id).update(
            breaker_wait="",
            breaker_wait_until=None,
            returned_baseline=F("returned"),
            succeeded_baseline=F("succeeded"),
        )

    def _claimable_after(self, now: dt.datetime) -> dt.datetime:
        """A run started (by a continuation) before this waits for breakers still: a stray, not ours."""
        return now + dt.timedelta(seconds=EARLY_SLACK_SECONDS)
