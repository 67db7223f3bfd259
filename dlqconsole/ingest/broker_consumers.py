"""consume_dlq over several brokers: one DeadLetterConsumer per broker, each in a thread of its own with its own
connection, reconnect loop and backoff, so one broker down, refusing the login or closing our connections never
stops the others.

The threads share the process (and its one core for Python): a process consumes every broker's DLQs, and the
supervisor runs several such processes. The brokers are read again every `refresh_seconds`: a broker added or
enabled in the admin is consumed within that time, one disabled or removed is stopped (its consumer writes and
acks what it holds first), and one whose URL or TLS settings were changed in the admin is stopped the same way and
started again with them. With --broker the set of names is fixed."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import fields

from django.db import DatabaseError, close_old_connections, connection

from dlqconsole.brokers import registry
from dlqconsole.brokers.models import Broker
from dlqconsole.ingest.consumer import ConsumerStats, DeadLetterConsumer

log = logging.getLogger("dlqconsole.ingest.consumer")

POLL_SECONDS = 0.2


class BrokerConsumers:
    """run(), stop() and stats, as a DeadLetterConsumer has, over every enabled broker (or the named ones)."""

    def __init__(
        self,
        make_consumer: Callable[[Broker], DeadLetterConsumer],
        *,
        broker_names: list[str] | None = None,
        refresh_seconds: float = 5.0,
        exit_when_idle: bool = False,
    ) -> None:
        self.make_consumer = make_consumer
        self.broker_names = broker_names or None
        self.refresh_seconds = refresh_seconds
        self.exit_when_idle = exit_when_idle
        self.consumers: dict[str, DeadLetterConsumer] = {}
        self.threads: dict[str, threading.Thread] = {}
        # The connection settings each running consumer was started with, and the consumers stopped to be started
        # again with new ones (once their thread ends).
        self.versions: dict[str, tuple[object, ...]] = {}
        self.restarting: set[str] = set()
        self.finished = ConsumerStats()
        self.stopping = threading.Event()
        self.failed: list[str] = []

    def wanted(self) -> list[Broker]:
        close_old_connections()
        if self.broker_names is not None:
            return registry.named(self.broker_names)
        return registry.brokers()

    def run(self) -> None:
        next_refresh = 0.0
        started = False
        while not self.stopping.is_set():
            # Exiting when idle (tests, one-off drains): the brokers are read once; the run ends with the last one.
            if time.monotonic() >= next_refresh and not (self.exit_when_idle and started):
                try:
                    self.refresh(self.wanted())
                    started = bool(self.threads)
                except DatabaseError as error:
                    log.warning("could not read the brokers (%s); trying again in %g s", error, self.refresh_seconds)
                next_refresh = time.monotonic() + self.refresh_seconds
            self.reap()
            if self.exit_when_idle and started and not self.threads:
                break
            self.stopping.wait(POLL_SECONDS)
        self.stop_all()
        connection.close()

    def refresh(self, brokers: list[Broker]) -> None:
        wanted = {broker.name: broker for broker in brokers}
        if not wanted and not self.threads:
            log.warning("no enabled broker to consume")
        for name, broker in wanted.items():
            if name not in self.threads:
                self.start(broker)
            elif self.versions.get(name) != _version(broker) and name not in self.restarting:
                log.info("broker %s: its connection settings changed; reconnecting with the new ones", name)
                self.restarting.add(name)
                self.consumers[name].stop()
        for name in [name for name in self.threads if name not in wanted]:
            log.info("broker %s is no longer enabled; stopping its consumer", name)
            self.consumers[name].stop()

    def start(self, broker: Broker) -> None:
        consumer = self.make_consumer(broker)
        thread = threading.Thread(
            target=self._run_one, args=(broker.name, consumer), name=f"consume_dlq-{broker.name}", daemon=True
        )
        self.consumers[broker.name] = consumer
        self.threads[broker.name] = thread
        self.versions[broker.name] = _version(broker)
        self.restarting.discard(broker.name)
        thread.start()

    def _run_one(self, name: str, consumer: DeadLetterConsumer) -> None:
        try:
            consumer.run()
        except Exception:  # noqa: BLE001  (one broker's consumer must not take the others down)
            log.exception("the consumer of broker %s stopped on an error", name)
            self.failed.append(name)
        finally:
            connection.close()

    def reap(self) -> None:
        """Fold the counts of consumers whose thread ended into `finished`."""
        for name, thread in list(self.threads.items()):
            if not thread.is_alive():
                del self.threads[name]
                _add(self.finished, self.consumers.pop(name).stats)

    def stop(self) -> None:
        """Ask every consumer to finish: each writes and acks its current batch, then closes its connection."""
        self.stopping.set()
        for consumer in list(self.consumers.values()):
            consumer.stop()

    def stop_all(self) -> None:
        for consumer in list(self.consumers.values()):
            consumer.stop()
        for thread in list(self.threads.values()):
            thread.join()
        self.reap()

    @property
    def stats(self) -> ConsumerStats:
        total = ConsumerStats()
        _add(total, self.finished)
        for consumer in list(self.consumers.values()):
            _add(total, consumer.stats)
        return total


def _version(broker: Broker) -> tuple[object, ...]:
    """What a consumer's connection is made from: a change in the admin reconnects it."""
    return (broker.url, broker.url_secret, broker.tls_ca_certificate, broker.tls_verify)


def _add(total: ConsumerStats, more: ConsumerStats) -> None:
    for item in fields(ConsumerStats):
        if item.name == "per_queue":
            total.per_queue.update(more.per_queue)
        else:
            setattr(total, item.name, getattr(total, item.name) + getattr(more, item.name))
