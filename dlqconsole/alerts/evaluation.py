"""The evaluation tick: every enabled rule checked against the counters, and the alert lifecycle it drives
(pending, firing, resolved), with the growth samples the growth rule reads on the next tick.

The tick only reads counters and writes alert rows; it never talks to a channel. The notices it decides on are
queued by delivery.announce as rows that a Celery task sends one at a time, so a slow or broken channel cannot
hold the tick up. What each rule kind checks is in conditions.py.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections import defaultdict
from dataclasses import dataclass

from django.db import transaction
from django.db.models import F, prefetch_related_objects
from django.utils import timezone

from dlqconsole.alerts import conditions
from dlqconsole.alerts.delivery import announce
from dlqconsole.alerts.models import (
    Alert,
    AlertRule,
    AlertStatus,
    EvaluationState,
    GrowthSample,
    NotificationKind,
    RuleKind,
)

logger = logging.getLogger(__name__)

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


@dataclass
class TickResult:
    skipped: bool = False
    rules: int = 0
    fired: int = 0
    resolved: int = 0
    notifications: int = 0
    duration_ms: float = 0.0


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
        rules = list(AlertRule.objects.enabled().select_related("broker"))
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
        try:
            # A savepoint: a failed read must not abort the tick's transaction for the rules that follow.
            with transaction.atomic():
                conditions.prefetch(rules, facts)
        except Exception:
            # Each rule reads what it needs by itself then; one that cannot is logged below.
            logger.exception("the facts shared by the alert rules could not be read ahead")
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
            resolve_quietly(alert, now=now)
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


def _announce(alert: Alert, *, rule: AlertRule, kind: str, now: dt.datetime) -> int:
    # A rule's channels are read on its first notice of the tick (once), not for every rule on every tick.
    prefetch_related_objects([rule], "channels")
    return announce(alert, rule=rule, kind=kind, now=now)


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


def resolve_quietly(alert: Alert, *, now: dt.datetime) -> None:
    """End an open alert without a notice (its rule was disabled, or changed what it watches); a pending one,
    never announced, is deleted."""
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
