"""Alert rules, the alerts they raise, the channels that carry notifications, and one row per notification."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone
from django.utils.crypto import salted_hmac

from dlqconsole.alerts.notifiers import NOTIFIERS, notifier_choices
from dlqconsole.alerts.notifiers.webhook import MASK
from dlqconsole.alerts.signing import new_secret
from dlqconsole.alerts.subjects import parse_queue_subject, queue_subject
from dlqconsole.core.bidi import isolate

if TYPE_CHECKING:
    from dlqconsole.alerts.notifiers.base import Notifier


class Severity(models.TextChoices):
    INFO = "info", "Info"
    WARNING = "warning", "Warning"
    CRITICAL = "critical", "Critical"
    EMERGENCY = "emergency", "Emergency"


SEVERITY_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.CRITICAL: 2, Severity.EMERGENCY: 3}


class RuleKind(models.TextChoices):
    DLQ_NOT_EMPTY = "dlq_not_empty", "Dead-letter queue not empty"
    DLQ_GROWTH = "dlq_growth", "Dead-letter queue growing"
    QUEUE_DEPTH = "queue_depth", "Work queue depth"
    NEW_PATTERN = "new_pattern", "New failure pattern"
    PATTERN_REOPENED = "pattern_reopened", "Resolved pattern reopened"
    OLDEST_AGE = "oldest_age", "Oldest dead letter too old"
    OPERATION_PAUSED = "operation_paused", "Operation paused automatically"
    BREAKER_OPEN = "breaker_open", "Circuit breaker open"


# What a rule's threshold means, per kind, and its default when the rule leaves it empty. Queue depth has no
# single default: each watched queue carries its own warning, critical and emergency depths.
THRESHOLD_DEFAULTS: dict[str, float | None] = {
    RuleKind.DLQ_NOT_EMPTY: 0,
    RuleKind.DLQ_GROWTH: 100,
    RuleKind.QUEUE_DEPTH: None,
    RuleKind.NEW_PATTERN: None,
    RuleKind.PATTERN_REOPENED: None,
    RuleKind.OLDEST_AGE: 24 * 3600,
    RuleKind.OPERATION_PAUSED: None,
    RuleKind.BREAKER_OPEN: None,
}
THRESHOLD_HELP = {
    RuleKind.DLQ_NOT_EMPTY: "Fires when more than this many dead letters wait (0: the first one).",
    RuleKind.DLQ_GROWTH: "Fires when more than this many dead letters arrived within the window.",
    RuleKind.QUEUE_DEPTH: "Messages ready; empty uses the watched queue's depth for the rule's severity.",
    RuleKind.OLDEST_AGE: "Seconds; fires when the oldest parked dead letter is older.",
}
# Bounds of a rule's numbers (the rule form and the admin both check them): no queue holds more than a billion
# messages, and no rule's window, duration, cooldown or reminder needs more than a year. Without them a typed
# 99999999999999999999999 was stored as 9.99e22.
THRESHOLD_MAX = 1_000_000_000
RULE_DURATION_MAX = 366 * 86400
# Kinds that look back over a window (growth: the arrivals counted; patterns: how recent counts as new).
WINDOW_KINDS = frozenset({RuleKind.DLQ_GROWTH, RuleKind.NEW_PATTERN, RuleKind.PATTERN_REOPENED})
# Kinds whose scope can be a single pattern.
PATTERN_SCOPED_KINDS = frozenset({RuleKind.DLQ_NOT_EMPTY, RuleKind.DLQ_GROWTH, RuleKind.OLDEST_AGE})


# Longest target the channels list shows before cutting it in the middle.
TARGET_SHORT_LENGTH = 72

# What a person sets on a channel (the form, the admin); the rest (state, counters, budget) is the console's.
CHANNEL_SETTINGS = ["name", "kind", "target"]
# After a rotation the previous signing secret signs beside the new one for this long, so that receivers can be
# given the new one without refusing notifications meanwhile (as Svix, the specification's origin, does).
SIGNING_SECRET_OVERLAP = dt.timedelta(hours=24)


class Channel(models.Model):
    """Where notifications go: an e-mail list, a JSON webhook or a Slack-compatible webhook."""

    name = models.CharField(max_length=120)
    kind = models.CharField(max_length=16, choices=notifier_choices)
    # The address list or URL, as the kind's notifier reads it.
    target = models.TextField()
    enabled = models.BooleanField(default=True)
    # Why the console switched the channel off (a permanent error, or too many failed notifications in a row).
    disabled_reason = models.TextField(blank=True)
    disabled_at = models.DateTimeField(null=True, blank=True)
    # Notifications that failed for good in a row; reset by a success.
    failure_streak = models.IntegerField(default=0)
    # Lifetime counters for the channel page and /metrics.
    sent_count = models.BigIntegerField(default=0)
    failed_count = models.BigIntegerField(default=0)
    # The channel's notice budget: a window opens with the first notice of a quiet channel and ends
    # DLQ_NOTIFY_WINDOW later; the first DLQ_NOTIFY_BURST notices in it go out one by one, the rest are held for
    # one digest when it ends. Read and written with the row locked (the evaluation tick, the digest sweep).
    notice_window_ends_at = models.DateTimeField(null=True, blank=True)
    notice_window_sent = models.IntegerField(default=0)
    # The rules that have sent a notice in the window (each rule's first notice goes over the budget).
    notice_window_rules = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    # The key of the signature on every notification of a signed kind (signing.py), made with the channel and shown
    # once, when it is made or rotated. Not editable: no form, the admin's included, ever shows or takes it.
    signing_secret = models.CharField(max_length=100, default=new_secret, editable=False)
    # The secret before the last rotation, which signs too until previous_signing_secret_until.
    previous_signing_secret = models.CharField(max_length=100, blank=True, editable=False)
    previous_signing_secret_until = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["name", "id"]

    def __str__(self) -> str:
        # Isolated: the rule form and the admin set it in a label, where a direction control in the name would
        # otherwise run on over the kind.
        return f"{isolate(self.name)} ({self.kind})"

    def notifier(self) -> Notifier:
        return NOTIFIERS[self.kind](self)

    @property
    def is_signed(self) -> bool:
        notifier = NOTIFIERS.get(self.kind)
        return notifier is not None and notifier.signed

    def signing_secrets(self, now: dt.datetime) -> list[str]:
        """The secrets a notification sent now is signed with: the current one, and the previous one while the
        overlap after a rotation lasts."""
        if self.previous_signing_overlaps(now):
            return [self.signing_secret, self.previous_signing_secret]
        return [self.signing_secret]

    def previous_signing_overlaps(self, now: dt.datetime) -> bool:
        until = self.previous_signing_secret_until
        return bool(self.previous_signing_secret) and until is not None and until > now

    @property
    def kind_label(self) -> str:
        notifier = NOTIFIERS.get(self.kind)
        return notifier.label if notifier is not None else self.kind

    def clean(self) -> None:
        # Two channels of one name cannot be told apart on a rule's form or in a notification's history. Checked
        # here, so the console's form and the admin's both refuse it; not a database constraint, which existing
        # installations holding duplicates could not take without renaming channels behind their admins' backs.
        errors: dict[str, Any] = {}
        taken = Channel.objects.filter(name__iexact=self.name.strip()).exclude(pk=self.pk)
        existing = taken.values_list("name", flat=True).first() if self.name else None
        if existing is not None:
            errors["name"] = f"A channel named “{existing}” already exists (names are compared without regard to case)."
        # The kind's own check of the target (an e-mail list, a webhook URL outside the denied networks), here too
        # so that the Django admin cannot save what the console's form refuses.
        notifier = NOTIFIERS.get(self.kind)
        if notifier is not None and self.target:
            try:
                self.target = notifier.clean_target(self.target)
            except ValidationError as error:
                errors["target"] = error.messages
        if errors:
            raise ValidationError(errors)

    @property
    def target_display(self) -> str:
        """The whole target without its secrets (webhook URLs often carry a token in their path, query or user
        part, shown as ••••): the channel page shows it, the list a shortened form of it."""
        notifier = NOTIFIERS.get(self.kind)
        return notifier.display_target(self.target) if notifier is not None else ""

    @property
    def target_tag(self) -> str:
        """When target_display masks a secret, a short keyed hash of the whole target: channels whose masked
        targets look alike (two Slack hooks) are told apart, and the same tag on two channels means the same
        target. Keyed with SECRET_KEY, so the tag cannot be used to test guesses of a short secret offline."""
        if MASK not in self.target_display:
            return ""
        return salted_hmac("dlqconsole.alerts.channel-target", self.target, algorithm="sha256").hexdigest()[:6]

    @property
    def target_short(self) -> str:
        """target_display cut in the middle to fit a table cell, its start (where) and end (which) kept."""
        shown = self.target_display
        if len(shown) <= TARGET_SHORT_LENGTH:
            return shown
        tail = TARGET_SHORT_LENGTH // 3
        return f"{shown[: TARGET_SHORT_LENGTH - tail - 1]}…{shown[-tail:]}"


class AlertRuleQuerySet(models.QuerySet["AlertRule"]):
    def enabled(self) -> AlertRuleQuerySet:
        return self.filter(enabled=True)


class AlertRule(models.Model):
    """A condition watched by the evaluation tick. Empty queue and pattern: the rule covers every queue."""

    name = models.CharField(max_length=120, unique=True)
    kind = models.CharField(max_length=32, choices=RuleKind.choices)
    # A broker: the rule only looks at its queues; empty for every broker.
    broker = models.ForeignKey(
        "brokers.Broker", null=True, blank=True, on_delete=models.PROTECT, related_name="+", db_index=False
    )
    # A DLQ or work queue name; the rule then only looks at that queue (and its DLQ or work queue).
    queue = models.CharField(max_length=255, blank=True)
    pattern = models.ForeignKey(
        "deadletters.FailurePattern", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    threshold = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0), MaxValueValidator(THRESHOLD_MAX)]
    )
    window_seconds = models.IntegerField(
        default=60, validators=[MinValueValidator(1), MaxValueValidator(RULE_DURATION_MAX)]
    )
    # How long the condition must hold before the alert fires.
    for_seconds = models.IntegerField(
        default=0, validators=[MinValueValidator(0), MaxValueValidator(RULE_DURATION_MAX)]
    )
    severity = models.CharField(max_length=16, choices=Severity.choices, default=Severity.WARNING)
    channels = models.ManyToManyField(Channel, blank=True, related_name="rules")
    # No new notification for the same rule and subject within this many seconds of the previous one.
    cooldown_seconds = models.IntegerField(
        default=300, validators=[MinValueValidator(0), MaxValueValidator(RULE_DURATION_MAX)]
    )
    # Remind while an alert stays firing (not acknowledged); 0 means never.
    reminder_seconds = models.IntegerField(
        default=4 * 3600, validators=[MinValueValidator(0), MaxValueValidator(RULE_DURATION_MAX)]
    )
    enabled = models.BooleanField(default=True)
    # Alerts of this rule still fire and show, but send nothing until then.
    silenced_until = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    objects = AlertRuleQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def effective_threshold(self) -> float | None:
        return self.threshold if self.threshold is not None else THRESHOLD_DEFAULTS.get(self.kind)

    @property
    def scope_display(self) -> str:
        if self.pattern_id is not None:
            scope = f"pattern #{self.pattern_id}"
        elif self.queue:
            scope = f"queue {self.queue}"
        else:
            scope = "every queue"
        # Read with the rule (select_related("broker")) where many rules are shown.
        return scope if self.broker is None else f"{scope} on {self.broker.name}"

    def is_silenced(self, now: dt.datetime) -> bool:
        return self.silenced_until is not None and self.silenced_until > now


class AlertStatus(models.TextChoices):
    # The condition holds but not yet for the rule's duration; nothing was sent.
    PENDING = "pending", "Pending"
    FIRING = "firing", "Firing"
    ACKNOWLEDGED = "acknowledged", "Acknowledged"
    RESOLVED = "resolved", "Resolved"


OPEN_STATUSES = (AlertStatus.PENDING, AlertStatus.FIRING, AlertStatus.ACKNOWLEDGED)


class AlertQuerySet(models.QuerySet["Alert"]):
    def open(self) -> AlertQuerySet:
        return self.filter(status__in=OPEN_STATUSES)

    def active(self) -> AlertQuerySet:
        """What the alerts page lists as current: firing or acknowledged."""
        return self.filter(status__in=(AlertStatus.FIRING, AlertStatus.ACKNOWLEDGED))

    def history(self) -> AlertQuerySet:
        return self.filter(status=AlertStatus.RESOLVED)

    def about_broker(self, name: str) -> AlertQuerySet:
        """Alerts about the broker's queues, and those of rules scoped to it about anything else (a pattern, an
        operation)."""
        queues = models.Q(subject__startswith=queue_subject("", broker=name))
        any_queue = models.Q(subject__startswith="queue:") | models.Q(subject__startswith="queue@")
        return self.filter(queues | (models.Q(rule__broker__name=name) & ~any_queue))

    def firing_first(self) -> AlertQuerySet:
        """Firing before acknowledged (what still needs someone), the newest first within each."""
        waiting = models.Case(models.When(status=AlertStatus.FIRING, then=models.Value(0)), default=models.Value(1))
        return self.order_by(waiting, models.F("fired_at").desc(nulls_last=True), "-id")


class Alert(models.Model):
    """One rule holding for one subject (a queue, a pattern or an operation), from first seen to resolved."""

    rule = models.ForeignKey(AlertRule, on_delete=models.CASCADE, related_name="alerts")
    # "queue:orders.dlq", "queue@staging:orders.dlq", "pattern:12", "operation:7" (subjects.py): a rule covering
    # every queue raises one alert per queue of each broker.
    subject = models.CharField(max_length=300)
    subject_label = models.CharField(max_length=300)
    severity = models.CharField(max_length=16, choices=Severity.choices)
    status = models.CharField(max_length=16, choices=AlertStatus.choices, default=AlertStatus.PENDING)
    value = models.FloatField(default=0)
    summary = models.TextField()
    # A console path that shows what the alert is about.
    link = models.CharField(max_length=500, blank=True)
    started_at = models.DateTimeField(default=timezone.now)
    fired_at = models.DateTimeField(null=True, blank=True)
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    resolved_at = models.DateTimeField(null=True, blank=True)
    silenced_until = models.DateTimeField(null=True, blank=True)
    last_notified_at = models.DateTimeField(null=True, blank=True)
    # When the next firing notice or reminder is due (cooldown and reminder interval both end up here).
    next_notify_at = models.DateTimeField(null=True, blank=True)
    notified_count = models.IntegerField(default=0)

    objects = AlertQuerySet.as_manager()

    class Meta:
        constraints = [
            # At most one open alert per rule and subject, even if two evaluation ticks overlap.
            models.UniqueConstraint(
                fields=["rule", "subject"],
                condition=~models.Q(status="resolved"),
                name="alert_open_per_subject",
            )
        ]
        indexes = [
            # The evaluation tick and the alerts page: open alerts.
            models.Index(fields=["status", "-id"], name="alert_status_id"),
            # Cooldown: the last notification for a rule and subject.
            models.Index(fields=["rule", "subject", "-last_notified_at"], name="alert_rule_subject_notified"),
        ]

    def __str__(self) -> str:
        return f"{self.rule.name}: {self.subject_label} ({self.status})"

    @property
    def is_open(self) -> bool:
        return self.status in OPEN_STATUSES

    @property
    def broker_name(self) -> str:
        """The broker the alert is about: the one its queue subject names, else its rule's; "" for an alert that
        belongs to no one broker (a pattern or an operation of a rule covering every broker)."""
        found = parse_queue_subject(self.subject)
        if found is not None:
            return found[0]
        return self.rule.broker.name if self.rule.broker is not None else ""

    def is_silenced(self, now: dt.datetime) -> bool:
        return self.silenced_until is not None and self.silenced_until > now

    @property
    def silence_ends(self) -> dt.datetime | None:
        """When the silence on this alert or on its whole rule ends (the later of the two), or None when neither
        is silenced now: an alert of a silenced rule still fires and shows, but nobody is told."""
        now = timezone.now()
        ends = [moment for moment in (self.silenced_until, self.rule.silenced_until) if moment and moment > now]
        return max(ends, default=None)


class NotificationKind(models.TextChoices):
    FIRING = "firing", "Firing"
    REMINDER = "reminder", "Reminder"
    RESOLVED = "resolved", "Resolved"
    TEST = "test", "Test"
    # Several held notices to one channel, sent together when the channel's notice window ends.
    DIGEST = "digest", "Digest"


# The notice kinds a digest counts, in the order its text names them.
DIGESTED_KINDS = (NotificationKind.FIRING, NotificationKind.REMINDER, NotificationKind.RESOLVED)


class NotificationStatus(models.TextChoices):
    # A send task is on its way (next_attempt_at is when we assume it was lost and enqueue it again).
    QUEUED = "queued", "Queued"
    SENDING = "sending", "Sending"
    SENT = "sent", "Sent"
    # The last attempt failed; the next one is due at next_attempt_at.
    RETRYING = "retrying", "Retrying"
    FAILED = "failed", "Failed"
    # Over the channel's budget: kept, with its context frozen, until the digest at next_attempt_at.
    HELD = "held", "Held for digest"
    # Went out inside the digest it points to (whose own status is the outcome).
    DIGESTED = "digested", "In digest"
    # Held, then its alert (or rule) was silenced before the digest went: not sent, as a silence asks.
    SILENCED = "silenced", "Silenced before its digest"


class Notification(models.Model):
    """One notification to one channel, with its outcome after every attempt."""

    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="notifications")
    alert = models.ForeignKey(Alert, null=True, blank=True, on_delete=models.CASCADE, related_name="notifications")
    kind = models.CharField(max_length=16, choices=NotificationKind.choices)
    status = models.CharField(max_length=16, choices=NotificationStatus.choices, default=NotificationStatus.QUEUED)
    # What the message says, frozen when the event happened (the alert may have moved on by the time it is sent).
    context = models.JSONField(default=dict)
    attempts = models.IntegerField(default=0)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    claimed_at = models.DateTimeField(null=True, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    # The digest a held notice went out in.
    digest = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="notices")
    # Sent as the webhook-id header: the same on every attempt, so a receiver can drop a repeat. Random rather than
    # the primary key, which a second console (staging beside production) posting to the same receiver would repeat.
    webhook_id = models.UUIDField(default=uuid.uuid4, editable=False)

    class Meta:
        indexes = [
            # The retry sweep: due retries, lost queued tasks and stuck sends; the digest sweep: held notices whose
            # window has ended; the channels page: held notices per channel.
            models.Index(fields=["status", "next_attempt_at"], name="notification_due"),
            # Channel and alert pages: newest first.
            models.Index(fields=["channel", "-id"], name="notification_channel_id"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} to {self.channel_id}: {self.status}"

    @property
    def message_id(self) -> str:
        """The webhook-id header's value."""
        return f"msg_{self.webhook_id.hex}"


class GrowthSample(models.Model):
    """A running total of dead letters for a queue or pattern, recorded by each evaluation tick.

    Growth over a window is the latest total minus the one recorded a window ago: two indexed lookups instead
    of counting the dead letters that arrived.
    """

    subject = models.CharField(max_length=300)
    total = models.BigIntegerField()
    # Which patterns were ignored when the total was taken (a short hash). Ignored patterns are left out of a
    # queue's total, so ignoring one or taking it back changes the total without any dead letter arriving:
    # growth is only measured between samples with the same basis.
    basis = models.CharField(max_length=16, blank=True)
    sampled_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [
            # The total a window ago for one subject.
            models.Index(fields=["subject", "-sampled_at"], name="growthsample_subject_time"),
            # Retention deletes by time.
            models.Index(fields=["sampled_at"], name="growthsample_time"),
        ]

    def __str__(self) -> str:
        return f"{self.subject}: {self.total}"


class EvaluationState(models.Model):
    """One row: when the evaluation tick last ran and how long it took (pages, /metrics, overlap lock)."""

    last_started_at = models.DateTimeField(null=True, blank=True)
    last_finished_at = models.DateTimeField(null=True, blank=True)
    last_duration_ms = models.FloatField(default=0)
    ticks = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"evaluated {self.ticks} times"
