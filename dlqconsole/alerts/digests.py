"""Digests: one message for many notices. A channel over its budget holds its notices until its window ends,
then they go as one digest; and an admin can send a channel one digest of the alerts open now.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from dlqconsole.accounts.services import record_audit
from dlqconsole.alerts.delivery import QUEUED_LEASE, console_url, enqueue, notification_context
from dlqconsole.alerts.errors import ChannelError
from dlqconsole.alerts.models import (
    DIGESTED_KINDS,
    SEVERITY_RANK,
    Alert,
    AlertStatus,
    Channel,
    Notification,
    NotificationKind,
    NotificationStatus,
)

Actor = AbstractBaseUser | AnonymousUser | None

# A digest lists at most this many notices in full and says how many more it holds.
DIGEST_LIST_LIMIT = 50


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
        enqueue(digests)
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
        .select_related("rule__broker")
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
        enqueue([notification.pk])
    return notification
