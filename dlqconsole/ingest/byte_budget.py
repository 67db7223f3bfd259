"""How much consume_dlq holds: the byte budget over the bodies received and not acked, and each queue's prefetch.

Every delivery received and not yet acked is held in this process, and a DLQ can hold messages of any size. The
bodies held are counted; past DLQ_CONSUMER_MAX_BYTES the loop stops reading the connection (the broker keeps the
rest; TCP flow control stops it sending) and writes what it holds, reading a little once a second only to keep
heartbeats going, until an acked batch brings it under the budget again. A batch is written when it reaches the
batch size or DLQ_CONSUMER_BATCH_BYTES of bodies, whichever comes first. So that what the broker has sent towards
a paused consumer stays small too (in its memory, out of reach of the other consumers), each queue's prefetch is
its share of the budget divided by the largest body lately seen on it (at most DLQ_CONSUMER_PREFETCH): it shrinks
at once when large messages come, by consuming again with the smaller prefetch (pika returns what arrived
meanwhile to the queue), and grows back slowly when they are gone.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable

from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

from dlqconsole.ingest.batch_writer import Delivery

# consume_dlq logs under the consumer's name, whichever of its modules a step lives in, so that one logger
# configures (and filters) all of it.
log = logging.getLogger("dlqconsole.ingest.consumer")

# Over the byte budget, the connection is read this often (about 100 KB a time, pika's read per event) so that
# heartbeats keep it alive while the held deliveries are written.
FULL_READ_SECONDS = 1.0
# A queue's prefetch assumes bodies of this size until its first delivery, and grows again no sooner than this
# after it shrank.
ASSUMED_BODY_BYTES = 1024 * 1024
PREFETCH_GROWTH_SECONDS = 5.0


class ByteBudget(ABC):
    """The steps of DeadLetterConsumer that keep what it holds within the budget (a mixin of the consumer)."""

    # The consumer's state these steps read and change, set up by DeadLetterConsumer.__init__.
    prefetch: int
    max_bytes: int
    poll_seconds: float
    clock: Callable[[], float]
    channels: dict[str, BlockingChannel]
    held_bytes: int
    next_full_read: float
    full_since: float | None
    largest: dict[str, int]
    prefetch_of: dict[str, int]
    prefetch_shrunk_at: dict[str, float]
    resize: set[str]

    @abstractmethod
    def consume(self, queue: str, channel: BlockingChannel, prefetch: int) -> None:
        """Start the queue's consumer on its channel with this prefetch (a step of the broker side)."""

    @property
    def full(self) -> bool:
        """Holding the byte budget or more: stop reading deliveries until a batch is acked."""
        return self.held_bytes >= self.max_bytes

    def read_while_full(self, connection: BlockingConnection) -> None:
        """Over the byte budget: read the connection only once a FULL_READ_SECONDS (heartbeats), else wait a moment
        for the writer."""
        now = self.clock()
        if self.full_since is None:
            self.full_since = now
            log.info(
                "holding %.1f MB of dead letters, over DLQ_CONSUMER_MAX_BYTES (%.1f MB): reading paused until a "
                "batch is written",
                self.held_bytes / 2**20,
                self.max_bytes / 2**20,
            )
        if now >= self.next_full_read:
            self.next_full_read = now + FULL_READ_SECONDS
            connection.process_data_events(time_limit=0)
        else:
            time.sleep(min(self.poll_seconds, 0.01))

    def wanted_prefetch(self, queue: str) -> int:
        """The queue's share of the byte budget in bodies of the largest size lately seen on it."""
        share = self.max_bytes // max(1, len(self.channels))
        return max(1, min(self.prefetch, share // max(1, self.largest.get(queue, ASSUMED_BODY_BYTES))))

    def adjust_prefetch(self) -> None:
        """Consume again, with the wanted prefetch, the queues marked for it. RabbitMQ applies a prefetch to the
        consumers started after it: the consumer is cancelled (pika returns the deliveries that arrived for it
        meanwhile to the queue; those received stay ours to ack) and started again."""
        queues, self.resize = sorted(self.resize), set()
        for queue in queues:
            channel = self.channels.get(queue)
            wanted = self.wanted_prefetch(queue)
            if channel is None or not channel.is_open or wanted == self.prefetch_of.get(queue):
                continue
            # Worth an operator's attention only when large bodies shrink it; growing back, and the share that
            # changes as queues come and go, are routine.
            large = wanted < self.prefetch_of.get(queue, 0) and self.largest.get(queue, 0) > ASSUMED_BODY_BYTES
            log.log(
                logging.INFO if large else logging.DEBUG,
                "prefetch of %s: %d -> %d (bodies up to %.1f KB lately; budget %.1f MB)",
                queue,
                self.prefetch_of.get(queue, 0),
                wanted,
                self.largest.get(queue, 0) / 1024,
                self.max_bytes / 2**20,
            )
            channel.basic_cancel(consumer_tag=f"consume_dlq:{queue}")
            self.consume(queue, channel, wanted)

    def forget_sizes(self, batch: list[Delivery]) -> None:
        """Let the largest body seen on each queue of the batch fade (halved per batch unless seen again), and mark
        for a larger prefetch the queues that have been on a small one for a while."""
        largest: dict[str, int] = {}
        for delivery in batch:
            largest[delivery.queue] = max(largest.get(delivery.queue, 0), len(delivery.body))
        now = self.clock()
        for queue, size in largest.items():
            self.largest[queue] = max(size, self.largest.get(queue, size) // 2)
            wanted, current = self.wanted_prefetch(queue), self.prefetch_of.get(queue, self.prefetch)
            # At least twice as large, or all the way up to DLQ_CONSUMER_PREFETCH.
            grown = wanted > current and (wanted >= 2 * current or wanted == self.prefetch)
            shrunk_at = self.prefetch_shrunk_at.get(queue)
            if grown and (shrunk_at is None or now - shrunk_at >= PREFETCH_GROWTH_SECONDS):
                self.resize.add(queue)
