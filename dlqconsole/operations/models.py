"""Bulk recovery jobs (Operation, one OperationItem per dead letter, what a purge deleted) and automatic retry
policies."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings
from django.db import models
from django.urls import reverse
from django.utils import timezone

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.brokers.models import DEFAULT, Broker
from dlqconsole.core.ratelimit import parse_rate
from dlqconsole.deadletters.models import (
    DeadLetter,
    DeadLetterStatus,
)


class OperationKind(models.TextChoices):
    RETRY = "retry", "Retry"
    MOVE = "move", "Move"
    PURGE = "purge", "Purge"
    ARCHIVE = "archive", "Archive"
    RESTORE = "restore", "Restore"
    EDIT_RETRY = "edit_retry", "Edit and retry"
    # Take low-priority messages out of a live work queue into archived dead letters (shed.py).
    SHED = "shed", "Shed"


# What a message counts as once the operation has acted on it, for its figures ("29 replayed").
DONE_WORDS: dict[str, str] = {
    OperationKind.RETRY: "replayed",
    OperationKind.MOVE: "moved",
    OperationKind.PURGE: "deleted",
    OperationKind.ARCHIVE: "archived",
    OperationKind.RESTORE: "restored",
    OperationKind.EDIT_RETRY: "replayed",
    OperationKind.SHED: "shed",
}

# Kinds that publish to RabbitMQ (the others only change rows).
PUBLISHING_KINDS = frozenset({OperationKind.RETRY, OperationKind.MOVE, OperationKind.EDIT_RETRY})


# Statuses a dead letter may have for each kind to act on it: a filter may ask for any of ALLOWED; without a status
# filter, DEFAULT applies (so "retry queue X" never replays again what was replayed already).
_REPLAYABLE = frozenset(
    {
        DeadLetterStatus.PARKED,
        DeadLetterStatus.SCHEDULED,
        DeadLetterStatus.FAILED,
        DeadLetterStatus.REPLAYED,
        DeadLetterStatus.MOVED,
    }
)
_WAITING = frozenset({DeadLetterStatus.PARKED, DeadLetterStatus.SCHEDULED, DeadLetterStatus.FAILED})
ALLOWED_STATUSES: dict[str, frozenset[str]] = {
    OperationKind.RETRY: _REPLAYABLE,
    OperationKind.MOVE: _REPLAYABLE,
    OperationKind.EDIT_RETRY: _REPLAYABLE,
    OperationKind.ARCHIVE: _REPLAYABLE,
    OperationKind.RESTORE: frozenset({DeadLetterStatus.ARCHIVED}),
    OperationKind.PURGE: _REPLAYABLE | {DeadLetterStatus.ARCHIVED},
    # A shed acts on messages in a work queue, not on dead letters.
    OperationKind.SHED: frozenset(),
}
DEFAULT_STATUSES: dict[str, frozenset[str]] = {
    OperationKind.RETRY: _WAITING,
    OperationKind.MOVE: _WAITING,
    OperationKind.EDIT_RETRY: _WAITING,
    OperationKind.ARCHIVE: _REPLAYABLE,
    OperationKind.RESTORE: frozenset({DeadLetterStatus.ARCHIVED}),
    OperationKind.PURGE: _REPLAYABLE,
    OperationKind.SHED: frozenset(),
}


def eligible_statuses(kind: str, filter_statuses: list[str] | None = None) -> frozenset[str]:
    """The dead-letter statuses an operation of `kind` acts on, given the statuses its filter names."""
    if filter_statuses:
        return ALLOWED_STATUSES[kind] & frozenset(filter_statuses)
    return DEFAULT_STATUSES[kind]


def share_text(part: int, whole: int) -> str:
    """`part` as a share of `whole` in words: "40%", or "under 1%" rather than a canary of "0%"."""
    share = part / whole if whole else 0.0
    return "under 1%" if 0 < share < 0.005 else f"{share:.0%}"


class OperationStatus(models.TextChoices):
    PLANNED = "planned", "Planned"
    CANARY = "canary", "Canary"
    RUNNING = "running", "Running"
    PAUSED = "paused", "Paused"
    DONE = "done", "Done"
    CANCELLED = "cancelled", "Cancelled"
    FAILED = "failed", "Failed"


# A worker may run an operation in these states; the others wait for a person (planned, paused) or are over.
ACTIVE_STATUSES = frozenset({OperationStatus.CANARY, OperationStatus.RUNNING})
FINISHED_STATUSES = frozenset({OperationStatus.DONE, OperationStatus.CANCELLED, OperationStatus.FAILED})


class OperationQuerySet(models.QuerySet["Operation"]):
    def active(self) -> OperationQuerySet:
        return self.filter(status__in=ACTIVE_STATUSES)

    def unfinished(self) -> OperationQuerySet:
        return self.exclude(status__in=FINISHED_STATUSES)

    def stale(self, *, now: dt.datetime, stale_after: dt.timedelta) -> OperationQuerySet:
        """Active operations whose worker stopped sending heartbeats (killed, or its task was lost)."""
        limit = now - stale_after
        return self.active().filter(models.Q(heartbeat_at__lt=limit) | models.Q(heartbeat_at__isnull=True))


class Operation(models.Model):
    """One bulk job over a frozen set of dead letters: the UI, admin, CLI and metrics all read this row."""

    kind = models.CharField(max_length=16, choices=OperationKind.choices)
    # The DeadLetterFilter it was planned from (its to_dict form), kept for the record and the audit log.
    filter = models.JSONField(default=dict, blank=True)
    # Move: a queue (through the default exchange) or an exchange and routing key, on `target_broker` (empty:
    # each dead letter's own broker). A retry always goes back to the broker each dead letter came from.
    target_broker = models.ForeignKey(
        Broker, null=True, blank=True, on_delete=models.PROTECT, related_name="+", db_index=False
    )
    target_queue = models.CharField(max_length=255, blank=True)
    target_exchange = models.CharField(max_length=255, blank=True)
    target_routing_key = models.CharField(max_length=255, blank=True)
    # "N/period[:burst]", empty for no limit; can be changed while the operation runs.
    rate = models.CharField(max_length=32, blank=True)
    # The form submission that asked for it (a one-message retry from its page), so that the same form sent twice
    # starts one operation; empty for everything else.
    submission = models.CharField(max_length=64, blank=True, editable=False)
    canary_size = models.IntegerField(default=0)
    canary_wait_seconds = models.IntegerField(default=60)
    # When the canary's last message was confirmed and until when we watch for boomerangs.
    canary_until = models.DateTimeField(null=True, blank=True)
    canary_passed = models.BooleanField(default=False)  # its wait ended with none of its messages back
    canary_failed = models.BooleanField(default=False)  # one came back (or failed): it paused the operation
    # Pause automatically when more than this share of published messages came back to a DLQ.
    max_return_share = models.FloatField(default=0.2)
    automatic = models.BooleanField(default=False, help_text="Started by a retry policy, not a person.")
    status = models.CharField(max_length=16, choices=OperationStatus.choices, default=OperationStatus.PLANNED)
    pause_reason = models.TextField(blank=True)
    # Paused by its own safeguards (canary, returns, circuit breaker, an error), not by a person: this alerts.
    # db_default too: processes of the previous version, still running during a deploy, do not write it.
    paused_automatically = models.BooleanField(default=False, db_default=False)
    last_error = models.TextField(blank=True)

    total = models.IntegerField(default=0)
    succeeded = models.IntegerField(default=0)
    failed = models.IntegerField(default=0)
    skipped = models.IntegerField(default=0)
    in_flight = models.IntegerField(default=0)
    # Messages published more than once because a worker died before recording their confirms.
    duplicates = models.IntegerField(default=0)
    # Replayed messages that died again (distinct dead letters of ours that have a boomerang).
    returned = models.IntegerField(default=0)
    # Why they came back: {failure reason: count} of the dead letters counted in `returned`, by the reason their
    # first boomerang died with; null until counted. Nullable, so processes of the previous version, still running
    # during a deploy, insert operations without it.
    returned_reasons = models.JSONField(null=True, blank=True)
    # Published / returned counts when the operation was last resumed, so a resume starts a fresh window.
    returned_baseline = models.IntegerField(default=0)
    succeeded_baseline = models.IntegerField(default=0)

    # Counts by broker, by queue and by destination (name to count; a queue or destination on a broker other than
    # default is named "broker · queue") and the biggest patterns (id, template, count).
    breakdown = models.JSONField(default=dict, blank=True)
    unreplayable = models.IntegerField(default=0)
    # {reason text: count}, e.g. {"exchange 'shop' does not exist": 12}.
    unreplayable_reasons = models.JSONField(default=dict, blank=True)

    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # The worker running the operation writes this every few seconds; a stale one is re-queued by the sweeper.
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    runner = models.CharField(max_length=64, blank=True)
    # Waiting for a destination's circuit breaker (its items held back, no worker held): what it waits for, and when
    # it looks again (the sweeper leaves it alone until then).
    breaker_wait = models.CharField(max_length=1000, blank=True)
    breaker_wait_until = models.DateTimeField(null=True, blank=True)
    # When retention removed its item rows (DLQ_FINISHED_RETENTION_DAYS after it finished), and what they said,
    # written before the first goes: {"statuses": {status: n}, "not_attempted": n, "errors": [[error, n], ...]}
    # (operations/retention.py). Its figures, filter, author and times stay on this row, the record from then on.
    items_removed_at = models.DateTimeField(null=True, blank=True)
    items_summary = models.JSONField(null=True, blank=True)

    objects = OperationQuerySet.as_manager()

    class Meta:
        indexes = [
            # Operations page, newest first, optionally by status.
            models.Index(fields=["-created_at"], name="operation_created"),
            # The sweeper: active operations with a stale heartbeat.
            models.Index(fields=["status", "heartbeat_at"], name="operation_status_heartbeat"),
            # Retention: finished operations that still have their item rows, oldest first.
            models.Index(
                fields=["finished_at"], name="operation_items_kept", condition=models.Q(items_removed_at__isnull=True)
            ),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["submission"], condition=~models.Q(submission=""), name="operation_submission_once"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} #{self.pk} ({self.status})"

    def get_absolute_url(self) -> str:
        """The operation's console page, with its progress and controls (the admin's "View on site")."""
        return reverse("operations:detail", args=[self.pk])

    @property
    def processed(self) -> int:
        return self.succeeded + self.failed + self.skipped

    @property
    def remaining(self) -> int:
        return max(0, self.total - self.processed)

    @property
    def progress(self) -> float:
        """Share of items with an outcome, from 0.0 to 1.0."""
        if self.total == 0:
            return 1.0 if self.status in FINISHED_STATUSES else 0.0
        return min(1.0, self.processed / self.total)

    @property
    def pause_text(self) -> str:
        """The pause reason to show after the "Paused" chip: "paused by oper1" reads "by oper1" there, so the page
        says "Paused by oper1", not "Paused paused by oper1"."""
        reason = self.pause_reason.strip()
        return reason[len("paused ") :] if reason.lower().startswith("paused by ") else reason

    @property
    def done_word(self) -> str:
        """What its succeeded messages were: "replayed", "archived"..."""
        return DONE_WORDS.get(self.kind, "done")

    def bar(self, *, not_attempted: int = 0) -> list[tuple[str, float, float]]:
        """The progress bar's segments, (kind, left %, width %): done, failed, then skipped, each its own share
        of the plan, so that the bar never shows skipped or failed messages as done. `not_attempted` of the
        skipped (a cancel left them untouched) are left empty, as messages still waiting are."""
        if not self.total:
            return []
        segments = []
        left = 0.0
        for kind, count in (
            ("done", self.succeeded),
            ("failed", self.failed),
            ("skipped", max(0, self.skipped - not_attempted)),
        ):
            if count > 0:
                width = min(100.0 - left, count * 100 / self.total)
                segments.append((kind, round(left, 2), round(width, 2)))
                left += width
        return segments

    @property
    def outcome(self) -> tuple[str, str]:
        """(label, chip style) of its state: a finished operation whose messages failed says so in red, not as a
        green "Done", and a plan discarded before it started is not called a cancelled run."""
        if self.discarded:
            return "Discarded (never started)", self.status
        if self.waiting_for_breaker:
            # Its task comes back by itself when the breaker probes: no worker is meant to hold it meanwhile.
            return "Waiting for a circuit breaker", OperationStatus.PLANNED
        if self.waiting_for_worker_since is not None:
            # Not "Running" at 0%: nothing runs until a worker takes it.
            return "Waiting for a worker", OperationStatus.PLANNED
        if self.status == OperationStatus.DONE and self.failed:
            if self.failed >= self.total:
                return "Done: every message failed", "failed"
            return f"Done, {self.failed:,} failed", "failed"
        if self.status == OperationStatus.DONE and self.skipped and self.kind != OperationKind.SHED:
            # Skipped messages were not acted on (their status had changed, another operation held them...); a
            # shed's skipped are the messages it left in the queue, as meant.
            if not self.succeeded:
                return f"Done: nothing {self.done_word}, {self.skipped:,} skipped", "skipped"
            return f"Done, {self.skipped:,} skipped", self.status
        return self.get_status_display(), self.status

    @property
    def waiting_for_worker_since(self) -> dt.datetime | None:
        """Since when a started operation waits for a worker to take its task: active, and no worker holds it. None
        otherwise; a canary between two looks at its messages holds no worker either, by design: it is watching,
        not waiting.

        Nothing done yet: since its start (the sweeper's re-sends move its heartbeat, not that). Else since its
        resume, or the sweeper's last re-send after its worker went quiet (both write the heartbeat)."""
        if self.status not in ACTIVE_STATUSES or self.started_at is None or self.runner:
            return None
        if self.status == OperationStatus.CANARY and self.canary_until is not None:
            return None
        if self.breaker_wait_until is not None:
            # Waiting for a circuit breaker, by design; once that wait is over, for a worker to take its task.
            return None if self.waiting_for_breaker else self.breaker_wait_until
        if self.processed == 0 and self.in_flight == 0:
            return self.started_at
        return self.heartbeat_at or self.started_at

    @property
    def waiting_for_breaker(self) -> bool:
        """Active, its items held back by a destination's open circuit breaker, and its task scheduled to come back
        when the breaker probes (operations/breaking.py): no worker holds it meanwhile."""
        until = self.breaker_wait_until
        return self.status in ACTIVE_STATUSES and until is not None and until > timezone.now()

    @property
    def discarded(self) -> bool:
        """A plan cancelled before it started: its messages were skipped without anything being done to them."""
        return self.status == OperationStatus.CANCELLED and self.started_at is None

    @property
    def is_finished(self) -> bool:
        return self.status in FINISHED_STATUSES

    @property
    def publishes(self) -> bool:
        return self.kind in PUBLISHING_KINDS

    @property
    def nothing_replayable(self) -> bool:
        """A publishing plan none of whose messages can be replayed: starting it could only mark them all failed
        (the operation page and the admin offer no Start; start_operation(require_replayable=True) refuses it)."""
        reasons = self.unreplayable_reasons or {}
        return self.publishes and 0 < self.total <= sum(int(count) for count in reasons.values())

    @property
    def eta(self) -> dt.timedelta | None:
        """Time left: what is left of the canary's wait while it is watched, plus the rest of the messages at the
        rate limit when there is one (the pace so far would count pauses), else at the pace so far (not counting
        the canary's wait). None when nothing runs or there is no pace yet, and while it waits for a circuit
        breaker: how long that lasts is not known. (Its page shows none while it waits for a worker either.)"""
        if self.status not in ACTIVE_STATUSES or self.started_at is None:
            return None
        if self.waiting_for_breaker:
            return None
        now = timezone.now()
        wait = dt.timedelta(0)
        spent_waiting = dt.timedelta(0)
        if self.canary_until is not None:
            if self.status == OperationStatus.CANARY:
                wait = max(dt.timedelta(0), self.canary_until - now)
            wait_began = self.canary_until - dt.timedelta(seconds=self.canary_wait_seconds)
            spent_waiting = max(dt.timedelta(0), min(now, self.canary_until) - wait_began)
        if self.rate:
            try:
                return wait + dt.timedelta(seconds=self.remaining / parse_rate(self.rate).per_second)
            except (ValueError, ZeroDivisionError):
                pass
        elapsed = (now - self.started_at - spent_waiting).total_seconds()
        if elapsed <= 0 or self.processed == 0:
            return wait or None
        return wait + dt.timedelta(seconds=self.remaining * elapsed / self.processed)

    @property
    def canary_label(self) -> str:
        """How the canary went, in words: for the operation page and the admin."""
        if not self.canary_size:
            return ""
        if self.canary_failed:
            why = "failed: its messages came back" if self.returned else "failed: its messages could not be published"
            if self.status == OperationStatus.PAUSED:
                return why
            if self.status == OperationStatus.CANCELLED:
                return f"{why}; the operation was cancelled"
            return f"{why}; resumed by a person"
        if self.canary_passed:
            return "passed"
        if self.canary_until is None:
            if self.status == OperationStatus.PAUSED:
                return "paused before its wait; resuming goes on with the canary"
            return "not yet replayed" if self.status in (OperationStatus.PLANNED, OperationStatus.CANARY) else ""
        until = f"{timezone.localtime(self.canary_until):%H:%M:%S %Z}"
        if self.status == OperationStatus.CANARY:
            return f"watching until {until}"
        if self.status == OperationStatus.PAUSED:
            # A resume goes back to the watch; one that comes after `until` judges the canary at once.
            return f"paused during its wait; resuming goes on watching until {until}"
        if self.status == OperationStatus.CANCELLED:
            return "its wait was cut short: the operation was cancelled"
        # Resumed during its wait by an earlier version, which went on without finishing the watch.
        return "its wait was cut short by a pause"

    @property
    def canary_share(self) -> str:
        """What share of the plan its canary is ("" without a canary or messages)."""
        if not self.canary_size or not self.total:
            return ""
        return share_text(min(self.canary_size, self.total), self.total)

    @property
    def destination_queues(self) -> list[tuple[str, int, int]]:
        """(queue, ready messages, consumers) of each destination queue, as the broker told when planning."""
        found = (self.breakdown or {}).get("destination_queues") or {}
        return [
            (str(name), int(state.get("messages", 0)), int(state.get("consumers", 0)))
            for name, state in found.items()
            if isinstance(state, dict)
        ]

    @property
    def bindings_note(self) -> str:
        """Whether the plan checked that each destination exchange routes its key to a queue, and where."""
        return str((self.breakdown or {}).get("bindings") or "")

    @property
    def shed_plan(self) -> dict[str, Any]:
        """A shed's queue and flags, the queue as planned (depth, consumers, type, x-max-priority) and, once it ran,
        how far its scan looked and why it stopped; {} for every other kind."""
        found = (self.breakdown or {}).get("shed") if self.kind == OperationKind.SHED else None
        return found if isinstance(found, dict) else {}

    @property
    def broker_counts(self) -> list[tuple[str, int]]:
        """(broker, dead letters) of each broker the plan's set spans, biggest first."""
        found = (self.breakdown or {}).get("brokers") or {}
        counts = [(str(name), int(count)) for name, count in found.items()]
        return sorted(counts, key=lambda item: (-item[1], item[0]))

    @property
    def names_brokers(self) -> bool:
        """Whether its pages name brokers: its set or its target is on a broker other than default."""
        return self.target_broker_id is not None or any(name != DEFAULT for name, _ in self.broker_counts)

    @property
    def broker_span(self) -> str:
        """What a plan says before it starts when its set spans more than one broker ("This retry spans 2 brokers:
        production 120, staging 3"); "" otherwise."""
        counts = self.broker_counts
        if len(counts) < 2:
            return ""
        each = ", ".join(f"{name} {count:,}" for name, count in counts)
        return f"This {self.get_kind_display().lower()} spans {len(counts)} brokers: {each}"

    @property
    def target_display(self) -> str:
        if self.kind == OperationKind.SHED:
            on = "" if self.shed_plan.get("broker", DEFAULT) == DEFAULT else f" on broker {self.shed_plan['broker']}"
            return f"from queue {self.shed_plan.get('queue', '')}{on}"
        on = f" on broker {self.target_broker.name}" if self.target_broker_id is not None and self.target_broker else ""
        if not on and self.kind == OperationKind.MOVE and len(self.broker_counts) > 1:
            on = " on each dead letter's own broker"
        if self.target_queue:
            return f"queue {self.target_queue}{on}"
        if self.target_exchange:
            return f"exchange {self.target_exchange} / {self.target_routing_key}{on}"
        if self.kind in (OperationKind.RETRY, OperationKind.EDIT_RETRY):
            return "original queues" + (" on their own brokers" if len(self.broker_counts) > 1 else "")
        return ""


class ItemStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    # Marked before publishing, so a worker killed mid-chunk leaves a record of what may have gone out.
    IN_FLIGHT = "in_flight", "In flight"
    PUBLISHED = "published", "Published"
    DONE = "done", "Done"
    FAILED = "failed", "Failed"
    SKIPPED = "skipped", "Skipped"


class OperationItemQuerySet(models.QuerySet["OperationItem"]):
    def pending(self) -> OperationItemQuerySet:
        return self.filter(status=ItemStatus.PENDING)

    def succeeded(self) -> OperationItemQuerySet:
        return self.filter(status__in=[ItemStatus.PUBLISHED, ItemStatus.DONE])


class OperationItem(models.Model):
    """One dead letter of an operation and its outcome."""

    # No index of its own: (operation, id) and (operation, dead letter) below serve every lookup by operation.
    operation = models.ForeignKey(Operation, on_delete=models.CASCADE, related_name="items", db_index=False)
    # No database constraint: a purge deletes the dead letter but its item (and id) stays as the record.
    dead_letter = models.ForeignKey(
        DeadLetter, null=True, on_delete=models.DO_NOTHING, db_constraint=False, related_name="operation_items"
    )
    status = models.CharField(max_length=16, choices=ItemStatus.choices, default=ItemStatus.PENDING)
    attempts = models.IntegerField(default=0)
    error = models.TextField(blank=True)
    published_at = models.DateTimeField(null=True, blank=True)
    # Where it was published ("exchange / routing key"), for the record.
    destination = models.CharField(max_length=512, blank=True)

    objects = OperationItemQuerySet.as_manager()

    class Meta:
        indexes = [
            # The run loop: the next chunk of an operation's items by keyset. Status is deliberately in no index,
            # so that marking items in flight and recording outcomes are HOT updates (no index writes), which
            # with the table's fillfactor (migration 0002) keeps a chunk's bookkeeping cheap.
            models.Index(fields=["operation", "id"], name="opitem_operation_id"),
        ]
        constraints = [models.UniqueConstraint(fields=["operation", "dead_letter"], name="opitem_once")]

    def __str__(self) -> str:
        return f"#{self.dead_letter_id} {self.status}"


class PurgedDeadLetter(models.Model):
    """One dead letter a purge deleted, as it was when deleted: written in the transaction that deletes it, so a
    purge leaves a record of exactly what it took (its item keeps only the id). Kept as long as the purge's audit
    row (its start): the audit retention deletes both."""

    operation = models.ForeignKey(Operation, on_delete=models.CASCADE, related_name="purged", db_index=False)
    audit_entry = models.ForeignKey(AuditEntry, on_delete=models.CASCADE, related_name="purged_dead_letters")
    # Plain values, not keys: the dead letter is gone, and its pattern may be merged away later.
    dead_letter_id = models.BigIntegerField()
    message_id = models.CharField(max_length=255, blank=True)
    dedupe_key = models.CharField(max_length=80)
    # The broker's name, not a key: the record outlives the broker's row.
    broker_name = models.CharField(max_length=64, default="default")
    source_queue = models.CharField(max_length=255)
    pattern_id = models.BigIntegerField(null=True, blank=True)
    pattern_template = models.TextField(blank=True)
    status = models.CharField(max_length=16)
    ingested_at = models.DateTimeField()
    purged_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [
            # The purge's CSV download: its rows by keyset, in the order they were deleted.
            models.Index(fields=["operation", "id"], name="purged_operation_id"),
        ]

    def __str__(self) -> str:
        return f"#{self.dead_letter_id} purged by operation #{self.operation_id}"


# Models of this app kept in modules of their own (this one stays readable), imported here so that Django and the
# migrations find them, with the retry delay defaults the first migration names.
from dlqconsole.operations.breakers import BreakerSetting  # noqa: E402, F401
from dlqconsole.operations.policy_models import (  # noqa: E402, F401
    DEFAULT_RETRY_DELAYS,
    MAX_RETRY_DELAY_SECONDS,
    RetryPolicy,
    RetryPolicyQuerySet,
    SchedulerCursor,
    default_permanent_reasons,
    default_retry_delays,
)
