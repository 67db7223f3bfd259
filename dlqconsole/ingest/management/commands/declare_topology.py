"""`declare_topology QUEUE... [--broker NAME] [--quorum] [--delivery-limit N] [--message-ttl MS] [--max-length N]`.

Declares each QUEUE with its dead-letter exchange QUEUE.dlx and dead-letter queue QUEUE.dlq (see
dlqconsole.ingest.topology for the choices made), and records it so that consume_dlq drains QUEUE.dlq.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from dlqconsole.brokers import registry
from dlqconsole.ingest.topology import TopologyError, declare_queue_topology


class Command(BaseCommand):
    help = "Declare work queues with a dead-letter exchange QUEUE.dlx bound to QUEUE.dlq (idempotent)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("queues", nargs="+", metavar="QUEUE")
        parser.add_argument(
            "--broker", default="default", metavar="NAME", help="the broker to declare on (default: AMQP_URL)"
        )
        parser.add_argument("--quorum", action="store_true", help="Quorum queues (and a quorum DLQ).")
        parser.add_argument(
            "--delivery-limit", type=int, help="Quorum only: dead-letter a message returned more than N times."
        )
        parser.add_argument("--message-ttl", type=int, metavar="MS", help="Dead-letter messages older than MS ms.")
        parser.add_argument(
            "--max-length", type=int, metavar="N", help="At most N messages; the oldest is dead-lettered when full."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            broker = registry.get(options["broker"])
        except registry.UnknownBroker as error:
            raise CommandError(str(error)) from None
        for name in options["queues"]:
            try:
                topology = declare_queue_topology(
                    name=name,
                    quorum=options["quorum"],
                    delivery_limit=options["delivery_limit"],
                    message_ttl=options["message_ttl"],
                    max_length=options["max_length"],
                    broker=broker,
                )
            except TopologyError as error:
                raise CommandError(str(error)) from error
            on = "" if broker.is_default else f"[{broker.name}] "
            self.stdout.write(
                f"{on}{topology.name} ({topology.kind}) -> {topology.dead_letter_exchange} (fanout) -> "
                f"{topology.dead_letter_queue}  {topology.arguments}"
            )
