"""Concurrent consumers end in the same patterns as one: two batches filed at the same moment, and the same
stream through one consume_dlq process and through two competing ones (real RabbitMQ, PostgreSQL, processes)."""

from __future__ import annotations

import json
import re
import signal
import threading
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pika
import pytest
from django.db import connection

from dlqconsole.deadletters.models import (
    DeadLetter,
    DeadLetterCount,
    FailurePattern,
    Fingerprint,
    PatternCluster,
    PatternEvent,
)
from dlqconsole.ingest.services import ingest_batch
from tests.deadletters.conftest import assert_counts_exact, make_letter
from tests.ingest.conftest import ConsumerProcess
from tests.support import (
    DeadLetterQueue,
    declare_with_dlq,
    queue_depth,
    subprocess_database_url,
    wait_for_depth,
    wait_until,
)

CORPUS = Path(__file__).resolve().parents[1] / "data" / "error_corpus.jsonl"
# Causes whose messages differ in words no mask recognises (names, queues, tenants, regions) or that carry
# stack traces, plus look-alikes that must stay apart: the cases where the order of arrival could matter. An
# address of two to three words is merged across token counts.
CAUSES = {
    "py-address-free-text",
    "py-user-not-found",
    "py-user-disabled",
    "py-project-access",
    "py-tenant-quota",
    "py-queue-consumer",
    "py-region-capacity",
    "py-currency-unsupported",
    "py-publish-rejected:full",
    "py-publish-rejected:paused",
    "py-customer-blocked:fraud-suspected",
    "py-customer-blocked:manual-review",
    "py-order-transition:shipped-cancelled",
    "py-order-transition:cancelled-shipped",
    "py-requests-refused:payments-api-internal-v1-charges",
    "py-requests-refused:inventory-api-internal-v2-stock",
    "py-trace-none-label",
    "py-trace-none-notify",
    "java-npe-invoice",
    "go-panic-nil-label",
    "node-trace-undefined-sku",
    "py-int-literal",
    "go-json-invalid-char",
}


def stream() -> list[dict[str, str]]:
    with CORPUS.open(encoding="utf-8") as lines:
        rows = [json.loads(line) for line in lines]
    chosen = [row for row in rows if row["cause"] in CAUSES]
    assert {row["cause"] for row in chosen} == CAUSES
    return chosen


def publish(channel: Any, queue: DeadLetterQueue, rows: list[tuple[int, dict[str, str]]], *, wait: bool = True) -> None:
    """Publish (stream position, row) pairs in the order given; the message id names the stream position. With
    `wait`, until all of them are in the DLQ (nobody consuming it yet)."""
    for index, row in rows:
        headers = {"x-exception-message": row["message"]}
        if row["error_type"]:
            headers["x-exception-type"] = row["error_type"]
        if row["stack_trace"]:
            headers["x-exception-stacktrace"] = row["stack_trace"]
        channel.basic_publish(
            exchange="",
            routing_key=queue.work,
            body=json.dumps({"n": index}).encode(),
            properties=pika.BasicProperties(message_id=f"s-{index}", expiration="0", headers=headers),
        )
    if wait:
        assert wait_for_depth(channel, queue.dlq, len(rows), timeout=60) == len(rows)


SUMMARY = re.compile(r"^consume_dlq: (\d+) received, (\d+) new, (\d+) duplicates, .*, 0 database errors$", re.M)


def summary(process: ConsumerProcess) -> tuple[int, int]:
    """(received, new) from the command's closing line, which must say no database error happened."""
    (line,) = SUMMARY.findall(process.output)
    return int(line[0]), int(line[1])


def says(process: ConsumerProcess, text: str) -> bool:
    return text in process.output


def outcome() -> tuple[dict[str, tuple[str, str]], set[tuple[str, str, int]]]:
    """({message id: (pattern key, template)}, {(key, template, total) of every surviving pattern})."""
    patterns = {pattern.pk: pattern for pattern in FailurePattern.objects.all()}
    filed = {
        message_id: (patterns[pattern_id].key, patterns[pattern_id].template)
        for message_id, pattern_id in DeadLetter.objects.values_list("message_id", "pattern_id")
    }
    active = {
        (pattern.key, pattern.template, pattern.total_count)
        for pattern in patterns.values()
        if pattern.merged_into_id is None
    }
    return filed, active


def forget_everything() -> None:
    PatternEvent.objects.all().delete()
    DeadLetterCount.objects.all().delete()
    DeadLetter.objects.all().delete()
    Fingerprint.objects.all().delete()
    PatternCluster.objects.all().delete()
    FailurePattern.objects.update(merged_into=None)
    FailurePattern.objects.all().delete()


@pytest.fixture
def consumers(tmp_path: Path) -> Iterator[Callable[..., ConsumerProcess]]:
    started: list[ConsumerProcess] = []

    def start(*arguments: str) -> ConsumerProcess:
        process = ConsumerProcess(
            list(arguments),
            database_url=subprocess_database_url(),
            log_path=tmp_path / f"consume_dlq-{len(started)}.log",
            env={},
        )
        started.append(process)
        return process

    yield start
    for process in started:
        process.signal(signal.SIGKILL)
        process.kill()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_two_consumers_make_the_same_patterns_as_one(
    queue_name: Callable[[str], str], amqp_channel: Any, consumers: Callable[..., ConsumerProcess]
) -> None:
    queue = declare_with_dlq(amqp_channel, queue_name("grouping"))
    rows = list(enumerate(stream()))
    # One consumer process per command (on PostgreSQL the command would otherwise fork one per core): the first
    # run is one consumer, the second exactly two competing ones.
    options = ["--queues", queue.dlq, "--processes", "1", "--prefetch", "50", "--batch-seconds", "0.05"]

    publish(amqp_channel, queue, rows)
    alone = consumers(*options, "--batch-size", "17", "--exit-when-idle", "2")
    assert alone.wait() == 0, alone.output
    assert summary(alone) == (len(rows), len(rows))
    single_filed, single_patterns = outcome()
    assert_counts_exact()
    forget_everything()

    # Both consume before the first message dies, so the broker deals the stream out to the two of them (a
    # consumer started after a prefilled queue was published could find it already drained by the other).
    pair = [consumers(*options, "--batch-size", size, "--exit-when-idle", "10") for size in ("11", "23")]
    for process in pair:
        assert wait_until(partial(says, process, f"consuming {queue.dlq}"), timeout=60), process.output
    assert all(process.alive() for process in pair)
    publish(amqp_channel, queue, list(reversed(rows)), wait=False)
    assert [process.wait() for process in pair] == [0, 0], [process.output for process in pair]
    double_filed, double_patterns = outcome()

    assert len(single_filed) == len(double_filed) == len(rows)
    assert double_filed == single_filed
    assert double_patterns == single_patterns
    # Each of the two processes really took part of the stream, and between them they stored each message once.
    counts = [summary(process) for process in pair]
    assert all(received > 0 and new > 0 for received, new in counts), counts
    assert sum(new for _, new in counts) == len(rows) <= sum(received for received, _ in counts), counts
    assert_counts_exact()
    assert queue_depth(queue.dlq) == 0


@pytest.mark.django_db(transaction=True)
def test_two_consumers_filing_look_alikes_at_the_same_time_end_with_one_pattern() -> None:
    names = [("alice", "bob"), ("carol", "dave"), ("erin", "frank")]
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def consume(name: str) -> None:
        try:
            letters = [make_letter(f"{kind} {name} not found") for kind in ("user", "tenant", "queue")]
            barrier.wait(timeout=10)
            ingest_batch(letters=letters)
        except BaseException as error:  # noqa: BLE001  (reported by the main thread)
            errors.append(error)
        finally:
            connection.close()

    for pair in names:
        threads = [threading.Thread(target=consume, args=(name,)) for name in pair]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)

    assert not errors
    active = sorted(FailurePattern.objects.active().values_list("template", flat=True))
    assert active == ["queue <*> not found", "tenant <*> not found", "user <*> not found"]
    assert FailurePattern.objects.active().get(template="user <*> not found").total_count == 6
    assert_counts_exact()
