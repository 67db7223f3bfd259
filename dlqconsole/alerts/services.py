"""Alert evaluation, the alert lifecycle, notification delivery, and the changes people make to rules and channels.

The evaluation tick only reads counters and writes alert rows; it never talks to a channel. Notifications are
rows that a Celery task delivers one at a time, so a slow or broken channel cannot hold the tick up.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import transaction
from django.db.models import F
from django.urls import reverse
from django.utils import timezone

from dlqconsole.accounts.services import record_audit
from dlqconsole.alerts import conditions
from dlqconsole.alerts.models import (
    CHANNEL_SETTINGS,
    DIGESTED_KINDS,
    SEVERITY_RANK,
    SIGNING_SECRET_OVERLAP,
    Alert,
    AlertRule,
    AlertStatus,
    Channel,
    EvaluationState,
    GrowthSample,
    Notification,
    NotificationKind,
    NotificationStatus,
    RuleKind,
)
from dlqconsole.alerts.notifiers import NOTIFIERS, NotifierError
from dlqconsole.alerts.notifiers.webhook import WebhookNotifier
from dlqconsole.alerts.signing import new_secret
from dlqconsole.deadletters.templatetags.charts import stamp

logger = logging.getLogger(__name__)

Actor = AbstractBaseUser | AnonymousUser | None

# A queued notification whose task has not claimed it by then is assumed lost and enqueued again.
QUEUED_LEASE = dt.timedelta(seconds=60)
# A send that started this long ago without an outcome belongs to a worker that died.
SENDING_STALE_AFTER = dt.timedelta(seconds=120)
# What a channel switched off fails instead of sending.
WAITING_STATUSES = (NotificationStatus.QUEUED, NotificationStatus.RETRYING, NotificationStatus.HELD)
# A digest lists at most this many notices in full and says how many more it holds.
DIGEST_LIST_LIMIT = 50
# Growth samples older than the longest window (and at least this) are deleted.
MIN_GROWTH_RETENTION = dt.timedelta(hours=1)
# The alert fields the evaluation tick writes (never acknowledged_* or silenced_until: those are people's).
TICK_FIELDS = [
    "status",
    "value",
    "summary",
    "subject_label",
    "link",
    "fired_at",
    "resolved_at",
    "last_notified_at",
    "next_notify_at",
    "notified_count",
]
# The rule fields that change what an alert means; editing them closes the rule's open alerts.
CONDITION_FIELDS = ("kind", "queue", "pattern_id", "threshold", "window_seconds", "severity")


class AlertError(Exception):
    """A change to alerts, rules or channels that cannot be made; the message says why."""


@dataclass
class TickResult:
    skipped: bool = False
    rules: int = 0
    fired: int = 0
    resolved: int = 0
    notifications: int = 0
    duration_ms: float = 0.0


# Evaluation ----------------------------------------------------------------------------------------------------


def evaluate_rules(*, now: dt.datetime | None = None) -> TickResult:
    """One evaluation tick: check every enabled rule, move alerts through their lifecycle, queue notifications.

    Overlapping ticks (a slow one and the next beat) do not both run: the second finds the state row locked
    and skips.
    """
    now = now or timezone.now()
    started = time.perf_counter()
    result = TickResult()
    with transaction.atomic():
        state = _lock_state()
        if state is None:
            return TickResult(skipped=True)
        rules = list(AlertRule.objects.enabled().select_related("pattern").prefetch_related("channels"))
        open_alerts: dict[int, dict[str, Alert]] = defaultdict(dict)
        orphans: list[Alert] = []
        enabled_ids = {rule.pk for rule in rules}
        # Locked until the tick commits, so an acknowledgement or silence made meanwhile waits and is not
        # overwritten by this tick's update.
        for alert in Alert.objects.open().select_for_update():
            if alert.rule_id in enabled_ids:
                open_alerts[alert.rule_id][alert.subject] = alert
            else:
                orphans.append(alert)
        facts = conditions.Facts(
            now=now, open_subjects={rule_id: set(alerts) for rule_id, alerts in open_alerts.items()}
        )
        changed: dict[int, Alert] = {}
        for rule in rules:
            try:
                outcome = conditions.evaluate(rule, facts)
            except Exception:
                # A rule that cannot be evaluated (bad data, a bug) must not stop the others from alerting.
                logger.exception("alert rule %s (%s) could not be evaluated", rule.pk, rule.kind)
                continue
            _apply(rule, outcome, open_alerts[rule.pk], now=now, result=result, changed=changed)
        for alert in changed.values():
            Alert.objects.filter(pk=alert.pk).update(**{name: getattr(alert, name) for name in TICK_FIELDS})
        for alert in orphans:
            # The rule was disabled: its alerts end without a notice, nobody asked to hear about them any more.
            _resolve_quietly(alert, now=now)
        _record_growth(facts, rules=rules, now=now, prune=state.ticks % 30 == 0)
        result.rules = len(rules)
        result.duration_ms = (time.perf_counter() - started) * 1000
        EvaluationState.objects.filter(pk=state.pk).update(
            last_started_at=now,
            last_finished_at=timezone.now(),
            last_duration_ms=result.duration_ms,
            ticks=F("ticks") + 1,
        )
    return result


def _lock_state() -> EvaluationState | None:
    state = EvaluationState.objects.select_for_update(skip_locked=True).filter(pk=1).first()
    if state is not None:
        return state
    if EvaluationState.objects.filter(pk=1).exists():
        return None
    EvaluationState.objects.get_or_create(pk=1)
    return EvaluationState.objects.select_for_update(skip_locked=True).filter(pk=1).first()


def _apply(
    rule: AlertRule,
    outcome: conditions.RuleResult,
    open_alerts: dict[str, Alert],
    *,
    now: dt.datetime,
    result: TickResult,
    changed: dict[int, Alert],
) -> None:
    for subject, observation in outcome.holding.items():
        alert = open_alerts.get(subject)
        if alert is None:
            alert = Alert(
                rule=rule,
                subject=subject,
                subject_label=observation.label[:300],
                severity=rule.severity,
                status=AlertStatus.PENDING,
                value=observation.value,
                summary=observation.summary,
                link=observation.link[:500],
                started_at=now,
            )
            if rule.for_seconds <= 0:
                _fire(alert, rule=rule, now=now)
                result.fired += 1
            alert.save()
        else:
            if _observe(alert, observation):
                changed[alert.pk] = alert
            if alert.status == AlertStatus.PENDING and now - alert.started_at >= dt.timedelta(seconds=rule.for_seconds):
                _fire(alert, rule=rule, now=now)
                result.fired += 1
                changed[alert.pk] = alert
        if _notice_due(alert, rule=rule, now=now):
            kind = NotificationKind.FIRING if alert.notified_count == 0 else NotificationKind.REMINDER
            result.notifications += _announce(alert, rule=rule, kind=kind, now=now)
            alert.next_notify_at = now + dt.timedelta(seconds=rule.reminder_seconds) if rule.reminder_seconds else None
            changed[alert.pk] = alert
    for subject, alert in open_alerts.items():
        if subject in outcome.holding or subject in outcome.unknown:
            continue
        if alert.status == AlertStatus.PENDING:
            # It never held long enough to fire: nothing to tell, nothing to keep.
            alert.delete()
            continue
        alert.status = AlertStatus.RESOLVED
        alert.resolved_at = now
        result.resolved += 1
        if alert.notified_count > 0 and not (alert.is_silenced(now) or rule.is_silenced(now)):
            result.notifications += _announce(alert, rule=rule, kind=NotificationKind.RESOLVED, now=now)
        changed[alert.pk] = alert


def _observe(alert: Alert, observation: conditions.Observation) -> bool:
    """Take in the latest numbers; True when the alert reads differently. The value alone (an age that grows
    every second) is not worth a write on every tick: it is stored whenever the summary changes."""
    fresh = {
        "summary": observation.summary,
        "subject_label": observation.label[:300],
        "link": observation.link[:500],
    }
    if all(getattr(alert, name) == value for name, value in fresh.items()):
        return False
    for name, value in fresh.items():
        setattr(alert, name, value)
    alert.value = observation.value
    return True


def _fire(alert: Alert, *, rule: AlertRule, now: dt.datetime) -> None:
    alert.status = AlertStatus.FIRING
    alert.fired_at = now
    # Cooldown: the same rule and subject notified a moment ago (a flapping condition) waits before it speaks.
    previous = (
        Alert.objects.filter(rule=rule, subject=alert.subject, last_notified_at__isnull=False)
        .order_by("-last_notified_at")
        .values_list("last_notified_at", flat=True)
        .first()
    )
    due = now
    if previous is not None:
        due = max(now, previous + dt.timedelta(seconds=rule.cooldown_seconds))
    alert.next_notify_at = due


def _notice_due(alert: Alert, *, rule: AlertRule, now: dt.datetime) -> bool:
    return (
        alert.status == AlertStatus.FIRING
        and alert.next_notify_at is not None
        and alert.next_notify_at <= now
        and not alert.is_silenced(now)
        and not rule.is_silenced(now)
    )


def _resolve_quietly(alert: Alert, *, now: dt.datetime) -> None:
    if alert.status == AlertStatus.PENDING:
        alert.delete()
        return
    Alert.objects.filter(pk=alert.pk).update(status=AlertStatus.RESOLVED, resolved_at=now)


def _record_growth(facts: conditions.Facts, *, rules: list[AlertRule], now: dt.datetime, prune: bool) -> None:
    if facts.totals:
        GrowthSample.objects.bulk_create(
            GrowthSample(subject=subject, total=total, basis=basis, sampled_at=now)
            for subject, (total, basis) in facts.totals.items()
        )
    if prune:
        windows = [rule.window_seconds for rule in rules if rule.kind == RuleKind.DLQ_GROWTH]
        keep = max([MIN_GROWTH_RETENTION, *(dt.timedelta(seconds=2 * window) for window in windows)])
        GrowthSample.objects.filter(sampled_at__lt=now - keep).delete()


# Notifications -------------------------------------------------------------------------------------------------


def console_url(path: str) -> str:
    return settings.DLQ_CONSOLE_URL.rstrip("/") + path


def notification_context(alert: Alert, *, kind: str) -> dict[str, Any]:
    """The facts a notification carries, frozen when the event happens (also the webhook's JSON body)."""
    rule = alert.rule

    def iso(value: dt.datetime | None) -> str | None:
        return value.isoformat() if value is not None else None

    return {
        "event": kind,
        "alert_id": alert.pk,
        "rule": rule.name,
        "rule_id": rule.pk,
        "rule_kind": rule.kind,
        "severity": alert.severity,
        "status": alert.status,
        "subject": alert.subject,
        "label": alert.subject_label,
        "summary": alert.summary,
        "value": alert.value,
        "started_at": iso(alert.started_at),
        "fired_at": iso(alert.fired_at),
        "resolved_at": iso(alert.resolved_at),
        "url": console_url(reverse("alerts:detail", args=[alert.pk])),
    }


def _announce(alert: Alert, *, rule: AlertRule, kind: str, now: dt.datetime) -> int:
    """Queue the notice to each enabled channel of the rule, or hold it for the channel's digest when the channel
    has used its budget for the current window. Only a notice that went to a channel counts as notified: with
    none, nobody was told, so the alert's page says so, a later notice is its first ("firing", not "reminder"), no
    recovery notice follows, and no cooldown holds the next alert back."""
    channel_ids = [channel.pk for channel in rule.channels.all() if channel.enabled]
    if not channel_ids:
        return 0
    # Locked (in id order) until the tick commits: the digest sweep skips a channel whose budget is being
    # spent, so a notice is never held in a window whose digest has already gone.
    # FOR NO KEY UPDATE: the tick writes no key column, and a plain FOR UPDATE would conflict with the KEY SHARE
    # locks that rows referencing the channel take (a rule edit's channel links, a test send), and could deadlock
    # with a rule edit: the tick locks channels rule by rule, not in one global order.
    channels = list(
        Channel.objects.select_for_update(no_key=True).filter(pk__in=channel_ids, enabled=True).order_by("pk")
    )
    if not channels:
        return 0
    alert.last_notified_at = now
    alert.notified_count += 1
    context = notification_context(alert, kind=kind)
    rows = []
    for channel in channels:
        held_until = _spend_budget(channel, rule=rule, now=now)
        rows.append(
            Notification(
                channel=channel,
                alert=alert,
                kind=kind,
                status=NotificationStatus.QUEUED if held_until is None else NotificationStatus.HELD,
                context=context,
                created_at=now,
                next_attempt_at=held_until or now + QUEUED_LEASE,
            )
        )
    created = Notification.objects.bulk_create(rows)
    _enqueue([row.pk for row in created if row.status == NotificationStatus.QUEUED])
    return len(created)


def _spend_budget(channel: Channel, *, rule: AlertRule, now: dt.datetime) -> dt.datetime | None:
    """Count one notice against the channel's window (the row is locked). None: send it now; else hold it until
    the returned moment, when the window ends and its digest goes. A quiet channel's first notice opens a window
    and always goes at once, and so does each rule's first notice in a window, over the budget if need be: a storm
    of one rule (a DLQ per queue filling up) must not hold back the first word of another (a new failure pattern)."""
    ends_at = channel.notice_window_ends_at
    if ends_at is None or ends_at <= now:
        channel.notice_window_ends_at = now + dt.timedelta(seconds=settings.DLQ_NOTIFY_WINDOW)
        channel.notice_window_sent = 0
        channel.notice_window_rules = []
    elif channel.notice_window_sent >= settings.DLQ_NOTIFY_BURST and rule.pk in channel.notice_window_rules:
        return ends_at
    channel.notice_window_sent += 1
    if rule.pk not in channel.notice_window_rules:
        channel.notice_window_rules = [*channel.notice_window_rules, rule.pk]
    Channel.objects.filter(pk=channel.pk).update(
        notice_window_ends_at=channel.notice_window_ends_at,
        notice_window_sent=channel.notice_window_sent,
        notice_window_rules=channel.notice_window_rules,
    )
    return None


def _enqueue(notification_ids: Iterable[int]) -> None:
    # Imported here: the tasks import this module (a service enqueueing its own task).
    from dlqconsole.alerts.tasks import send_notification

    for notification_id in notification_ids:
        transaction.on_commit(partial(send_notification.delay, notification_id))


def retry_delay(attempts: int) -> dt.timedelta:
    """Backoff after the given number of failed attempts: base, 3x base, 9x base, ..."""
    return dt.timedelta(seconds=settings.DLQ_NOTIFICATION_RETRY_SECONDS * 3 ** max(0, attempts - 1))


def deliver_notification(*, notification_id: int, now: dt.datetime | None = None) -> Notification | None:
    """Send one queued notification and record the outcome. Returns None when another worker has it."""
    now = now or timezone.now()
    claimed = Notification.objects.filter(pk=notification_id, status=NotificationStatus.QUEUED).update(
        status=NotificationStatus.SENDING, attempts=F("attempts") + 1, claimed_at=now
    )
    if not claimed:
        return None
    notification = Notification.objects.select_related("channel").get(pk=notification_id)
    channel = notification.channel
    testing = notification.kind == NotificationKind.TEST
    if not channel.enabled and not testing:
        _finish(notification, status=NotificationStatus.FAILED, error=f"Channel disabled: {channel.disabled_reason}")
        return notification
    try:
        channel.notifier().send(notification)
    except NotifierError as error:
        _record_failure(notification, error=error, testing=testing, now=now)
    except Exception as error:
        # A bug in a notifier is still a failed send: record it and retry, never lose the notification silently.
        logger.exception("notifier %s failed unexpectedly", channel.kind)
        _record_failure(notification, error=NotifierError(f"{type(error).__name__}: {error}"), testing=testing, now=now)
    else:
        notification.sent_at = timezone.now()
        _finish(notification, status=NotificationStatus.SENT, error="")
        if not testing:
            Channel.objects.filter(pk=channel.pk).update(sent_count=F("sent_count") + 1, failure_streak=0)
    return notification


def _finish(notification: Notification, *, status: str, error: str) -> None:
    notification.status = status
    notification.error = error[:2000]
    notification.save(update_fields=["status", "error", "sent_at", "next_attempt_at"])


def _record_failure(notification: Notification, *, error: NotifierError, testing: bool, now: dt.datetime) -> None:
    # A test send is tried once: the person who pressed the button reads the outcome on the page.
    final = testing or error.permanent or notification.attempts >= settings.DLQ_NOTIFICATION_MAX_ATTEMPTS
    if not final:
        notification.next_attempt_at = now + retry_delay(notification.attempts)
        _finish(notification, status=NotificationStatus.RETRYING, error=error.message)
        return
    _finish(notification, status=NotificationStatus.FAILED, error=error.message)
    if testing:
        return
    channel = notification.channel
    Channel.objects.filter(pk=channel.pk).update(
        failed_count=F("failed_count") + 1, failure_streak=F("failure_streak") + 1
    )
    channel.refresh_from_db(fields=["failure_streak", "enabled"])
    if error.permanent:
        reason = f"Permanent error: {error.message}"
    elif channel.failure_streak >= settings.DLQ_CHANNEL_DISABLE_AFTER:
        reason = f"{channel.failure_streak} notifications in a row failed; last error: {error.message}"
    else:
        return
    disable_channel(channel=channel, reason=reason, now=now)


def disable_channel(*, channel: Channel, reason: str, now: dt.datetime | None = None) -> None:
    """Switch a failing channel off; its queued and held notifications fail with the reason instead of piling
    up."""
    now = now or timezone.now()
    Channel.objects.filter(pk=channel.pk).update(enabled=False, disabled_reason=reason[:2000], disabled_at=now)
    Notification.objects.filter(channel=channel, status__in=WAITING_STATUSES).exclude(
        kind=NotificationKind.TEST
    ).update(status=NotificationStatus.FAILED, error=f"Channel disabled: {reason}")
    record_audit(actor=None, action="alerts.channel.disable", target=f"channel:{channel.pk}", detail=reason[:500])
    logger.warning("channel %s disabled: %s", channel.pk, reason)


def enqueue_due_notifications(*, now: dt.datetime | None = None) -> int:
    """Enqueue retries that are due, queued notifications whose task was lost, and sends stuck on a dead worker."""
    now = now or timezone.now()
    with transaction.atomic():
        Notification.objects.filter(status=NotificationStatus.SENDING, claimed_at__lt=now - SENDING_STALE_AFTER).update(
            status=NotificationStatus.RETRYING, next_attempt_at=now, error="The worker stopped while sending."
        )
        due = list(
            Notification.objects.select_for_update(skip_locked=True)
            .filter(
                status__in=(NotificationStatus.RETRYING, NotificationStatus.QUEUED),
                next_attempt_at__lte=now,
            )
            .values_list("pk", flat=True)[:500]
        )
        if due:
            Notification.objects.filter(pk__in=due).update(
                status=NotificationStatus.QUEUED, next_attempt_at=now + QUEUED_LEASE
            )
            _enqueue(due)
    return len(due)


# Notifications whose story has ended: sent, failed for good, gone out in a digest, or dropped by a silence.
FINISHED_STATUSES = (
    NotificationStatus.SENT,
    NotificationStatus.FAILED,
    NotificationStatus.DIGESTED,
    NotificationStatus.SILENCED,
)


def prune_notifications(*, now: dt.datetime | None = None, batch_size: int = 5000) -> int:
    """Delete finished notifications created more than DLQ_NOTIFICATION_RETENTION_DAYS ago, in batches (the
    hourly retention task); one still waiting (queued, sending, retrying, held) is kept whatever its age. The
    audit log keeps the count. Returns how many went."""
    now = now or timezone.now()
    cutoff = now - dt.timedelta(days=settings.DLQ_NOTIFICATION_RETENTION_DAYS)
    old = Notification.objects.filter(created_at__lt=cutoff, status__in=FINISHED_STATUSES).order_by("pk")
    deleted = 0
    while ids := list(old.values_list("pk", flat=True)[:batch_size]):
        Notification.objects.filter(pk__in=ids).delete()
        deleted += len(ids)
    if deleted:
        record_audit(
            actor=None,
            action="alerts.notification.retention",
            target="notifications",
            filter={"status": list(FINISHED_STATUSES), "until": cutoff.isoformat()},
            count=deleted,
            detail=f"deleted {deleted} finished notifications created more than "
            f"{settings.DLQ_NOTIFICATION_RETENTION_DAYS} days ago",
        )
    return deleted


# Digests --------------------------------------------------------------------------------------------------------


def send_due_digests(*, now: dt.datetime | None = None) -> int:
    """Turn the held notices of every channel whose window has ended into one digest each, and enqueue them.

    Safe with several beats or workers at once: a channel is taken with its row locked (skipping one another
    sweep or the evaluation tick holds), its held notices are read after the lock, and they leave "held" in the
    same transaction that creates their digest. So a window's notices go out in exactly one digest.
    Returns the number of digests queued.
    """
    now = now or timezone.now()
    digests: list[int] = []
    with transaction.atomic():
        due = Notification.objects.filter(status=NotificationStatus.HELD, next_attempt_at__lte=now)
        channels = Channel.objects.select_for_update(skip_locked=True, no_key=True).filter(
            pk__in=due.values("channel_id")
        )
        for channel in channels.order_by("pk")[:100]:
            digest = _digest_channel(channel, now=now)
            if digest is not None:
                digests.append(digest.pk)
        _enqueue(digests)
    return len(digests)


def _digest_channel(channel: Channel, *, now: dt.datetime) -> Notification | None:
    held = list(
        Notification.objects.filter(channel=channel, status=NotificationStatus.HELD, next_attempt_at__lte=now)
        .select_related("alert__rule")
        .order_by("id")
    )
    # Silenced since they were held (an operator silencing a storm): a silence means nothing more is sent.
    silenced = [notice.pk for notice in held if notice.alert is not None and _silenced(notice.alert, now=now)]
    if silenced:
        Notification.objects.filter(pk__in=silenced).update(status=NotificationStatus.SILENCED, next_attempt_at=None)
        held = [notice for notice in held if notice.alert is None or not _silenced(notice.alert, now=now)]
    if channel.notice_window_ends_at is not None and channel.notice_window_ends_at <= now:
        # The window is over: the channel is quiet again until its next notice.
        Channel.objects.filter(pk=channel.pk).update(
            notice_window_ends_at=None, notice_window_sent=0, notice_window_rules=[]
        )
    if not held:
        # Another sweep sent them between our look and our lock.
        return None
    if not channel.enabled:
        Notification.objects.filter(pk__in=[notice.pk for notice in held]).update(
            status=NotificationStatus.FAILED, error=f"Channel disabled: {channel.disabled_reason}"[:2000]
        )
        return None
    digest = Notification.objects.create(
        channel=channel,
        kind=NotificationKind.DIGEST,
        context=digest_context([notice.context for notice in held]),
        created_at=now,
        next_attempt_at=now + QUEUED_LEASE,
    )
    Notification.objects.filter(pk__in=[notice.pk for notice in held]).update(
        status=NotificationStatus.DIGESTED, digest=digest, next_attempt_at=None
    )
    return digest


def _silenced(alert: Alert, *, now: dt.datetime) -> bool:
    return alert.is_silenced(now) or alert.rule.is_silenced(now)


def digest_context(notices: list[dict[str, Any]]) -> dict[str, Any]:
    """What a digest carries (also the webhook's JSON body): how many notices of each kind, each notice's own
    context (the first DIGEST_LIST_LIMIT of them, oldest first), how many more, and a link to the alerts page."""
    counts = Counter(str(notice.get("event", "")) for notice in notices)
    return {
        "event": NotificationKind.DIGEST.value,
        "count": len(notices),
        "counts": {kind.value: counts[kind.value] for kind in DIGESTED_KINDS if counts[kind.value]},
        "notices": notices[:DIGEST_LIST_LIMIT],
        "more": max(0, len(notices) - DIGEST_LIST_LIMIT),
        "burst": settings.DLQ_NOTIFY_BURST,
        "window_seconds": settings.DLQ_NOTIFY_WINDOW,
        "severity": max(
            (str(notice.get("severity", "")) for notice in notices),
            key=lambda severity: SEVERITY_RANK.get(severity, -1),  # type: ignore[call-overload]
            default="info",
        ),
        "url": console_url(reverse("alerts:list")),
    }


# Changes made by people ----------------------------------------------------------------------------------------


def acknowledge_alert(*, alert: Alert, actor: Actor, now: dt.datetime | None = None) -> Alert:
    """Someone is on it: no more reminders. The alert still resolves (with a notice) when the condition clears."""
    if not _acknowledge(alert, actor=actor, now=now or timezone.now()):
        raise AlertError("Only a firing alert can be acknowledged.")
    record_audit(
        actor=actor,
        action="alerts.alert.acknowledge",
        target=f"alert:{alert.pk}",
        detail=f"{alert.rule.name}: {alert.summary}",
    )
    alert.refresh_from_db()
    return alert


def silence_alert(*, alert: Alert, actor: Actor, until: dt.datetime | None) -> Alert:
    """Send nothing about this alert until `until` (None lifts the silence)."""
    if not _silence(alert, until=until):
        raise AlertError("A resolved alert cannot be silenced.")
    said = f"silenced until {stamp(until)}" if until else "silence lifted"
    record_audit(
        actor=actor,
        action="alerts.alert.silence",
        target=f"alert:{alert.pk}",
        detail=f"{alert.rule.name} · {alert.subject_label}: {said}",
    )
    return alert


def _acknowledge(alert: Alert, *, actor: Actor, now: dt.datetime) -> bool:
    """The lifecycle step of an acknowledgement, shared by one alert and many; False when it was not firing."""
    return bool(
        Alert.objects.filter(pk=alert.pk, status=AlertStatus.FIRING).update(
            status=AlertStatus.ACKNOWLEDGED,
            acknowledged_at=now,
            acknowledged_by=actor if getattr(actor, "pk", None) else None,
        )
    )


def _silence(alert: Alert, *, until: dt.datetime | None) -> bool:
    """The lifecycle step of a silence, shared by one alert and many; False when the alert is resolved."""
    if not alert.is_open:
        return False
    alert.silenced_until = until
    alert.save(update_fields=["silenced_until"])
    return True


@dataclass
class BulkResult:
    done: list[int]
    skipped: list[int]
    # How many of the done alerts each rule had, for the audit row.
    rules: Counter[str] = field(default_factory=Counter)


def acknowledge_alerts(*, alerts: Iterable[Alert], actor: Actor, now: dt.datetime | None = None) -> BulkResult:
    """Acknowledge many alerts at once (an incident): each goes through the same step as one acknowledgement, so
    reminders stop the same way; those no longer firing are skipped. One audit row names them all."""
    now = now or timezone.now()
    result = BulkResult(done=[], skipped=[])
    for alert in alerts:
        _tally(result, alert, done=_acknowledge(alert, actor=actor, now=now))
    _record_bulk(
        actor=actor,
        action="alerts.alert.bulk_acknowledge",
        result=result,
        done="acknowledged",
        skipped="no longer firing",
    )
    return result


def silence_alerts(*, alerts: Iterable[Alert], actor: Actor, until: dt.datetime | None) -> BulkResult:
    """Silence many alerts at once (None lifts their silence); resolved ones are skipped. One audit row."""
    result = BulkResult(done=[], skipped=[])
    for alert in alerts:
        _tally(result, alert, done=_silence(alert, until=until))
    done = f"silenced until {stamp(until)}" if until else "silence lifted"
    _record_bulk(actor=actor, action="alerts.alert.bulk_silence", result=result, done=done, skipped="already resolved")
    return result


def _tally(result: BulkResult, alert: Alert, *, done: bool) -> None:
    if done:
        result.done.append(alert.pk)
        result.rules[alert.rule.name] += 1
    else:
        result.skipped.append(alert.pk)


def _record_bulk(*, actor: Actor, action: str, result: BulkResult, done: str, skipped: str) -> None:
    """One audit row for a bulk action: the ids in its filter (once), and in its detail what was done to how many
    alerts of which rules, in words: 'acknowledged: Dead letters waiting (38), Orders growing (3)'."""
    count = len(result.done)
    rules = ", ".join(f"{name} ({n})" for name, n in result.rules.most_common())
    detail = f"{done}: {rules}" if rules else f"{done}: none"
    if result.skipped:
        detail += f"; {len(result.skipped)} skipped ({skipped})"
    chosen: dict[str, Any] = {"ids": result.done}
    if result.skipped:
        chosen["skipped"] = result.skipped
    record_audit(
        actor=actor,
        action=action,
        target=f"{count} alert{'' if count == 1 else 's'}",
        filter=chosen,
        count=count,
        detail=detail,
    )


def silence_rule(*, rule: AlertRule, actor: Actor, until: dt.datetime | None) -> AlertRule:
    rule.silenced_until = until
    rule.save(update_fields=["silenced_until", "updated_at"])
    said = f"silenced until {stamp(until)}" if until else "silence lifted"
    record_audit(actor=actor, action="alerts.rule.silence", target=f"rule:{rule.pk}", detail=f"{rule.name}: {said}")
    return rule


def save_rule(*, rule: AlertRule, channels: Iterable[Channel], actor: Actor) -> AlertRule:
    """Create or update a rule. Changing what it watches ends its open alerts quietly: they meant something else."""
    creating = rule.pk is None
    with transaction.atomic():
        if not creating:
            before = AlertRule.objects.get(pk=rule.pk)
            if any(getattr(before, name) != getattr(rule, name) for name in CONDITION_FIELDS) or not rule.enabled:
                now = timezone.now()
                for alert in Alert.objects.open().filter(rule=rule):
                    _resolve_quietly(alert, now=now)
        rule.save()
        rule.channels.set(list(channels))
        record_audit(
            actor=actor,
            action="alerts.rule.create" if creating else "alerts.rule.update",
            target=f"rule:{rule.pk}",
            detail=f"{rule.name}: {rule.get_kind_display()}, {rule.scope_display}, {rule.severity}",
        )
    return rule


def delete_rule(*, rule: AlertRule, actor: Actor) -> None:
    record_audit(actor=actor, action="alerts.rule.delete", target=f"rule:{rule.pk}", detail=rule.name)
    rule.delete()


def save_channel(*, channel: Channel, actor: Actor, attach_to_all_rules: bool = False) -> Channel:
    """Create or update a channel; a new one can be attached to every existing rule at once."""
    creating = channel.pk is None
    with transaction.atomic():
        fields = CHANNEL_SETTINGS
        if not creating and channel.is_signed and not Channel.objects.get(pk=channel.pk).is_signed:
            # An e-mail channel turned into a webhook starts signing with a fresh secret, so the one its page shows
            # now has never been shown before (not even before an earlier turn to e-mail and back).
            channel.signing_secret = new_secret()
            fields = [*CHANNEL_SETTINGS, "signing_secret"]
        # An edit writes the form's fields only: the tick may have moved the channel's budget and counters since
        # the form was read, and saving the whole row would put the old values back.
        channel.save(update_fields=None if creating else fields)
        if attach_to_all_rules:
            channel.rules.add(*AlertRule.objects.all())
        record_audit(
            actor=actor,
            action="alerts.channel.create" if creating else "alerts.channel.update",
            target=f"channel:{channel.pk}",
            detail=f"{channel.name} ({channel.kind}) {_audit_target(channel)}",
        )
    return channel


def _audit_target(channel: Channel) -> str:
    """A channel's target as its audit row says it: viewers read the audit log, so a webhook's URL is its scheme
    and host only (the secret to post to it may be anywhere in the rest); an e-mail channel's addresses as they are."""
    notifier = NOTIFIERS.get(channel.kind)
    if notifier is not None and issubclass(notifier, WebhookNotifier):
        return notifier.audit_target(channel.target)
    return channel.target_display


def enable_channel(*, channel: Channel, actor: Actor) -> Channel:
    channel.enabled = True
    channel.disabled_reason = ""
    channel.disabled_at = None
    channel.failure_streak = 0
    channel.save(update_fields=["enabled", "disabled_reason", "disabled_at", "failure_streak"])
    record_audit(actor=actor, action="alerts.channel.enable", target=f"channel:{channel.pk}", detail=channel.name)
    return channel


def delete_channel(*, channel: Channel, actor: Actor) -> None:
    record_audit(actor=actor, action="alerts.channel.delete", target=f"channel:{channel.pk}", detail=channel.name)
    channel.delete()


class ChannelError(Exception):
    """A channel action that cannot be done now; the message says why."""


# At most this many alerts go in one summary of the alerts open now (the digest lists DIGEST_LIST_LIMIT of them).
OPEN_SUMMARY_LIMIT = 1000


def send_open_alerts(*, channel: Channel, actor: Actor) -> Notification:
    """Queue one digest of the alerts open now (firing or acknowledged, not silenced) of the rules this channel
    serves. A channel added or attached during an incident hears of alerts already firing only at their next
    reminder or recovery; this tells it now, once, when an admin asks. Raises ChannelError when the channel is
    disabled or no such alert is open."""
    if not channel.enabled:
        raise ChannelError("The channel is disabled: enable it first (a test can still be sent).")
    now = timezone.now()
    alerts = [
        alert
        for alert in Alert.objects.filter(
            status__in=(AlertStatus.FIRING, AlertStatus.ACKNOWLEDGED), rule__channels=channel
        )
        .select_related("rule")
        .distinct()
        .order_by("fired_at", "pk")[:OPEN_SUMMARY_LIMIT]
        if not _silenced(alert, now=now)
    ]
    if not alerts:
        raise ChannelError(
            "No alert of this channel's rules is firing or acknowledged now (silenced ones are left out)."
        )
    requested_by = getattr(actor, "username", "") or "system"
    notices = [notification_context(alert, kind=NotificationKind.REMINDER) for alert in alerts]
    with transaction.atomic():
        notification = Notification.objects.create(
            channel=channel,
            kind=NotificationKind.DIGEST,
            context=digest_context(notices) | {"requested_by": requested_by},
            created_at=now,
            next_attempt_at=now + QUEUED_LEASE,
        )
        record_audit(
            actor=actor,
            action="alerts.channel.send_open",
            target=f"channel:{channel.pk}",
            detail=f"{len(alerts)} open alert{'s' if len(alerts) != 1 else ''} sent to {channel.name}",
        )
        _enqueue([notification.pk])
    return notification


def send_test_notification(*, channel: Channel, actor: Actor) -> Notification:
    """Queue one test message to the channel (even a disabled one, to check it before switching it back on)."""
    now = timezone.now()
    with transaction.atomic():
        notification = Notification.objects.create(
            channel=channel,
            kind=NotificationKind.TEST,
            context={
                "event": "test",
                "channel": channel.name,
                "severity": "info",
                "rule": "Test notification",
                "summary": f"Test notification for channel {channel.name}.",
                "url": console_url(reverse("alerts:channel", args=[channel.pk])),
                "sent_by": getattr(actor, "username", "") or "system",
            },
            created_at=now,
            next_attempt_at=now + QUEUED_LEASE,
        )
        record_audit(actor=actor, action="alerts.channel.test", target=f"channel:{channel.pk}", detail=channel.name)
        _enqueue([notification.pk])
    return notification


def rotate_signing_secret(*, channel: Channel, actor: Actor, now: dt.datetime | None = None) -> str:
    """Give the channel a new signing secret and return it, for the page to show once. The old one keeps signing
    beside it for SIGNING_SECRET_OVERLAP (a rotation within that time ends the older one's overlap at once). The
    audit row says that the secret was rotated, never what it is. Raises ChannelError for a kind that is not
    signed."""
    if not channel.is_signed:
        raise ChannelError(f"{channel.kind_label} notifications are not signed: there is no secret to rotate.")
    now = now or timezone.now()
    with transaction.atomic():
        # Locked: of two rotations at once, the second keeps the first one's new secret (which its admin has just
        # been shown) as the previous one, signing for the overlap, rather than dropping it unused.
        locked = Channel.objects.select_for_update(no_key=True).get(pk=channel.pk)
        locked.previous_signing_secret = locked.signing_secret
        locked.previous_signing_secret_until = now + SIGNING_SECRET_OVERLAP
        locked.signing_secret = new_secret()
        locked.save(update_fields=["signing_secret", "previous_signing_secret", "previous_signing_secret_until"])
        record_audit(
            actor=actor,
            action="alerts.channel.rotate_secret",
            target=f"channel:{channel.pk}",
            detail=f"{channel.name}: signing secret rotated; the previous one also signs until "
            f"{stamp(locked.previous_signing_secret_until)}",
        )
    channel.signing_secret = locked.signing_secret
    channel.previous_signing_secret = locked.previous_signing_secret
    channel.previous_signing_secret_until = locked.previous_signing_secret_until
    return locked.signing_secret
