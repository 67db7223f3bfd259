"""Notification delivery: the notices the evaluation tick decides on, queued to each channel within its budget
or held for the channel's digest; their sending, one at a time by a Celery task, with retries and backoff, and a
channel switched off when it keeps failing; a test send an admin asks for; and the retention of finished
notifications.

Every notification is a row: the task claims it with a conditional update, so a redelivered task sends nothing
twice, and the sweep enqueues again what a lost task or a dead worker left behind.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterable
from functools import partial
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import transaction
from django.db.models import F
from django.urls import reverse
from django.utils import timezone

from dlqconsole.accounts.services import record_audit
from dlqconsole.alerts.models import (
    Alert,
    AlertRule,
    Channel,
    Notification,
    NotificationKind,
    NotificationStatus,
)
from dlqconsole.alerts.notifiers import NotifierError

logger = logging.getLogger(__name__)

Actor = AbstractBaseUser | AnonymousUser | None

# A queued notification whose task has not claimed it by then is assumed lost and enqueued again.
QUEUED_LEASE = dt.timedelta(seconds=60)
# A send that started this long ago without an outcome belongs to a worker that died.
SENDING_STALE_AFTER = dt.timedelta(seconds=120)
# What a channel switched off fails instead of sending.
WAITING_STATUSES = (NotificationStatus.QUEUED, NotificationStatus.RETRYING, NotificationStatus.HELD)


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
        # The broker of the alert's queue (or of its rule); "" when it spans brokers.
        "broker": alert.broker_name,
        "label": alert.subject_label,
        "summary": alert.summary,
        "value": alert.value,
        "started_at": iso(alert.started_at),
        "fired_at": iso(alert.fired_at),
        "resolved_at": iso(alert.resolved_at),
        "url": console_url(reverse("alerts:detail", args=[alert.pk])),
    }


def announce(alert: Alert, *, rule: AlertRule, kind: str, now: dt.datetime) -> int:
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
    enqueue([row.pk for row in created if row.status == NotificationStatus.QUEUED])
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


def enqueue(notification_ids: Iterable[int]) -> None:
    """Have each notification's task send it once the transaction that made it commits."""
    # Imported here: the tasks import this module (a service enqueueing its own task).
    from dlqconsole.alerts.tasks import send_notification

    for notification_id in notification_ids:
        transaction.on_commit(partial(send_notification.delay, notification_id))


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
        enqueue([notification.pk])
    return notification


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
            enqueue(due)
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
