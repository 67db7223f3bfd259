"""The parts a run's pipeline is made of (see runner.py): the values passed from one step to the next, and the
lanes that run its database steps."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from django.db import connections

from dlqconsole.core.publish import Message, Outcome
from dlqconsole.operations.destinations import Destination

# The outcome of a message whose broker cannot be reached for now: back to pending, passed over by the cursor until
# the broker may be tried again (a NOT_SENT one is read again at once).
HELD = "held"


@dataclass
class Letter:
    """The columns of a dead letter that a replay needs (plain values: building model instances for thousands of
    rows a second costs more than publishing them)."""

    pk: int
    broker_id: int
    source_queue: str
    pattern_id: int
    failure_reason: str
    status: str
    original_queue: str
    original_exchange: str
    original_routing_keys: list[Any]
    headers: Any
    properties: Any
    body: bytes
    replay_count: int
    body_truncated: bool


@dataclass
class Claimed:
    item_pk: int
    resumed: bool
    letter: Letter
    destination: Destination


@dataclass
class Read:
    """An item read ahead (no lock, nothing marked) with its dead letter's message (None if it is gone)."""

    item_pk: int
    # The item's status when read: pending, or in flight (a leftover to publish again).
    status: str
    letter: Letter | None


@dataclass
class Batch:
    """A published batch waiting for its outcomes; `landed` resolves once they are recorded."""

    claimed: list[Claimed]
    outcomes: dict[Hashable, Outcome] = field(default_factory=dict)
    waiting: int = 0
    landed: Future[None] = field(default_factory=Future)


@dataclass
class Take:
    """What a take claimed for publishing, and how many failed at once (a missing exchange) with which error."""

    claimed: list[Claimed] = field(default_factory=list)
    failed: int = 0
    error: str = ""
    # The claimed ones' messages, built by the taker so the publishing thread only publishes.
    messages: list[Message] = field(default_factory=list)


class Lane:
    """Runs database steps in order: on a thread of their own (its own connection), or at once on the caller's."""

    def __init__(self, *, threaded: bool) -> None:
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="operation-db") if threaded else None

    def submit(self, step: Callable[..., Any], *args: Any) -> Future[Any]:
        if self.executor is not None:
            return self.executor.submit(step, *args)
        future: Future[Any] = Future()
        try:
            future.set_result(step(*args))
        except Exception as error:  # noqa: BLE001  (raised again by result(), as with the thread)
            future.set_exception(error)
        return future

    def close(self) -> None:
        if self.executor is not None:
            self.executor.submit(connections.close_all).result()
            self.executor.shutdown()


def land(target: Future[None], source: Future[None]) -> None:
    """Pass a record's result on to its batch's `landed`."""
    error = source.exception()
    if error is not None:
        target.set_exception(error)
    else:
        target.set_result(None)
