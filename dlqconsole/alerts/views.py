"""Alerts pages: current alerts and their history (everyone), acknowledge and silence (operators), rules and
channels (admins). Each page's URL also serves its htmx fragment."""

from __future__ import annotations

import datetime as dt
import re
from collections import Counter
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.db.models import Count, Min
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, QueryDict
from django.shortcuts import get_object_or_404, redirect, render
from django.template.defaultfilters import pluralize
from django.urls import reverse
from django.utils import timezone
from django.utils.cache import add_never_cache_headers
from django.utils.http import urlencode
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django.views.decorators.vary import vary_on_headers
from django_htmx.http import HttpResponseStopPolling

from dlqconsole.accounts.roles import ADMIN, OPERATOR, VIEWER, has_role, require_role
from dlqconsole.alerts import changes, delivery, digests
from dlqconsole.alerts.channel_secrets import reveal_signing_secret, revealed_secret
from dlqconsole.alerts.errors import AlertError, ChannelError
from dlqconsole.alerts.forms import KIND_DEFAULTS, BulkAlertForm, ChannelForm, RuleForm, SilenceForm
from dlqconsole.alerts.models import (
    SIGNING_SECRET_OVERLAP,
    Alert,
    AlertRule,
    AlertStatus,
    Channel,
    EvaluationState,
    Notification,
    NotificationStatus,
    Severity,
)
from dlqconsole.brokers import registry
from dlqconsole.brokers.models import NAME_PATTERN as BROKER_NAME
from dlqconsole.core.bidi import isolate
from dlqconsole.core.durations import format_duration
from dlqconsole.core.views import HtmxHttpRequest, keyset_page, parse_id, partial_template, safe_next
from dlqconsole.deadletters.templatetags.charts import stamp
from dlqconsole.ingest.models import QueueSample, WatchedQueue
from dlqconsole.operations.breaker_views import breaker_context

HISTORY_PAGE = 50
FINAL_NOTIFICATION_STATUSES = (
    NotificationStatus.SENT,
    NotificationStatus.FAILED,
    NotificationStatus.DIGESTED,
    NotificationStatus.SILENCED,
)


def _back(request: HtmxHttpRequest, fallback: str) -> HttpResponseRedirect:
    return HttpResponseRedirect(safe_next(request, request.POST.get("next")) or fallback)


# Alerts ---------------------------------------------------------------------------------------------------------


@require_GET
@vary_on_headers("HX-Request")
def alert_list(request: HtmxHttpRequest) -> HttpResponse:
    require_role(request.user, VIEWER)
    history = Alert.objects.history().select_related("rule").order_by("-id")
    rows, _, more = keyset_page(history, size=HISTORY_PAGE, before=parse_id(request.GET.get("before")))
    context = {
        **_current_context(request),
        "history": rows,
        "next_before": rows[-1].pk if more else None,
        "is_admin": has_role(request.user, ADMIN),
        "rules": AlertRule.objects.order_by("name").only("pk", "name"),
        "severities": Severity.choices,
        "brokers": registry.brokers(enabled=False),
    }
    partial = "history" if request.htmx and request.htmx.target == "alert-history" else "current"
    return render(request, partial_template(request, "alerts/list.html", partial), context)


def _list_filter(query: QueryDict) -> dict[str, str]:
    """The current list's filter, from the address (bookmarkable): a rule id, a severity and a broker name. Anything
    else is ignored rather than refused: an old bookmark to a deleted rule still shows the page."""
    chosen = {}
    rule = query.get("rule", "")
    if parse_id(rule) is not None:
        chosen["rule"] = rule
    severity = query.get("severity", "")
    if severity in Severity.values:
        chosen["severity"] = severity
    broker = query.get("broker", "")
    if re.fullmatch(BROKER_NAME, broker):
        chosen["broker"] = broker
    return chosen


def _several_brokers() -> bool:
    return len(registry.brokers(enabled=False)) > 1


def _filtered_url(name: str, chosen: dict[str, str]) -> str:
    return reverse(name) + (f"?{urlencode(chosen)}" if chosen else "")


def _current_context(request: HtmxHttpRequest) -> dict[str, Any]:
    """What the list's self-refreshing "current" section shows: firing alerts first, then acknowledged ones,
    narrowed by the filter in the address (the bulk form posts to an address carrying the same filter)."""
    chosen = _list_filter(request.GET)
    active = Alert.objects.active()
    pending = Alert.objects.filter(status=AlertStatus.PENDING)
    if "rule" in chosen:
        active, pending = active.filter(rule_id=int(chosen["rule"])), pending.filter(rule_id=int(chosen["rule"]))
    if "severity" in chosen:
        active, pending = active.filter(severity=chosen["severity"]), pending.filter(severity=chosen["severity"])
    if "broker" in chosen:
        active, pending = active.about_broker(chosen["broker"]), pending.about_broker(chosen["broker"])
    shown = list(active.select_related("rule", "acknowledged_by").firing_first())
    return {
        "active": shown,
        "by_rule": _by_rule(shown) if "rule" not in chosen else [],
        "firing_count": sum(alert.status == AlertStatus.FIRING for alert in shown),
        "pending": pending.select_related("rule").order_by("started_at"),
        "chosen": chosen,
        "list_url": _filtered_url("alerts:list", chosen),
        "bulk_url": _filtered_url("alerts:bulk", chosen),
        "state": EvaluationState.objects.filter(pk=1).first(),
        "silence_form": SilenceForm(),
        "can_operate": has_role(request.user, OPERATOR),
        "now": timezone.now(),
    }


def _by_rule(alerts: list[Alert]) -> list[tuple[AlertRule, int, int]]:
    """(rule, firing, acknowledged) for each rule of the alerts shown, most firing first: a storm of one rule
    (a new pattern a minute) is read at a glance and narrowed to in one click."""
    rules: dict[int, AlertRule] = {}
    counts: Counter[tuple[int, str]] = Counter()
    for alert in alerts:
        rules[alert.rule_id] = alert.rule
        counts[(alert.rule_id, alert.status)] += 1
    rows = [
        (rule, counts[(pk, AlertStatus.FIRING)], counts[(pk, AlertStatus.ACKNOWLEDGED)]) for pk, rule in rules.items()
    ]
    return sorted(rows, key=lambda row: (-row[1], -row[2], row[0].name)) if len(rows) > 1 else []


@require_GET
@vary_on_headers("HX-Request")
def alert_detail(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    require_role(request.user, VIEWER)
    alert = get_object_or_404(Alert.objects.select_related("rule__broker", "acknowledged_by"), pk=pk)
    context = {
        "alert": alert,
        "notifications": _alert_notifications(alert),
        "silence_form": SilenceForm(),
        "can_operate": has_role(request.user, OPERATOR),
        "is_admin": has_role(request.user, ADMIN),
        "several_brokers": _several_brokers(),
        "now": timezone.now(),
    }
    return render(request, partial_template(request, "alerts/detail.html", "summary"), context)


def _alert_notifications(alert: Alert) -> list[Notification]:
    """The alert's notifications, newest first; a notice that went out in a digest carries the digest (its
    outcome is the digest's)."""
    notices = alert.notifications.select_related("channel", "digest", "digest__channel").order_by("-id")
    return list(notices[:100])


def _alert_response(request: HtmxHttpRequest, alert: Alert) -> HttpResponse:
    """After a change: the alert's row (htmx from the list), its summary (htmx from its page), or a redirect."""
    if request.htmx:
        context = {
            "alert": alert,
            "silence_form": SilenceForm(),
            "can_operate": True,
            "now": timezone.now(),
            "notifications": _alert_notifications(alert),
            "list_url": safe_next(request, request.POST.get("next")) or reverse("alerts:list"),
            "several_brokers": _several_brokers(),
        }
        if request.POST.get("fragment") == "row":
            return render(request, "alerts/list.html#row", context)
        return render(request, "alerts/detail.html#summary", context)
    return _back(request, reverse("alerts:detail", args=[alert.pk]))


@require_POST
def alert_acknowledge(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    require_role(request.user, OPERATOR)
    alert = get_object_or_404(Alert.objects.select_related("rule"), pk=pk)
    try:
        alert = changes.acknowledge_alert(alert=alert, actor=request.user)
    except AlertError as error:
        messages.error(request, str(error))
    else:
        messages.success(request, "Acknowledged: no more reminders for this alert.")
    alert.refresh_from_db()
    return _alert_response(request, alert)


@require_POST
def alert_silence(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    require_role(request.user, OPERATOR)
    alert = get_object_or_404(Alert.objects.select_related("rule"), pk=pk)
    form = SilenceForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose how long to silence the alert.")
        return _alert_response(request, alert)
    until = form.until()
    try:
        changes.silence_alert(alert=alert, actor=request.user, until=until)
    except AlertError as error:
        messages.error(request, str(error))
    else:
        messages.success(request, f"Silenced until {stamp(until)}." if until else "Silence lifted.")
    alert.refresh_from_db()
    return _alert_response(request, alert)


@require_POST
def alert_bulk(request: HtmxHttpRequest) -> HttpResponse:
    """Acknowledge or silence the ticked alerts (or every firing one) in one go, during an incident."""
    require_role(request.user, OPERATOR)
    form = BulkAlertForm(request.POST)
    if not form.is_valid():
        for errors in form.errors.values():
            messages.error(request, " ".join(str(error) for error in errors))
    elif form.cleaned_data["action"] == "acknowledge":
        result = changes.acknowledge_alerts(alerts=form.alerts(), actor=request.user)
        _bulk_message(request, result, done="Acknowledged", skipped="no longer firing")
    else:
        until = form.until()
        result = changes.silence_alerts(alerts=form.alerts(), actor=request.user, until=until)
        done = f"Silenced until {stamp(until)}:" if until else "Silence lifted for"
        _bulk_message(request, result, done=done, skipped="already resolved")
    if request.htmx:
        return render(request, "alerts/list.html#current", _current_context(request))
    return redirect(_filtered_url("alerts:list", _list_filter(request.GET)))


def _bulk_message(request: HttpRequest, result: changes.BulkResult, *, done: str, skipped: str) -> None:
    count = len(result.done)
    if count:
        messages.success(request, f"{done} {count} alert{pluralize(count)}.")
    if result.skipped:
        messages.warning(request, f"{len(result.skipped)} skipped: {skipped}.")
    if not count and not result.skipped:
        messages.warning(request, "No alert to act on.")


# Watched queues -------------------------------------------------------------------------------------------------


@require_GET
@vary_on_headers("HX-Request")
def queue_list(request: HtmxHttpRequest) -> HttpResponse:
    """Depth of each watched work queue and its DLQ over the last hour, from the samples; grouped by broker where
    there are several (?broker=NAME shows one)."""
    require_role(request.user, VIEWER)
    now = timezone.now()
    since = now - dt.timedelta(hours=1)
    brokers = registry.brokers(enabled=False)
    asked = request.GET.get("broker", "")
    known = [broker.name for broker in brokers]
    # A name no broker has shows every broker, saying so, rather than reading as that broker's queues.
    chosen = asked if asked in known else ""
    watched = WatchedQueue.objects.filter(enabled=True).select_related("broker").order_by("broker__name", "name")
    if chosen:
        watched = watched.filter(broker__name=chosen)
    else:
        chosen = ""
    queues = list(watched)
    keys = {(queue.broker_id, name) for queue in queues for name in (queue.name, queue.dead_letter_queue)}
    series: dict[tuple[int | None, str], list[QueueSample]] = {key: [] for key in keys}
    samples = QueueSample.objects.filter(queue__in={name for _, name in keys}, sampled_at__gte=since)
    for sample in samples.order_by("sampled_at"):
        found = series.get((sample.broker_id, sample.queue))
        if found is not None:
            found.append(sample)
    rows = []
    for queue in queues:
        work, dead = series[(queue.broker_id, queue.name)], series[(queue.broker_id, queue.dead_letter_queue)]
        latest = work[-1] if work else None
        depth = latest.messages if latest else None
        if depth is None:
            level = "unknown"
        elif depth >= queue.emergency_depth:
            level = "emergency"
        elif depth >= queue.critical_depth:
            level = "critical"
        elif depth >= queue.warning_depth:
            level = "warning"
        else:
            level = "normal"
        rows.append(
            {
                "queue": queue,
                "latest": latest,
                "dlq_latest": dead[-1] if dead else None,
                "level": level,
                # At most 120 points per line: every n-th sample of the hour.
                "depths": [sample.messages for sample in work[:: max(1, len(work) // 120)]],
                "dlq_depths": [sample.messages for sample in dead[:: max(1, len(dead) // 120)]],
            }
        )
    context = {
        "rows": rows,
        "now": now,
        "several_brokers": len(brokers) > 1,
        "chosen": chosen,
        "unknown_broker": registry.unknown_broker_notice(asked, known),
        "refresh_url": _filtered_url("alerts:queues", {"broker": chosen} if chosen else {}),
        **breaker_context(request),
    }
    return render(request, partial_template(request, "alerts/queues.html", "queues"), context)


# Rules ----------------------------------------------------------------------------------------------------------


@require_GET
def rule_list(request: HtmxHttpRequest) -> HttpResponse:
    require_role(request.user, ADMIN)
    rules = AlertRule.objects.select_related("pattern", "broker").prefetch_related("channels").order_by("name")
    return render(request, "alerts/rules.html", {"rules": rules, "silence_form": SilenceForm(), "now": timezone.now()})


@require_http_methods(["GET", "POST"])
def rule_edit(request: HtmxHttpRequest, pk: int | None = None) -> HttpResponse:
    require_role(request.user, ADMIN)
    rule = get_object_or_404(AlertRule, pk=pk) if pk is not None else AlertRule()
    form = RuleForm(request.POST or None, instance=rule, kind=request.GET.get("kind", ""))
    if request.method == "POST" and form.is_valid():
        saved = changes.save_rule(
            rule=form.save(commit=False), channels=form.cleaned_data["channels"], actor=request.user
        )
        messages.success(request, f"Rule “{isolate(saved.name)}” saved.")
        for warning in form.warnings:
            messages.warning(request, warning)
        return redirect("alerts:rules")
    context = {"form": form, "rule": rule, "kind_defaults": KIND_DEFAULTS}
    return render(request, "alerts/rule_form.html", context, status=400 if form.errors else 200)


@require_POST
def rule_silence(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    require_role(request.user, ADMIN)
    rule = get_object_or_404(AlertRule, pk=pk)
    form = SilenceForm(request.POST)
    if form.is_valid():
        until = form.until()
        changes.silence_rule(rule=rule, actor=request.user, until=until)
        said = (
            f"“{isolate(rule.name)}” silenced until {stamp(until)}."
            if until
            else f"“{isolate(rule.name)}” speaks again."
        )
        messages.success(request, said)
    return redirect("alerts:rules")


@require_POST
def rule_delete(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    require_role(request.user, ADMIN)
    rule = get_object_or_404(AlertRule, pk=pk)
    changes.delete_rule(rule=rule, actor=request.user)
    messages.success(request, f"Rule “{isolate(rule.name)}” deleted.")
    return redirect("alerts:rules")


# Channels -------------------------------------------------------------------------------------------------------


@require_GET
def channel_list(request: HtmxHttpRequest) -> HttpResponse:
    require_role(request.user, ADMIN)
    channels = list(Channel.objects.prefetch_related("rules"))
    held = _held_by_channel()
    for channel in channels:
        channel.held = held.get(channel.pk)  # type: ignore[attr-defined]
    budget = {"burst": settings.DLQ_NOTIFY_BURST, "window": format_duration(settings.DLQ_NOTIFY_WINDOW)}
    return render(request, "alerts/channels.html", {"channels": channels, **budget})


def _held_by_channel(channel: Channel | None = None) -> dict[int, Any]:
    """Notices held for a digest, per channel: how many, and when the first digest goes."""
    held = Notification.objects.filter(status=NotificationStatus.HELD)
    if channel is not None:
        held = held.filter(channel=channel)
    return {
        row["channel_id"]: row
        for row in held.values("channel_id").annotate(count=Count("pk"), until=Min("next_attempt_at")).order_by()
    }


@require_GET
@vary_on_headers("HX-Request")
def channel_detail(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    require_role(request.user, ADMIN)
    channel = get_object_or_404(Channel, pk=pk)
    now = timezone.now()
    secret = "" if request.htmx else revealed_secret(request, channel)
    context = {
        "channel": channel,
        "notifications": channel.notifications.select_related("alert", "channel").order_by("-id")[:50],
        "rules": channel.rules.order_by("name"),
        "held": _held_by_channel(channel).get(channel.pk),
        "signing_secret": secret,
        "overlap_until": channel.previous_signing_secret_until if channel.previous_signing_overlaps(now) else None,
        "overlap_hours": round(SIGNING_SECRET_OVERLAP.total_seconds() / 3600),
    }
    response = render(request, partial_template(request, "alerts/channel.html", "notifications"), context)
    if secret:
        # Neither the browser's history nor a proxy keeps the one page that shows the secret.
        add_never_cache_headers(response)
    return response


@require_http_methods(["GET", "POST"])
def channel_edit(request: HtmxHttpRequest, pk: int | None = None) -> HttpResponse:
    require_role(request.user, ADMIN)
    channel = get_object_or_404(Channel, pk=pk) if pk is not None else Channel()
    # Read before the form writes the posted kind into the channel.
    was_signed = channel.pk is not None and channel.is_signed
    form = ChannelForm(request.POST or None, instance=channel)
    if request.method == "POST" and form.is_valid():
        saved = changes.save_channel(
            channel=form.save(commit=False),
            actor=request.user,
            attach_to_all_rules=bool(form.cleaned_data.get("attach_to_all_rules")),
        )
        messages.success(request, f"Channel “{isolate(saved.name)}” saved. Send a test to check it.")
        if saved.is_signed and not was_signed:
            # A new webhook channel, or one that starts signing (changes.save_channel gave it a fresh secret).
            reveal_signing_secret(request, saved)
        return redirect("alerts:channel", pk=saved.pk)
    return render(
        request, "alerts/channel_form.html", {"form": form, "channel": channel}, status=400 if form.errors else 200
    )


@require_POST
def channel_test(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    require_role(request.user, ADMIN)
    channel = get_object_or_404(Channel, pk=pk)
    notification = delivery.send_test_notification(channel=channel, actor=request.user)
    if request.htmx:
        return render(request, "alerts/notification.html#notification", {"notification": notification})
    messages.success(request, "Test notification queued; its outcome shows below.")
    return redirect("alerts:channel", pk=channel.pk)


@require_POST
def channel_rotate_secret(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """Make a new signing secret, shown once on the channel's page that follows."""
    require_role(request.user, ADMIN)
    channel = get_object_or_404(Channel, pk=pk)
    try:
        changes.rotate_signing_secret(channel=channel, actor=request.user)
    except ChannelError as problem:
        messages.error(request, str(problem))
    else:
        reveal_signing_secret(request, channel)
        messages.success(
            request,
            "New signing secret made: copy it below, it is shown this once. The previous secret also signs until "
            f"{stamp(channel.previous_signing_secret_until)}, while the receiver is given the new one.",
        )
    return redirect("alerts:channel", pk=channel.pk)


@require_POST
def channel_send_open(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """Send the alerts open now to this channel, once (see digests.send_open_alerts)."""
    require_role(request.user, ADMIN)
    channel = get_object_or_404(Channel, pk=pk)
    try:
        notification = digests.send_open_alerts(channel=channel, actor=request.user)
    except ChannelError as problem:
        messages.error(request, str(problem))
        return redirect("alerts:channel", pk=channel.pk)
    count = notification.context.get("count", 0)
    messages.success(request, f"{count} open alert{pluralize(count)} queued for this channel as one digest.")
    return redirect("alerts:channel", pk=channel.pk)


@require_POST
def channel_enable(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    require_role(request.user, ADMIN)
    channel = get_object_or_404(Channel, pk=pk)
    changes.enable_channel(channel=channel, actor=request.user)
    messages.success(request, f"Channel “{isolate(channel.name)}” is enabled again.")
    return redirect("alerts:channel", pk=channel.pk)


@require_POST
def channel_delete(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    require_role(request.user, ADMIN)
    channel = get_object_or_404(Channel, pk=pk)
    changes.delete_channel(channel=channel, actor=request.user)
    messages.success(request, f"Channel “{isolate(channel.name)}” deleted.")
    return redirect("alerts:channels")


@require_GET
@vary_on_headers("HX-Request")
def notification_status(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """One notification's outcome; the htmx fragment polls until it is sent or has failed."""
    require_role(request.user, ADMIN)
    notification = get_object_or_404(Notification.objects.select_related("channel"), pk=pk)
    if request.htmx:
        response = render(request, "alerts/notification.html#notification", {"notification": notification})
        if notification.status in FINAL_NOTIFICATION_STATUSES:
            # Swap in the final state, and tell htmx to stop polling (status 286).
            stop = HttpResponseStopPolling()
            stop.content = response.content
            return stop
        return response
    return render(request, "alerts/notification.html", {"notification": notification})
