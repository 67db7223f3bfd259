"""Automatic retry policies (the models; policies.py schedules and starts their retries) and the scheduler's cursor."""

from __future__ import annotations

import datetime as dt

from django.db import models
from django.utils import timezone

from dlqconsole.brokers.models import Broker
from dlqconsole.deadletters.models import PERMANENT_REASONS, FailurePattern, FailureReason

DEFAULT_RETRY_DELAYS = [60, 300, 1800, 7200, 43200]
# The longest wait a retry policy may set: a year. Far longer overflows the date of the next retry, which failed
# the scheduler on every beat for every policy.
MAX_RETRY_DELAY_SECONDS = 365 * 24 * 3600


def default_retry_delays() -> list[int]:
    return list(DEFAULT_RETRY_DELAYS)


def default_permanent_reasons() -> list[str]:
    return sorted(str(reason) for reason in PERMANENT_REASONS)


class RetryPolicyQuerySet(models.QuerySet["RetryPolicy"]):
    def enabled(self) -> RetryPolicyQuerySet:
        return self.filter(enabled=True)


class RetryPolicy(models.Model):
    """Retry matching dead letters automatically with backoff. Empty scope fields match everything."""

    name = models.CharField(max_length=120)
    enabled = models.BooleanField(default=True)
    broker = models.ForeignKey(
        Broker,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        db_index=False,
        help_text="Only dead letters of this broker; empty for any.",
    )
    queue = models.CharField(max_length=255, blank=True, help_text="Source DLQ or original queue; empty for any.")
    failure_reason = models.CharField(max_length=32, choices=FailureReason.choices, blank=True)
    pattern = models.ForeignKey(FailurePattern, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    delays = models.JSONField(default=default_retry_delays, help_text="Seconds before each attempt.")
    max_attempts = models.IntegerField(default=5)
    permanent_reasons = models.JSONField(
        default=default_permanent_reasons, blank=True, help_text="Failure reasons never retried automatically."
    )
    rate = models.CharField(max_length=32, blank=True, help_text="Replay rate like 50/1s; empty for no limit.")
    created_at = models.DateTimeField(default=timezone.now)

    objects = RetryPolicyQuerySet.as_manager()

    class Meta:
        verbose_name_plural = "retry policies"
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def specificity(self) -> int:
        """The most specific matching policy wins: pattern beats queue beats broker beats reason beats catch-all."""
        return (
            (8 if self.pattern_id else 0)
            + (4 if self.queue else 0)
            + (2 if self.broker_id else 0)
            + (1 if self.failure_reason else 0)
        )

    def delay_for(self, attempt: int) -> dt.timedelta:
        """The wait before automatic attempt number `attempt` (0-based); the last delay repeats."""
        delays = [int(value) for value in self.delays] or DEFAULT_RETRY_DELAYS
        return dt.timedelta(seconds=min(max(0, delays[min(attempt, len(delays) - 1)]), MAX_RETRY_DELAY_SECONDS))


class SchedulerCursor(models.Model):
    """How far schedule_new_dead_letters has looked (the highest dead letter id it settled)."""

    name = models.CharField(max_length=64, unique=True)
    position = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.name} at {self.position}"
