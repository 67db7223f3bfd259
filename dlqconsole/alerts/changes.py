"""The changes people make: acknowledging and silencing alerts (one or many at once), editing, silencing and
deleting rules, editing, enabling and deleting channels, and rotating a channel's signing secret. Each writes its
audit row; a rule edit that changes what the rule watches ends its open alerts quietly.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import transaction
from django.utils import timezone

from dlqconsole.accounts.services import record_audit
from dlqconsole.alerts.errors import AlertError, ChannelError
from dlqconsole.alerts.evaluation import resolve_quietly
from dlqconsole.alerts.models import (
    CHANNEL_SETTINGS,
    SIGNING_SECRET_OVERLAP,
    Alert,
    AlertRule,
    AlertStatus,
    Channel,
)
from dlqconsole.alerts.notifiers import NOTIFIERS
from dlqconsole.alerts.notifiers.webhook import WebhookNotifier
from dlqconsole.alerts.signing import new_secret
from dlqconsole.deadletters.templatetags.charts import stamp

Actor = AbstractBaseUser | AnonymousUser | None

# The rule fields that change what an alert means; editing them closes the rule's open alerts.
CONDITION_FIELDS = ("kind", "broker_id", "queue", "pattern_id", "threshold", "window_seconds", "severity")


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
                    resolve_quietly(alert, now=now)
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
