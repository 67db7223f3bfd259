from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings
from django.db import models
from django.urls import reverse
from django.utils import timezone

from dlqconsole.brokers.models import broker_field
from dlqconsole.deadletters.search import fallback_name, search_text


class DeathReason(models.TextChoices):
    """Why RabbitMQ dead-lettered the message (the `reason` of the newest x-death entry)."""

    REJECTED = "rejected", "Rejected"
    EXPIRED = "expired", "Expired (TTL)"
    MAXLEN = "maxlen", "Queue length limit"
    DELIVERY_LIMIT = "delivery_limit", "Delivery limit"
    UNKNOWN = "unknown", "Unknown"


class FailureReason(models.TextChoices):
    """What went wrong, classified from the error headers; falls back to the broker's death reason."""

    TIMEOUT = "TIMEOUT", "Timeout"
    NETWORK_ERROR = "NETWORK_ERROR", "Network error"
    RATE_LIMITED = "RATE_LIMITED", "Rate limited"
    VALIDATION_FAILED = "VALIDATION_FAILED", "Validation failed"
    AUTH = "AUTH", "Authentication / authorisation"
    NOT_FOUND = "NOT_FOUND", "Not found"
    CONFLICT = "CONFLICT", "Conflict"
    INTERNAL = "INTERNAL", "Internal error"
    EXPIRED = "EXPIRED", "Expired (TTL)"
    MAXLEN = "MAXLEN", "Queue overflow"
    DELIVERY_LIMIT = "DELIVERY_LIMIT", "Delivery limit reached"
    REJECTED = "REJECTED", "Rejected"
    UNKNOWN = "UNKNOWN", "Unknown"
    # Not a failure: taken out of a flooded work queue by a shed operation, kept archived until restored.
    SHED = "SHED", "Shed from a flooded queue"


# Reasons that will not go away by themselves: never retried automatically.
PERMANENT_REASONS = frozenset(
    {
        FailureReason.VALIDATION_FAILED,
        FailureReason.AUTH,
        FailureReason.NOT_FOUND,
        FailureReason.CONFLICT,
    }
)


class DeadLetterStatus(models.TextChoices):
    PARKED = "parked", "Parked"
    SCHEDULED = "scheduled", "Scheduled for retry"
    REPLAYED = "replayed", "Replayed"
    MOVED = "moved", "Moved"
    ARCHIVED = "archived", "Archived"
    FAILED = "failed", "Publish failed"  # a retry or a move the broker refused or could not route


# Statuses of dead letters whose work is done: retention deletes them after a while (operations/retention.py).
FINISHED_STATUSES = ["replayed", "moved", "archived"]


class PatternStatus(models.TextChoices):
    OPEN = "open", "Open"
    ACKNOWLEDGED = "acknowledged", "Acknowledged"
    RESOLVED = "resolved", "Resolved"
    IGNORED = "ignored", "Ignored"


# How long after its first dead letter a pattern is marked new on the pages.
NEW_PATTERN_AGE = dt.timedelta(hours=1)


class PatternOrigin(models.TextChoices):
    TEXT = "text", "Message text"
    MINED = "mined", "Mined template"
    TRACE = "trace", "Stack trace"
    RULE = "rule", "Rule"


class FailurePatternQuerySet(models.QuerySet["FailurePattern"]):
    def active(self) -> FailurePatternQuerySet:
        """Patterns that were not absorbed into another one by a merge."""
        return self.filter(merged_into__isnull=True)

    def alerting(self) -> FailurePatternQuerySet:
        return self.active().exclude(status=PatternStatus.IGNORED)


class FailurePattern(models.Model):
    """A group of dead letters that share one cause."""

    # A stable hash of (error type, masked message); the same in every process and across restarts.
    key = models.CharField(max_length=64, unique=True)
    template = models.TextField()
    error_type = models.CharField(max_length=255, blank=True)
    failure_reason = models.CharField(max_length=32, choices=FailureReason.choices, default=FailureReason.UNKNOWN)
    transient = models.BooleanField(default=True)
    # Every dead letter ever grouped here (survives replays and purges); current counts live in DeadLetterCount.
    total_count = models.BigIntegerField(default=0)
    first_seen_at = models.DateTimeField(default=timezone.now)
    last_seen_at = models.DateTimeField(default=timezone.now)
    status = models.CharField(max_length=16, choices=PatternStatus.choices, default=PatternStatus.OPEN)
    status_changed_at = models.DateTimeField(default=timezone.now)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    note = models.TextField(blank=True)
    # Set when an operator (or the automatic merge) folds this pattern into another one; new arrivals whose
    # fingerprint is this key are then filed under the target, so the decision sticks.
    merged_into = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="absorbed")
    merged_at = models.DateTimeField(null=True, blank=True)
    # How the pattern came about: one masked message, a template mined from several, a stack trace signature,
    # or an operator's rule (a custom fingerprint rule or a split).
    origin = models.CharField(max_length=16, choices=PatternOrigin.choices, default=PatternOrigin.TEXT)
    # The template as template mining compares it (tokens with the space before each, `<*>` for a variable),
    # for a pattern that grouping made from message text; empty otherwise.
    tokens = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = FailurePatternQuerySet.as_manager()

    class Meta:
        indexes = [
            # Patterns page and dashboard: most recent activity first.
            models.Index(fields=["-last_seen_at"], name="pattern_last_seen"),
            # Triage filters and the "patterns by status" metric.
            models.Index(fields=["status", "-last_seen_at"], name="pattern_status_seen"),
        ]

    def __str__(self) -> str:
        return self.template[:120]

    def get_absolute_url(self) -> str:
        """The pattern's console page (the admin's "View on site" goes there)."""
        return reverse("deadletters:pattern", args=[self.pk])

    @property
    def is_new(self) -> bool:
        """First seen within the last hour: the pages mark it, so "is it new?" needs no column."""
        return self.first_seen_at >= timezone.now() - NEW_PATTERN_AGE


class DeadLetterQuerySet(models.QuerySet["DeadLetter"]):
    def parked(self) -> DeadLetterQuerySet:
        return self.filter(status=DeadLetterStatus.PARKED)

    def visible(self) -> DeadLetterQuerySet:
        """What default views show: archived dead letters are hidden until restored."""
        return self.exclude(status=DeadLetterStatus.ARCHIVED)

    def in_queue(self, name: str) -> DeadLetterQuerySet:
        return self.filter(source_queue=name)


class DeadLetter(models.Model):
    """One dead-lettered message, exactly as the broker delivered it, plus what we parsed out of it."""

    # Identity: a hash of everything the broker delivered (queue, properties, headers with the death history, body),
    # so a redelivered copy of the same dead letter is one row while the same message dying again is another. A
    # first delivery (not marked redelivered) is never dropped: one whose hash is stored already is a further
    # occurrence, keyed "<hash>:<random>" and linked to the first by identical_to (see ingest/services.py).
    # Unique through a constraint in Meta rather than unique=True: on PostgreSQL that would add a second,
    # LIKE-friendly index that no query uses and every ingested row pays for.
    dedupe_key = models.CharField(max_length=80)
    # The first stored dead letter identical to this one in every byte, when this is a further occurrence. No
    # database constraint: purging the first must not touch (or scan for) its copies; a link may outlive it.
    identical_to = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,
        related_name="identical_copies",
    )
    # The broker the dead letter was consumed from, and that a replay returns it to.
    broker = broker_field()
    source_queue = models.CharField(max_length=255)
    original_queue = models.CharField(max_length=255, blank=True)
    original_exchange = models.CharField(max_length=255, blank=True)
    original_routing_keys = models.JSONField(default=list)
    death_reason = models.CharField(max_length=16, choices=DeathReason.choices, default=DeathReason.UNKNOWN)
    failure_reason = models.CharField(max_length=32, choices=FailureReason.choices, default=FailureReason.UNKNOWN)
    transient = models.BooleanField(default=True)
    error_type = models.CharField(max_length=255, blank=True)
    error_message = models.TextField(blank=True)
    stack_trace = models.TextField(blank=True)
    attempt_count = models.IntegerField(default=1)
    first_failed_at = models.DateTimeField(null=True, blank=True)
    last_failed_at = models.DateTimeField(null=True, blank=True)
    ingested_at = models.DateTimeField(default=timezone.now)
    host = models.CharField(max_length=255, blank=True)
    app_version = models.CharField(max_length=64, blank=True)
    message_id = models.CharField(max_length=255, blank=True)
    correlation_id = models.CharField(max_length=255, blank=True)
    priority = models.SmallIntegerField(null=True, blank=True)
    content_type = models.CharField(max_length=255, blank=True)
    content_encoding = models.CharField(max_length=255, blank=True)
    task_name = models.CharField(max_length=255, blank=True)
    task_id = models.CharField(max_length=255, blank=True)
    task_retries = models.IntegerField(null=True, blank=True)
    # Headers and properties in the lossless tagged JSON of core.jsonsafe (bytes, timestamps, decimals survive).
    headers = models.JSONField(default=dict)
    properties = models.JSONField(default=dict)
    x_death = models.JSONField(default=list)
    body = models.BinaryField()
    # The size of the body as delivered; larger than `body` when the body was cut at DLQ_MAX_BODY_BYTES.
    body_size = models.IntegerField(default=0)
    # Cut at ingest (its full size and hash are in parse_errors): a replay would send a different message.
    body_truncated = models.BooleanField(default=False)
    # Problems met while parsing the envelope; the message is stored all the same.
    parse_errors = models.JSONField(default=list)
    fingerprint = models.CharField(max_length=64)
    # What the text search reads (deadletters/search.py), written with the row; NULL until computed for rows stored
    # before the column existed. A trigram index on PostgreSQL (migration 0018) serves it.
    search_text = models.TextField(null=True, blank=True, editable=False)  # noqa: DJ001  (NULL: not computed yet)
    # No index of its own: the (pattern, status, -id) index below serves every lookup by pattern.
    pattern = models.ForeignKey(FailurePattern, on_delete=models.PROTECT, related_name="dead_letters", db_index=False)
    status = models.CharField(max_length=16, choices=DeadLetterStatus.choices, default=DeadLetterStatus.PARKED)
    status_changed_at = models.DateTimeField(default=timezone.now)
    replay_count = models.IntegerField(default=0)
    next_retry_at = models.DateTimeField(null=True, blank=True)
    retry_exhausted = models.BooleanField(default=False)
    # A replayed message that dies again is a new row linked to the record it was replayed from.
    previous = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="boomerangs")
    # Edit-and-retry keeps the original and links the edited copy to it.
    edited_from = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="edits")

    objects = DeadLetterQuerySet.as_manager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["dedupe_key"], name="deadletter_dedupe_key")]
        indexes = [
            # Messages page, unfiltered: keyset pagination newest first.
            models.Index(fields=["status", "-id"], name="deadletter_status_id"),
            # Messages filtered by queue, and the per-queue oldest / newest parked letter.
            models.Index(fields=["source_queue", "status", "-id"], name="deadletter_queue_status_id"),
            # Messages filtered by broker.
            models.Index(fields=["broker", "status", "-id"], name="deadletter_broker_status_id"),
            # Pattern drill-down and bulk retry of a pattern.
            models.Index(fields=["pattern", "status", "-id"], name="deadletter_pattern_status_id"),
            # Filter by failure reason.
            models.Index(fields=["failure_reason", "status", "-id"], name="deadletter_reason_status_id"),
            # Age of the oldest parked dead letter (metrics, alerts) and time-range filters.
            models.Index(fields=["status", "ingested_at"], name="deadletter_status_ingested"),
            # Automatic retries: due dead letters.
            models.Index(
                fields=["next_retry_at"],
                name="deadletter_due_retry",
                condition=models.Q(status="scheduled"),
            ),
            # Lookups by message id (filters, boomerang linking).
            models.Index(fields=["message_id"], name="deadletter_message_id"),
            # Lookups by correlation id (filters: every dead letter of one business transaction).
            models.Index(fields=["correlation_id"], name="deadletter_correlation_id"),
            # Retention: finished dead letters by the time they finished; only those statuses are in this index.
            models.Index(
                fields=["status_changed_at"],
                name="deadletter_finished_changed",
                condition=models.Q(status__in=FINISHED_STATUSES),
            ),
            # Rows whose search text is not computed yet (stored before the column): the search reads them apart,
            # and beat fills them in; empty once they are.
            models.Index(fields=["id"], name="deadletter_search_pending", condition=models.Q(search_text__isnull=True)),
            # A dead letter's page lists its identical copies; only copies are in this index.
            models.Index(
                fields=["identical_to"],
                name="deadletter_identical_to",
                condition=models.Q(identical_to__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.source_queue} #{self.pk}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.search_text is None:
            self.search_text = search_text(
                self.error_type, self.error_message, self.body or b"", fallback=fallback_name(self)
            )
        super().save(*args, **kwargs)

    def get_absolute_url(self) -> str:
        return reverse("deadletters:message", args=[self.pk])


class DeadLetterCount(models.Model):
    """How many dead letters sit in each (queue, pattern, reason, status) cell.

    Kept up to date by every write that adds dead letters or changes their status, so pages, alerts and
    metrics read a few hundred small rows instead of counting millions.
    """

    broker = broker_field()
    source_queue = models.CharField(max_length=255)
    pattern = models.ForeignKey(FailurePattern, on_delete=models.CASCADE, related_name="counts")
    failure_reason = models.CharField(max_length=32, choices=FailureReason.choices)
    status = models.CharField(max_length=16, choices=DeadLetterStatus.choices)
    count = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["broker", "source_queue", "pattern", "failure_reason", "status"],
                name="deadletter_count_broker_cell",
            )
        ]

    def __str__(self) -> str:
        return f"{self.source_queue} {self.status} {self.failure_reason}: {self.count}"


class HourIds(models.Model):
    """The lowest and the highest id of the dead letters whose ingested_at falls in each hour (UTC), so that a time
    window becomes an id range the newest-first lists can start from (deadletters/time_bounds.py).

    Kept on PostgreSQL by triggers on the dead letters' table (migration 0019), in the transaction that writes the
    rows, whoever writes them: every dead letter's id lies within its hour's range. Deleting dead letters leaves the
    ranges as they are (still true bounds, only wider). Not kept on other databases, which do not read it."""

    hour = models.DateTimeField(primary_key=True)
    min_id = models.BigIntegerField()
    max_id = models.BigIntegerField()

    def __str__(self) -> str:
        return f"{self.hour:%Y-%m-%d %H}:00 ids {self.min_id} to {self.max_id}"


# Arrival counts are kept this long: the longest chart window (24 hours) with a margin, so a chart never reads a
# pruned minute. Older ones are deleted by the app's hourly retention task.
ARRIVAL_COUNT_RETENTION = dt.timedelta(days=3)


class ArrivalCount(models.Model):
    """How many dead letters arrived in each minute, per source queue.

    Arrivals are events: ingest adds each batch's newly stored dead letters here in the batch's transaction, and
    nothing ever lowers a count. The dashboard's arrival charts read these rows, so purging dead letters, archive
    retention or replays do not make past arrivals vanish from them (counting stored rows would).
    """

    # The start of the minute (UTC) in which ingest stored the dead letters.
    minute = models.DateTimeField()
    broker = broker_field()
    source_queue = models.CharField(max_length=255)
    count = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            # Ingest's upsert, and the charts' and pruning's range reads on the minute.
            models.UniqueConstraint(
                fields=["minute", "broker", "source_queue"], name="arrival_count_minute_broker_queue"
            )
        ]

    def __str__(self) -> str:
        return f"{self.source_queue} {self.minute:%Y-%m-%d %H:%M}: {self.count}"


class PatternArrivalCount(models.Model):
    """How many dead letters arrived in each hour, per pattern: the patterns' sparklines.

    Like ArrivalCount, events that ingest records in the batch's transaction, so a purge or archive retention
    does not flatten a pattern's trend. They move with the dead letters: a merge moves all of a pattern's
    counts (purged arrivals included), a split or regrouping moves those of the dead letters it moves (counted
    from the stored rows, so the purged ones of a split-off part stay with the pattern they arrived in).
    """

    pattern = models.ForeignKey(FailurePattern, on_delete=models.CASCADE, related_name="+", db_index=False)
    # The start of the hour (UTC) in which ingest stored the dead letters.
    hour = models.DateTimeField()
    count = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            # Ingest's upsert, and the sparklines' reads of a page's patterns over the last day.
            models.UniqueConstraint(fields=["pattern", "hour"], name="pattern_arrival_count_pattern_hour")
        ]

    def __str__(self) -> str:
        return f"pattern #{self.pattern_id} {self.hour:%Y-%m-%d %H:00}: {self.count}"


class PatternEvent(models.Model):
    """History of a pattern: triage status changes, merges, splits, reopenings."""

    class Kind(models.TextChoices):
        CREATED = "created", "Created"
        STATUS = "status", "Status changed"
        REOPENED = "reopened", "Reopened"
        MERGED = "merged", "Merged"
        SPLIT = "split", "Split"
        NOTE = "note", "Note / owner changed"

    pattern = models.ForeignKey(FailurePattern, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    from_status = models.CharField(max_length=16, blank=True)
    to_status = models.CharField(max_length=16, blank=True)
    detail = models.TextField(blank=True)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            # Alert evaluation and /metrics: recent reopenings and creations across all patterns.
            models.Index(fields=["kind", "-created_at"], name="patternevent_kind_created"),
        ]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {self.from_status}->{self.to_status}"


class PatternCluster(models.Model):
    """The fingerprints that template mining compares with one another: one error type, one failure reason, one
    first word (mining never makes the first word a variable; templates of every length are compared, so one
    cluster holds them all). Its row is the lock a consumer holds while it decides the cluster's grouping, so
    concurrent consumers decide one after the other, each from everything the others committed."""

    key = models.CharField(max_length=64, unique=True)
    error_type = models.CharField(max_length=255, blank=True)
    failure_reason = models.CharField(max_length=32, choices=FailureReason.choices)
    anchor = models.CharField(max_length=255, blank=True, help_text="The first word of its messages.")
    # How many fingerprints it holds (kept by ingest under the cluster lock): large clusters take a quicker path.
    size = models.IntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.error_type or '(no type)'} / {self.failure_reason} / “{self.anchor}”"


class FingerprintKind(models.TextChoices):
    TEXT = "text", "Message text"
    TRACE = "trace", "Stack trace"
    EMPTY = "empty", "No error text"
    RULE = "rule", "Rule"


class Fingerprint(models.Model):
    """One distinct fingerprint (a masked message, a stack trace signature, or a rule) and where it is filed.

    `pattern` is where new dead letters with this fingerprint go, after every merge (ingest reads it, and
    never follows merge chains); `auto_pattern` is what automatic grouping chose, before operators' merges.
    """

    key = models.CharField(max_length=64, unique=True)
    kind = models.CharField(max_length=8, choices=FingerprintKind.choices, default=FingerprintKind.TEXT)
    template = models.TextField()
    error_type = models.CharField(max_length=255, blank=True)
    # The masked tokens, each with the space before it, as template mining compares them.
    tokens = models.JSONField(default=list)
    cluster = models.ForeignKey(
        PatternCluster, null=True, blank=True, on_delete=models.CASCADE, related_name="fingerprints"
    )
    pattern = models.ForeignKey(FailurePattern, on_delete=models.PROTECT, related_name="fingerprints")
    auto_pattern = models.ForeignKey(FailurePattern, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [
            # Merges and splits repoint every fingerprint of a pattern.
            models.Index(fields=["pattern"], name="fingerprint_pattern"),
        ]

    def __str__(self) -> str:
        return self.template[:120]


class FingerprintRule(models.Model):
    """An operator's grouping decision: dead letters whose error text matches `regex` (or whose header
    `header` matches it) are filed under the rule's own pattern instead of wherever grouping would put them.

    A rule with a `scope` is a split: it applies only to dead letters that would otherwise land in that pattern.
    Rules are tried in `position` order; the first that matches wins.
    """

    name = models.CharField(max_length=200, help_text="Shown as the template of the rule's pattern.")
    regex = models.CharField(
        max_length=1000,
        blank=True,
        help_text="A Python regular expression, searched in the error message and in 'ErrorType: error message' "
        "(or in the header's value when a header is named). Empty with a header: the header is present.",
    )
    header = models.CharField(max_length=255, blank=True, help_text="Match this message header (any case).")
    scope = models.ForeignKey(
        FailurePattern,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="split_rules",
        help_text="Only dead letters otherwise filed under this pattern (a split).",
    )
    pattern = models.ForeignKey(
        FailurePattern, null=True, blank=True, on_delete=models.PROTECT, related_name="rules", editable=False
    )
    position = models.IntegerField(default=100, help_text="Rules are tried from the lowest position up.")
    enabled = models.BooleanField(default=True)
    # Why ingest turned the rule off by itself (its searches kept running out of time); cleared when a person
    # enables it again.
    disabled_reason = models.TextField(blank=True, editable=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", editable=False
    )
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    updated_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["position", "id"]

    def __str__(self) -> str:
        return self.name

    @property
    def fingerprint_key(self) -> str:
        """The fingerprint dead letters matched by this rule carry."""
        return f"rule-{self.pk}"
