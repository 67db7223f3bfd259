from __future__ import annotations

from django.db import models
from django.utils import timezone

from dlqconsole.brokers.models import broker_field


class WatchedQueue(models.Model):
    """A work queue and its dead-letter queue, as declared by `declare_topology` (or added in the admin).

    consume_dlq drains every watched DLQ when neither --queues nor DLQ_QUEUES names the queues, and the
    queue-depth sampler watches the work queue for backpressure.
    """

    class Kind(models.TextChoices):
        CLASSIC = "classic", "Classic"
        QUORUM = "quorum", "Quorum"

    broker = broker_field()
    name = models.CharField(max_length=255)
    dead_letter_queue = models.CharField(max_length=255)
    dead_letter_exchange = models.CharField(max_length=255)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.CLASSIC)
    arguments = models.JSONField(default=dict, blank=True)
    # Depth thresholds for the backpressure level of the work queue.
    warning_depth = models.IntegerField(default=50)
    critical_depth = models.IntegerField(default=200)
    emergency_depth = models.IntegerField(default=500)
    enabled = models.BooleanField(default=True)
    declared_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name", "broker"]
        constraints = [
            # One row per queue of a broker; the same names on another broker are other queues.
            models.UniqueConstraint(fields=["broker", "name"], name="watchedqueue_broker_name"),
            models.UniqueConstraint(fields=["broker", "dead_letter_queue"], name="watchedqueue_broker_dlq"),
        ]

    def __str__(self) -> str:
        return f"{self.name} -> {self.dead_letter_queue}"


class QueueSample(models.Model):
    """Depth and consumer count of a watched queue at one moment: growth rates, charts, backpressure."""

    broker = broker_field()
    queue = models.CharField(max_length=255)
    messages = models.BigIntegerField()
    consumers = models.IntegerField()
    sampled_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [
            # Charts and growth rates: one queue's samples over a window; retention deletes by time.
            models.Index(fields=["broker", "queue", "-sampled_at"], name="queuesample_broker_queue_time"),
            models.Index(fields=["sampled_at"], name="queuesample_time"),
        ]

    def __str__(self) -> str:
        return f"{self.queue}: {self.messages} at {self.sampled_at:%H:%M:%S}"


class IngestStat(models.Model):
    """Running ingest totals of one source (dead-letter) queue, for /metrics and the dashboard.

    consume_dlq adds each batch in the batch's own transaction, so the totals are exact across restarts and
    across several consumer processes, and the web process can read them (it cannot see a consumer's memory).
    """

    broker = broker_field()
    source_queue = models.CharField(max_length=255)
    # Deliveries taken from the queue and committed (including redelivered copies).
    received = models.BigIntegerField(default=0)
    # New DeadLetter rows; received - inserted = duplicates (redeliveries after a crash, at-least-once copies).
    inserted = models.BigIntegerField(default=0)
    duplicates = models.BigIntegerField(default=0)
    # Inserted rows whose envelope had parse problems (DeadLetter.parse_errors not empty).
    malformed = models.BigIntegerField(default=0)
    batches = models.BigIntegerField(default=0)
    last_batch_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["source_queue", "broker"]
        constraints = [models.UniqueConstraint(fields=["broker", "source_queue"], name="ingeststat_broker_queue")]

    def __str__(self) -> str:
        return f"{self.source_queue}: {self.inserted} inserted, {self.duplicates} duplicates"
