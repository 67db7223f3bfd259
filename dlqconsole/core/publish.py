"""Confirmed publishing: a window of unconfirmed messages, publisher confirms and mandatory=True.

A blocking confirm per message caps a replay at a few hundred messages a second. `ConfirmedPublisher` runs pika's
SelectConnection in the calling thread instead: it keeps up to `window` messages unconfirmed, refills the window as
acks arrive, and reports one `Outcome` per message:

- confirmed: the broker took responsibility for it (basic.ack) and did not return it;
- returned: the broker could not route it (basic.return before its ack, because of mandatory=True);
- nacked: the broker refused it (basic.nack);
- unconfirmed: it went out but the connection or channel closed before its confirm, so it may or may not have
  arrived (publish it again to be sure: at least once);
- not_sent: it never went out (the caller halted, a rate wait was cut short, or the connection was lost first);
- unsendable: it cannot be written as an AMQP message (a header integer beyond 64 bits, an infinite number, a
  routing key over 255 bytes); pika encodes every frame before writing any, so the channel is unharmed.

A returned message carries no delivery tag, so each message names itself in a header (`key_header`): the return
callback reads it and the ack that follows on the same channel settles it as returned.
"""

from __future__ import annotations

import logging
import struct
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pika
import pika.exceptions
from pika import spec

from dlqconsole.core import replay_guard

logger = logging.getLogger(__name__)

CONFIRMED = "confirmed"
RETURNED = "returned"
NACKED = "nacked"
UNCONFIRMED = "unconfirmed"
NOT_SENT = "not_sent"
UNSENDABLE = "unsendable"
# What pika raises while encoding a message it cannot represent (before anything is written).
ENCODING_ERRORS = (
    pika.exceptions.UnsupportedAMQPFieldException,
    pika.exceptions.ShortStringTooLong,
    struct.error,
    UnicodeEncodeError,
    OverflowError,
)


class PublishError(Exception):
    """The publisher could not connect, or is not connected."""


@dataclass
class Message:
    key: Hashable
    exchange: str
    routing_key: str
    body: bytes
    properties: pika.BasicProperties = field(default_factory=pika.BasicProperties)


@dataclass(frozen=True)
class Outcome:
    key: Hashable
    status: str
    error: str = ""
    # Wall-clock time (epoch seconds) when the message was handed to the socket; None if never sent.
    published_at: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == CONFIRMED


# Frames held back while a pump publishes, at most: about a hundred small messages' frames go out in one write,
# and never more than HELD_BYTES (large bodies go out as they come).
HELD_FRAMES = 300
HELD_BYTES = 1 << 20


class _CoalescingConnection(pika.SelectConnection):
    """A SelectConnection that, while `holding`, joins the frames it is asked to send and hands them to the socket in
    one write. pika writes each frame on its own (three per message: method, header, body), and a send(2) per frame
    cost the publisher thread more than encoding the messages."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.holding = False
        self._held: list[bytes] = []
        self._held_bytes = 0
        super().__init__(*args, **kwargs)

    def _adapter_emit_data(self, data: bytes) -> None:
        if not self.holding:
            super()._adapter_emit_data(data)
            return
        self._held.append(data)
        self._held_bytes += len(data)
        if len(self._held) >= HELD_FRAMES or self._held_bytes >= HELD_BYTES:
            self.flush()

    def flush(self) -> None:
        """Write what is held; once the connection is closed there is nowhere to write it, and it is dropped."""
        held, self._held, self._held_bytes = self._held, [], 0
        if held and not self.is_closed:
            super()._adapter_emit_data(b"".join(held))


class ConfirmedPublisher:
    """Publish batches with windowed confirms. Not thread-safe: one publisher per thread."""

    def __init__(
        self,
        parameters: pika.ConnectionParameters,
        *,
        key_header: str,
        window: int = 1000,
        confirm_timeout: float = 30.0,
    ) -> None:
        self._parameters = parameters
        self._key_header = key_header
        self._window = max(1, window)
        self._confirm_timeout = confirm_timeout
        self._connection: _CoalescingConnection | None = None
        self._channel: Any = None
        self._ready = False
        self._closed_reason = ""
        self._next_tag = 0
        self._outstanding: OrderedDict[int, tuple[Message, float]] = OrderedDict()
        self._returned: dict[Hashable, str] = {}
        self._queue: deque[Message] = deque()
        self._outcomes: list[Outcome] = []
        self._delay_for: Callable[[Message], float] | None = None
        self._on_tick: Callable[[], bool] | None = None
        self._tick_seconds = 2.0
        self._halted = False
        self._wait_for_confirms = True
        self._first_tag = 1
        self._busy = False
        self._pump_timer: Any = None
        self._tick_timer: Any = None
        self._last_progress = time.monotonic()
        self.error = ""
        # Why each (exchange, routing key) published to is refused ("" when it is not), asked once per
        # destination: a replay never reaches the console's own Celery queues (core/replay_guard.py).
        self._shared_vhost = replay_guard.parameters_share_celery_vhost(parameters)
        self._refusals: dict[tuple[str, str], str] = {}

    # Connection lifecycle -------------------------------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        return self._ready

    def open(self) -> None:
        if self._ready:
            return
        self._closed_reason = ""
        self._connection = _CoalescingConnection(
            self._parameters,
            on_open_callback=self._on_connection_open,
            on_open_error_callback=self._on_open_error,
            on_close_callback=self._on_connection_closed,
        )
        self._run_until(lambda: self._ready or bool(self._closed_reason))
        if not self._ready:
            raise PublishError(self._closed_reason or "could not open a channel")

    def close(self) -> None:
        connection = self._connection
        if connection is None:
            return
        if connection.is_open or connection.is_opening:
            if connection.is_open:
                connection.close()
            self._run_until(lambda: connection.is_closed)
        self._ready = False
        self._connection = None

    def __enter__(self) -> ConfirmedPublisher:
        self.open()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _on_connection_open(self, connection: pika.SelectConnection) -> None:
        connection.channel(on_open_callback=self._on_channel_open)

    def _on_open_error(self, connection: pika.SelectConnection, error: BaseException | str) -> None:
        self._closed_reason = f"cannot connect to RabbitMQ: {error}"
        self._stop_loop()

    def _on_channel_open(self, channel: Any) -> None:
        self._channel = channel
        channel.add_on_close_callback(self._on_channel_closed)
        channel.add_on_return_callback(self._on_return)
        channel.confirm_delivery(ack_nack_callback=self._on_confirm, callback=self._on_confirm_selected)

    def _on_confirm_selected(self, frame: Any) -> None:
        self._next_tag = 0
        self._ready = True
        self._stop_loop()

    def _on_channel_closed(self, channel: Any, reason: BaseException) -> None:
        self._lost(f"channel closed: {reason}")
        connection = self._connection
        if connection is not None and connection.is_open:
            connection.close()

    def _on_connection_closed(self, connection: pika.SelectConnection, reason: BaseException) -> None:
        self._lost(f"connection closed: {reason}")
        self._stop_loop()

    def _lost(self, reason: str) -> None:
        self._ready = False
        self._closed_reason = self._closed_reason or reason
        for message, published_at in self._outstanding.values():
            self._outcomes.append(Outcome(message.key, UNCONFIRMED, reason, published_at))
        self._outstanding.clear()
        self._returned.clear()
        self._stop_loop()

    # Publishing ----------------------------------------------------------------------------------------------

    def publish(
        self,
        messages: Sequence[Message],
        *,
        delay_for: Callable[[Message], float] | None = None,
        on_tick: Callable[[], bool] | None = None,
        tick_seconds: float = 2.0,
        wait_for_confirms: bool = True,
    ) -> list[Outcome]:
        """Publish `messages` in order and wait for every confirm; one Outcome per message.

        `delay_for(message)` returns how long to wait before that message may go out (a rate limiter); it is
        asked again after the wait. `on_tick()` runs every `tick_seconds` while publishing; when it returns
        False, nothing more is sent (the rest are not_sent) and the confirms already due are awaited.

        With `wait_for_confirms=False` the call returns once every message is sent and every message of earlier
        calls is confirmed, with the outcomes that arrived meanwhile; this call's come with the next one, and
        `publish([])` waits for all. Confirms lag one call behind, so batches follow each other without waiting
        for the broker at each boundary, and a batch's outcomes are all in by the end of the next call.
        """
        if not self._ready or self._connection is None:
            raise PublishError(self._closed_reason or "the publisher is not open")
        self._queue = deque(messages)
        self._outcomes = []
        self._delay_for = delay_for
        self._on_tick = on_tick
        self._tick_seconds = tick_seconds
        self._halted = False
        self._wait_for_confirms = wait_for_confirms or not messages
        self._first_tag = self._next_tag + 1
        self.error = ""
        self._last_progress = time.monotonic()
        ioloop = self._connection.ioloop
        self._pump_timer = ioloop.call_later(0, self._pump)
        self._tick_timer = ioloop.call_later(tick_seconds, self._tick)
        self._busy = True
        try:
            self._run_until(self._batch_done)
        finally:
            self._busy = False
            for timer in (self._pump_timer, self._tick_timer):
                if timer is not None and self._connection is not None:
                    self._connection.ioloop.remove_timeout(timer)
            self._pump_timer = self._tick_timer = None
        while self._queue:
            self._outcomes.append(Outcome(self._queue.popleft().key, NOT_SENT, self.error or self._closed_reason))
        return self._outcomes

    def _batch_done(self) -> bool:
        if not self._ready:
            return True
        sent = self._halted or not self._queue
        if not sent or not self._outstanding:
            return sent
        if self._wait_for_confirms:
            return False
        # Tags grow, so the oldest unconfirmed message tells whether an earlier call still waits for confirms.
        return next(iter(self._outstanding)) >= self._first_tag

    @property
    def unconfirmed(self) -> int:
        """Messages sent whose confirm has not arrived yet."""
        return len(self._outstanding)

    def _pump(self) -> None:
        self._pump_timer = None
        connection = self._connection
        if not self._ready or connection is None:
            return
        connection.holding = True
        try:
            self._send_window()
        finally:
            connection.holding = False
            # A connection closing meanwhile still needs its Close frame written to finish closing; after a lost
            # connection the held frames go nowhere, and their messages are reported unconfirmed.
            connection.flush()
        self._maybe_finish()

    def _send_window(self) -> None:
        """Send queued messages while the window has room and the rate allows (frames held, written together)."""
        assert self._connection is not None
        while self._queue and not self._halted and len(self._outstanding) < self._window:
            message = self._queue[0]
            if self._delay_for is not None:
                try:
                    wait = self._delay_for(message)
                except Exception as error:  # noqa: BLE001  (a limiter failure halts the batch, it loses nothing)
                    self._halt(f"rate limiter failed: {error!r}")
                    break
                if wait > 0:
                    self._pump_timer = self._connection.ioloop.call_later(wait, self._pump)
                    return
            self._queue.popleft()
            refused = self._refusal(message)
            if refused:
                self._outcomes.append(Outcome(message.key, UNSENDABLE, f"refused: {refused}"))
                continue
            published_at = time.time()
            try:
                self._channel.basic_publish(
                    exchange=message.exchange,
                    routing_key=message.routing_key,
                    body=message.body,
                    properties=message.properties,
                    mandatory=True,
                )
            except ENCODING_ERRORS as error:
                self._outcomes.append(Outcome(message.key, UNSENDABLE, f"cannot be sent over AMQP: {_why(error)}"))
                continue
            except Exception as error:  # noqa: BLE001  (the channel went away under us)
                self._queue.appendleft(message)
                self._lost(f"publish failed: {error!r}")
                return
            self._next_tag += 1
            self._outstanding[self._next_tag] = (message, published_at)

    def _refusal(self, message: Message) -> str:
        destination = (message.exchange, message.routing_key)
        refused = self._refusals.get(destination)
        if refused is None:
            refused = self._refusals[destination] = replay_guard.refusal(
                message.exchange, message.routing_key, shared_vhost=self._shared_vhost
            )
        headers = message.properties.headers
        if not refused and headers and ("CC" in headers or "BCC" in headers):
            refused = replay_guard.header_refusal(message.exchange, headers, shared_vhost=self._shared_vhost)
        return refused

    def _on_return(
        self, channel: Any, method: spec.Basic.Return, properties: spec.BasicProperties, body: bytes
    ) -> None:
        key = (properties.headers or {}).get(self._key_header)
        if key is None:
            logger.warning("a returned message carries no %s header; it cannot be matched", self._key_header)
            return
        self._returned[key] = (
            f"unroutable: {method.reply_code} {method.reply_text} "
            f"(exchange {method.exchange!r}, routing key {method.routing_key!r})"
        )

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        acked = isinstance(method, spec.Basic.Ack)
        last = method.delivery_tag if method.multiple else None
        settled: list[int] = []
        if last is None:
            if method.delivery_tag in self._outstanding:
                settled.append(method.delivery_tag)
        else:
            for tag in self._outstanding:
                if tag > last:
                    break
                settled.append(tag)
        for tag in settled:
            message, published_at = self._outstanding.pop(tag)
            returned = self._returned.pop(message.key, None)
            if returned is not None:
                self._outcomes.append(Outcome(message.key, RETURNED, returned, published_at))
            elif acked:
                self._outcomes.append(Outcome(message.key, CONFIRMED, "", published_at))
            else:
                self._outcomes.append(Outcome(message.key, NACKED, "the broker refused it (basic.nack)", published_at))
        self._last_progress = time.monotonic()
        if self._pump_timer is None and self._queue and not self._halted:
            self._pump()
        else:
            self._maybe_finish()

    def _tick(self) -> None:
        self._tick_timer = None
        if not self._busy or self._connection is None:
            return
        if self._on_tick is not None and not self._halted:
            try:
                keep_going = self._on_tick()
            except Exception as error:  # noqa: BLE001  (stop sending, keep the confirms)
                keep_going = False
                self.error = f"tick failed: {error!r}"
            if not keep_going:
                self._halt(self.error)
        if self._outstanding and time.monotonic() - self._last_progress > self._confirm_timeout:
            self._closed_reason = f"no confirm from the broker for {self._confirm_timeout:.0f}s"
            if self._connection.is_open:
                self._connection.close()
        if self._busy and self._connection is not None:
            self._tick_timer = self._connection.ioloop.call_later(self._tick_seconds, self._tick)

    def _halt(self, error: str) -> None:
        self._halted = True
        self.error = self.error or error
        if self._pump_timer is not None and self._connection is not None:
            self._connection.ioloop.remove_timeout(self._pump_timer)
            self._pump_timer = None
        self._maybe_finish()

    def _maybe_finish(self) -> None:
        if self._busy and self._batch_done():
            self._stop_loop()

    # The loop ------------------------------------------------------------------------------------------------

    def _run_until(self, done: Callable[[], bool]) -> None:
        connection = self._connection
        if connection is None:
            return
        while not done():
            if connection.is_closed and not self._busy:
                return
            connection.ioloop.start()
            if connection.is_closed:
                break

    def _stop_loop(self) -> None:
        if self._connection is not None:
            self._connection.ioloop.stop()


def _why(error: BaseException) -> str:
    """pika's encoding errors in words: it names the value it could not encode, not the header holding it."""
    if isinstance(error, pika.exceptions.UnsupportedAMQPFieldException):
        value = error.args[-1] if error.args else None
        return f"a header value of type {type(value).__name__} ({str(value)[:40]}) has no AMQP encoding"
    if isinstance(error, pika.exceptions.ShortStringTooLong):
        return "a header name or routing key is longer than 255 bytes"
    if isinstance(error, struct.error):
        return f"a number does not fit its AMQP field ({error})"
    return f"{type(error).__name__}: {str(error)[:200]}"
