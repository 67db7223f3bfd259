"""Notification storms become digests: per channel, DLQ_NOTIFY_BURST notices go out one by one within
DLQ_NOTIFY_WINDOW and the rest go out together as one digest when the window ends. Outbound HTTP is mocked with
`responses`; everything else (PostgreSQL, the services, the pages) is real."""

from __future__ import annotations

import datetime as dt
import json
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import responses
from django.contrib.auth.models import User
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction
from django.db.models import Count
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone

from dlqconsole.alerts import conditions
from dlqconsole.alerts.changes import save_channel, save_rule
from dlqconsole.alerts.delivery import (
    deliver_notification,
    disable_channel,
    enqueue_due_notifications,
    send_test_notification,
)
from dlqconsole.alerts.digests import digest_context, send_due_digests
from dlqconsole.alerts.evaluation import evaluate_rules
from dlqconsole.alerts.models import (
    Alert,
    AlertRule,
    Channel,
    Notification,
    NotificationKind,
    NotificationStatus,
)
from dlqconsole.alerts.tasks import retry_notifications
from dlqconsole.core.env import env_duration
from tests.alerts.conftest import settle
from tests.conftest import client_for
from tests.factories import parked, rule

pytestmark = [pytest.mark.django_db]

HOOK = "https://hooks.example.com/ops"
OTHER_HOOK = "https://hooks.example.com/other"
WINDOW = dt.timedelta(minutes=5)
# A letter per new failure pattern: distinct error types never group together.
NAMES = [f"{first}{second}" for first in "ABCDEFGHIJ" for second in "KLMNOPQRST"]


def storm(count: int, *, start: int = 0) -> None:
    """`count` brand-new failure patterns, one dead letter each, in orders.dlq."""
    for index in range(start, start + count):
        parked(1, error_type=f"Storm{NAMES[index]}Error", message=f"Storm {NAMES[index]} <failed> & gave up")


def posted(mock: responses.RequestsMock, url: str = HOOK) -> list[dict[str, Any]]:
    return [json.loads(call.request.body or b"{}") for call in mock.calls if call.request.url == url]


def deliver_queued() -> None:
    for pk in Notification.objects.filter(status=NotificationStatus.QUEUED).order_by("pk").values_list("pk", flat=True):
        deliver_notification(notification_id=pk)


@pytest.fixture
def http() -> Iterator[responses.RequestsMock]:
    """Outbound HTTP, mocked: both hooks answer 200 unless a test says otherwise."""
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        mock.add(responses.POST, HOOK, status=200)
        mock.add(responses.POST, OTHER_HOOK, status=200)
        yield mock


@pytest.fixture
def hook(db: None, http: responses.RequestsMock) -> Channel:
    return Channel.objects.create(name="ops hook", kind="webhook", target=HOOK)


@pytest.fixture
def new_pattern_rule(hook: Channel) -> AlertRule:
    return rule("new_pattern", channels=[hook], window_seconds=3600)


# The budget -----------------------------------------------------------------------------------------------------


@override_settings(DLQ_NOTIFY_BURST=5, DLQ_NOTIFY_WINDOW=300)
def test_a_burst_of_twenty_gives_five_sends_then_one_digest_of_fifteen(
    http: responses.RequestsMock, hook: Channel, new_pattern_rule: AlertRule
) -> None:
    storm(20)
    now = timezone.now()

    evaluate_rules(now=now)
    deliver_queued()

    assert Alert.objects.filter(status="firing").count() == 20
    singles = posted(http)
    assert len(singles) == 5 and {body["event"] for body in singles} == {"firing"}
    held = Notification.objects.filter(channel=hook, status=NotificationStatus.HELD)
    assert held.count() == 15
    assert set(held.values_list("next_attempt_at", flat=True)) == {now + WINDOW}
    # Nothing goes before the window ends.
    assert send_due_digests(now=now + WINDOW - dt.timedelta(seconds=1)) == 0

    assert send_due_digests(now=now + WINDOW) == 1
    deliver_queued()

    digest = Notification.objects.get(kind=NotificationKind.DIGEST)
    assert digest.status == NotificationStatus.SENT and digest.alert is None
    bodies = posted(http)
    assert len(bodies) == 6
    body = bodies[-1]
    assert body["event"] == "digest" and body["count"] == 15 and body["more"] == 0
    assert body["counts"] == {"firing": 15}
    assert body["url"].endswith(reverse("alerts:list"))
    sent_alerts = {single["alert_id"] for single in singles}
    digested_alerts = {notice["alert_id"] for notice in body["notices"]}
    assert len(digested_alerts) == 15 and not sent_alerts & digested_alerts
    assert sent_alerts | digested_alerts == set(Alert.objects.values_list("pk", flat=True))
    notice = body["notices"][0]
    assert {"rule", "severity", "label", "summary", "url", "event"} <= set(notice)
    assert notice["rule"] == new_pattern_rule.name and notice["event"] == "firing"
    assert body["text"].startswith("15 alert notices: 15 firing")
    assert len(body["text"].splitlines()) == 1 + 15 + 1
    assert set(Notification.objects.filter(digest=digest).values_list("status", flat=True)) == {"digested"}
    assert Notification.objects.filter(digest=digest).count() == 15
    hook.refresh_from_db()
    assert hook.sent_count == 6
    # The window is over: the channel is quiet again, so its next notice goes at once.
    assert (hook.notice_window_ends_at, hook.notice_window_sent) == (None, 0)
    assert send_due_digests(now=now + 2 * WINDOW) == 0


@override_settings(DLQ_NOTIFY_BURST=5, DLQ_NOTIFY_WINDOW=300)
def test_a_second_channel_has_a_budget_of_its_own(
    http: responses.RequestsMock, hook: Channel, new_pattern_rule: AlertRule
) -> None:
    storm(5)
    now = timezone.now()
    evaluate_rules(now=now)
    other = Channel.objects.create(name="other hook", kind="webhook", target=OTHER_HOOK)
    new_pattern_rule.channels.add(other)

    storm(3, start=5)
    evaluate_rules(now=now + dt.timedelta(seconds=10))
    deliver_queued()

    statuses = dict(Notification.objects.filter(channel=hook).values_list("status").annotate(n=Count("pk")).order_by())
    assert statuses == {"sent": 5, "held": 3}
    assert [body["event"] for body in posted(http, OTHER_HOOK)] == ["firing"] * 3
    assert not Notification.objects.filter(channel=other, status=NotificationStatus.HELD).exists()


@override_settings(DLQ_NOTIFY_BURST=1, DLQ_NOTIFY_WINDOW=300)
def test_the_first_notice_of_a_quiet_channel_is_never_held(
    hook: Channel, new_pattern_rule: AlertRule, django_capture_on_commit_callbacks: Any
) -> None:
    now = timezone.now()
    # The channel spoke long ago; that window ended.
    Channel.objects.filter(pk=hook.pk).update(notice_window_ends_at=now - dt.timedelta(seconds=1), notice_window_sent=1)
    storm(1)

    with django_capture_on_commit_callbacks() as callbacks:
        evaluate_rules(now=now)

    notification = Notification.objects.get(channel=hook)
    assert notification.status == NotificationStatus.QUEUED and len(callbacks) == 1
    hook.refresh_from_db()
    assert (hook.notice_window_ends_at, hook.notice_window_sent) == (now + WINDOW, 1)
    # With a budget of one, the next notice in the same window waits for the digest.
    storm(1, start=1)
    evaluate_rules(now=now + dt.timedelta(seconds=5))
    assert Notification.objects.filter(channel=hook, status=NotificationStatus.HELD).count() == 1


@override_settings(DLQ_NOTIFY_BURST=5, DLQ_NOTIFY_WINDOW=300)
def test_the_first_notice_of_each_rule_in_a_window_goes_at_once_over_the_budget(
    http: responses.RequestsMock, hook: Channel, new_pattern_rule: AlertRule
) -> None:
    storm(7)
    now = timezone.now()
    evaluate_rules(now=now)
    assert Notification.objects.filter(channel=hook, status=NotificationStatus.HELD).count() == 2

    # The budget is spent by new patterns, yet another rule's first word is not held back for the digest...
    waiting = rule("dlq_not_empty", channels=[hook])
    evaluate_rules(now=now + dt.timedelta(seconds=5))
    first = Notification.objects.get(channel=hook, alert__rule=waiting)
    assert first.status == NotificationStatus.QUEUED
    deliver_queued()
    assert [body["rule"] for body in posted(http)].count(waiting.name) == 1

    # ...while the storming rule's next notices still wait for it.
    storm(1, start=7)
    evaluate_rules(now=now + dt.timedelta(seconds=10))
    assert Notification.objects.filter(channel=hook, status=NotificationStatus.HELD).count() == 3
    assert send_due_digests(now=now + WINDOW) == 1
    digest = Notification.objects.get(kind=NotificationKind.DIGEST)
    assert digest.context["count"] == 3 and {notice["rule"] for notice in digest.context["notices"]} == {
        new_pattern_rule.name
    }


@override_settings(DLQ_NOTIFY_BURST=1, DLQ_NOTIFY_WINDOW=300)
def test_reminders_and_recoveries_count_against_the_budget(hook: Channel) -> None:
    rule("dlq_not_empty", channels=[hook])
    letters = parked(1)
    now = timezone.now()
    evaluate_rules(now=now)
    settle(letters)
    evaluate_rules(now=now + dt.timedelta(seconds=5))

    resolved = Notification.objects.get(channel=hook, kind=NotificationKind.RESOLVED)
    assert resolved.status == NotificationStatus.HELD
    send_due_digests(now=now + WINDOW)
    digest = Notification.objects.get(kind=NotificationKind.DIGEST)
    assert digest.context["counts"] == {"resolved": 1}
    assert digest.context["notices"][0]["event"] == "resolved"


@override_settings(DLQ_NOTIFY_BURST=1, DLQ_NOTIFY_WINDOW=300)
def test_notices_silenced_while_held_stay_out_of_the_digest(
    http: responses.RequestsMock, hook: Channel, new_pattern_rule: AlertRule
) -> None:
    storm(4)
    now = timezone.now()
    evaluate_rules(now=now)
    held = list(Notification.objects.filter(channel=hook, status=NotificationStatus.HELD).order_by("pk"))
    assert len(held) == 3
    # An operator silences one of the storm's alerts before the window ends.
    assert held[0].alert is not None
    Alert.objects.filter(pk=held[0].alert.pk).update(silenced_until=now + dt.timedelta(hours=1))

    assert send_due_digests(now=now + WINDOW) == 1

    held[0].refresh_from_db()
    assert held[0].status == NotificationStatus.SILENCED and held[0].digest is None
    digest = Notification.objects.get(kind=NotificationKind.DIGEST)
    assert digest.context["count"] == 2
    assert {notice["alert_id"] for notice in digest.context["notices"]} == {held[1].alert_id, held[2].alert_id}


@override_settings(DLQ_NOTIFY_BURST=1, DLQ_NOTIFY_WINDOW=300)
def test_a_rule_silenced_while_its_notices_are_held_sends_no_digest(hook: Channel, new_pattern_rule: AlertRule) -> None:
    storm(3)
    now = timezone.now()
    evaluate_rules(now=now)
    AlertRule.objects.filter(pk=new_pattern_rule.pk).update(silenced_until=now + dt.timedelta(hours=1))

    assert send_due_digests(now=now + WINDOW) == 0

    assert not Notification.objects.filter(kind=NotificationKind.DIGEST).exists()
    assert set(
        Notification.objects.filter(channel=hook)
        .exclude(status=NotificationStatus.QUEUED)
        .values_list("status", flat=True)
    ) == {NotificationStatus.SILENCED}


@override_settings(DLQ_NOTIFY_BURST=1, DLQ_NOTIFY_WINDOW=300)
def test_test_sends_are_never_held_or_counted(hook: Channel, new_pattern_rule: AlertRule) -> None:
    storm(1)
    evaluate_rules()
    hook.refresh_from_db()
    spent = (hook.notice_window_ends_at, hook.notice_window_sent)

    test = send_test_notification(channel=hook, actor=None)

    assert test.status == NotificationStatus.QUEUED
    hook.refresh_from_db()
    assert (hook.notice_window_ends_at, hook.notice_window_sent) == spent
    # And on a quiet channel a test send opens no window.
    quiet = Channel.objects.create(name="quiet", kind="webhook", target=OTHER_HOOK)
    send_test_notification(channel=quiet, actor=None)
    quiet.refresh_from_db()
    assert (quiet.notice_window_ends_at, quiet.notice_window_sent) == (None, 0)


@override_settings(DLQ_NOTIFY_BURST=1, DLQ_NOTIFY_WINDOW=300)
def test_held_notices_of_a_disabled_channel_fail(hook: Channel, new_pattern_rule: AlertRule) -> None:
    storm(3)
    now = timezone.now()
    evaluate_rules(now=now)
    assert Notification.objects.filter(status=NotificationStatus.HELD).count() == 2

    disable_channel(channel=hook, reason="receiver gone")

    held = Notification.objects.filter(channel=hook).exclude(status=NotificationStatus.FAILED)
    assert not held.exists()
    assert Notification.objects.filter(error="Channel disabled: receiver gone").count() == 3
    assert send_due_digests(now=now + WINDOW) == 0


@override_settings(DLQ_NOTIFY_BURST=1, DLQ_NOTIFY_WINDOW=300)
def test_held_notices_of_a_channel_switched_off_meanwhile_fail_at_the_digest(
    hook: Channel, new_pattern_rule: AlertRule
) -> None:
    storm(2)
    now = timezone.now()
    evaluate_rules(now=now)
    Channel.objects.filter(pk=hook.pk).update(enabled=False, disabled_reason="switched off")

    assert send_due_digests(now=now + WINDOW) == 0

    (held,) = Notification.objects.filter(channel=hook, kind=NotificationKind.FIRING, alert__isnull=False).exclude(
        status=NotificationStatus.QUEUED
    )
    assert (held.status, held.error) == (NotificationStatus.FAILED, "Channel disabled: switched off")
    assert not Notification.objects.filter(kind=NotificationKind.DIGEST).exists()


# Delivery -------------------------------------------------------------------------------------------------------


@override_settings(DLQ_NOTIFY_BURST=1, DLQ_NOTIFY_WINDOW=300, DLQ_NOTIFICATION_RETRY_SECONDS=10)
def test_a_failing_receiver_retries_the_digest(
    http: responses.RequestsMock, hook: Channel, new_pattern_rule: AlertRule
) -> None:
    storm(3)
    now = timezone.now()
    evaluate_rules(now=now)
    deliver_queued()
    http.replace(responses.POST, HOOK, status=503)
    send_due_digests(now=now + WINDOW)
    digest = Notification.objects.get(kind=NotificationKind.DIGEST)

    deliver_notification(notification_id=digest.pk, now=now + WINDOW)

    digest.refresh_from_db()
    assert (digest.status, digest.attempts) == (NotificationStatus.RETRYING, 1)
    assert digest.error.startswith("HTTP 503")
    assert digest.next_attempt_at == now + WINDOW + dt.timedelta(seconds=10)
    http.replace(responses.POST, HOOK, status=200)
    assert enqueue_due_notifications(now=now + WINDOW + dt.timedelta(seconds=10)) == 1

    deliver_notification(notification_id=digest.pk)

    digest.refresh_from_db()
    assert (digest.status, digest.attempts, digest.error) == (NotificationStatus.SENT, 2, "")
    bodies = [json.loads(call.request.body or b"{}") for call in http.calls]
    assert [body["event"] for body in bodies] == ["firing", "digest", "digest"]
    assert bodies[-1]["count"] == 2
    assert set(Notification.objects.filter(digest=digest).values_list("status", flat=True)) == {"digested"}
    hook.refresh_from_db()
    assert (hook.sent_count, hook.failure_streak) == (2, 0)


@override_settings(DLQ_NOTIFY_BURST=1, DLQ_NOTIFY_WINDOW=300)
def test_a_digest_that_fails_for_good_disables_the_channel(
    http: responses.RequestsMock, hook: Channel, new_pattern_rule: AlertRule
) -> None:
    http.replace(responses.POST, HOOK, status=410)
    storm(2)
    now = timezone.now()
    evaluate_rules(now=now)
    Notification.objects.filter(status=NotificationStatus.QUEUED).update(status=NotificationStatus.SENT)
    send_due_digests(now=now + WINDOW)
    digest = Notification.objects.get(kind=NotificationKind.DIGEST)

    deliver_notification(notification_id=digest.pk)

    digest.refresh_from_db()
    hook.refresh_from_db()
    assert digest.status == NotificationStatus.FAILED
    assert not hook.enabled and hook.disabled_reason.startswith("Permanent error: HTTP 410")


@override_settings(DLQ_NOTIFY_BURST=1, DLQ_NOTIFY_WINDOW=1)
def test_the_notification_sweep_beat_runs_sends_due_digests(hook: Channel, new_pattern_rule: AlertRule) -> None:
    storm(3)
    evaluate_rules(now=timezone.now() - dt.timedelta(seconds=5))

    retry_notifications()

    digest = Notification.objects.get(kind=NotificationKind.DIGEST)
    assert (digest.status, digest.context["count"]) == (NotificationStatus.QUEUED, 2)


# Two sweeps at once ---------------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks need PostgreSQL")
@override_settings(DLQ_NOTIFY_BURST=1, DLQ_NOTIFY_WINDOW=300)
def test_a_sweep_skips_a_channel_another_sweep_holds(hook: Channel, new_pattern_rule: AlertRule) -> None:
    storm(4)
    now = timezone.now()
    evaluate_rules(now=now)
    outcome: list[int] = []

    with transaction.atomic():
        # Another sweep (or the evaluation tick) has the channel.
        Channel.objects.select_for_update().get(pk=hook.pk)
        thread = threading.Thread(target=sweep_in_thread, args=(now + WINDOW, outcome))
        thread.start()
        thread.join(timeout=30)

    assert outcome == [0]
    assert send_due_digests(now=now + WINDOW) == 1
    assert send_due_digests(now=now + WINDOW) == 0
    assert Notification.objects.filter(kind=NotificationKind.DIGEST).count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks need PostgreSQL")
@override_settings(DLQ_NOTIFY_BURST=1, DLQ_NOTIFY_WINDOW=300)
def test_two_concurrent_sweeps_create_one_digest(hook: Channel, new_pattern_rule: AlertRule) -> None:
    storm(12)
    now = timezone.now()
    evaluate_rules(now=now)
    held = set(Notification.objects.filter(status=NotificationStatus.HELD).values_list("pk", flat=True))
    assert len(held) == 11
    outcome: list[int] = []
    start = threading.Barrier(2)

    def sweep() -> None:
        start.wait()
        sweep_in_thread(now + WINDOW, outcome)

    threads = [threading.Thread(target=sweep) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert sorted(outcome) == [0, 1]
    (digest,) = Notification.objects.filter(kind=NotificationKind.DIGEST)
    assert digest.context["count"] == 11
    assert {notice["alert_id"] for notice in digest.context["notices"]} == set(
        Notification.objects.filter(pk__in=held).values_list("alert_id", flat=True)
    )
    assert set(Notification.objects.filter(digest=digest).values_list("pk", flat=True)) == held
    assert not Notification.objects.filter(status=NotificationStatus.HELD).exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks need PostgreSQL")
def test_a_tick_and_a_rule_edit_do_not_deadlock(http: responses.RequestsMock, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tick locks channels rule by rule (rule A's channel 2, a second later rule B's channel 1) while an admin
    links both channels to a third rule, whose foreign-key checks take KEY SHARE on them at commit. A FOR UPDATE
    in the tick deadlocked with that; FOR NO KEY UPDATE does not conflict with it."""
    first = Channel.objects.create(name="c1", kind="webhook", target=HOOK)
    second = Channel.objects.create(name="c2", kind="webhook", target=OTHER_HOOK)
    rule_a = rule("dlq_not_empty", channels=[second])
    rule_b = rule("dlq_not_empty", channels=[first])
    # Rules are evaluated in name order: A, then B.
    AlertRule.objects.filter(pk=rule_a.pk).update(name="test A")
    AlertRule.objects.filter(pk=rule_b.pk).update(name="test B")
    edited = rule("oldest_age", channels=[])
    parked(1)
    real = conditions.evaluate
    b_started = threading.Event()

    def slow(evaluated: AlertRule, facts: Any) -> Any:
        if evaluated.pk == rule_b.pk:
            b_started.set()
            time.sleep(1.0)
        return real(evaluated, facts)

    monkeypatch.setattr(conditions, "evaluate", slow)
    errors: list[str] = []

    def tick() -> None:
        try:
            evaluate_rules()
        except Exception as error:  # noqa: BLE001  (reported below)
            errors.append(f"tick: {error!r}")
        finally:
            connection.close()

    def edit() -> None:
        b_started.wait(timeout=30)
        try:
            save_rule(rule=edited, channels=[first, second], actor=None)
        except Exception as error:  # noqa: BLE001  (reported below)
            errors.append(f"edit: {error!r}")
        finally:
            connection.close()

    threads = [threading.Thread(target=tick), threading.Thread(target=edit)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert errors == []
    assert set(edited.channels.all()) == {first, second}
    assert Notification.objects.filter(alert__rule__in=[rule_a, rule_b]).count() == 2


def test_saving_the_channel_form_keeps_the_budget_the_tick_wrote(hook: Channel, admin_user: User) -> None:
    """The edit form was read before the tick spent the budget; saving it must not write the old budget back."""
    stale = Channel.objects.get(pk=hook.pk)
    ends = timezone.now() + WINDOW
    Channel.objects.filter(pk=hook.pk).update(
        notice_window_ends_at=ends, notice_window_sent=5, notice_window_rules=[7], sent_count=12
    )
    save_channel(channel=stale, actor=admin_user)  # what the form view does with the instance it loaded
    client = client_for(admin_user)
    response = client.post(
        reverse("alerts:channel-edit", args=[hook.pk]), {"name": "renamed", "kind": "webhook", "target": HOOK}
    )

    assert response.status_code in (200, 302)
    hook.refresh_from_db()
    assert hook.name == "renamed"
    assert (hook.notice_window_ends_at, hook.notice_window_sent, hook.notice_window_rules, hook.sent_count) == (
        ends,
        5,
        [7],
        12,
    )


def sweep_in_thread(now: dt.datetime, outcome: list[int]) -> None:
    try:
        outcome.append(send_due_digests(now=now))
    finally:
        connection.close()


# Rendering ------------------------------------------------------------------------------------------------------


def notice(
    event: str, index: int, *, summary: str = "New failure pattern", severity: str = "warning"
) -> dict[str, Any]:
    return {
        "event": event,
        "alert_id": index,
        "rule": "New patterns",
        "severity": severity,
        "label": f"orders.dlq · Pattern {index}",
        "summary": summary,
        "url": f"http://localhost:8000/alerts/{index}/",
    }


def digest_of(channel: Channel, notices: list[dict[str, Any]]) -> Notification:
    return Notification.objects.create(
        channel=channel,
        kind=NotificationKind.DIGEST,
        context=digest_context(notices),
        next_attempt_at=timezone.now(),
    )


@pytest.mark.sqlite
def test_email_digest_has_a_counting_subject_and_a_line_per_notice(mailoutbox: Any) -> None:
    email = Channel.objects.create(name="mail", kind="email", target="oncall@example.com")
    notices = [notice("firing", index, summary=f"Pattern <{index}>\nsecond line") for index in range(9)]
    notices += [notice("resolved", index) for index in range(9, 12)]
    digest = digest_of(email, notices)

    deliver_notification(notification_id=digest.pk)

    (message,) = mailoutbox
    assert message.subject == "[dlqconsole] 12 alert notices: 9 firing, 3 resolved"
    lines = message.body.splitlines()
    firing = [line for line in lines if line.startswith("FIRING [warning] New patterns")]
    assert len(firing) == 9
    # Plain text: nothing HTML-escaped, every notice on one line with its link.
    assert "FIRING [warning] New patterns (orders.dlq · Pattern 3): Pattern <3> second line" in firing[3]
    assert firing[3].endswith("http://localhost:8000/alerts/3/")
    assert len([line for line in lines if line.startswith("RESOLVED ")]) == 3
    assert "All alerts: http://localhost:8000/alerts/" in message.body
    assert Notification.objects.get(pk=digest.pk).status == NotificationStatus.SENT


@pytest.mark.sqlite
def test_slack_digest_is_escaped_with_a_line_per_notice_and_a_cap(http: responses.RequestsMock) -> None:
    slack = Channel.objects.create(name="slack", kind="slack", target=HOOK)
    notices = [notice("firing", index, summary="<!channel> & <b>boom</b>") for index in range(55)]
    notices.append(notice("reminder", 55, severity="critical"))
    digest = digest_of(slack, notices)

    deliver_notification(notification_id=digest.pk)

    (body,) = posted(http)
    text = body["text"]
    lines = text.splitlines()
    assert lines[0] == ":bell: *56 alert notices*: 55 firing, 1 reminder"
    bullets = [line for line in lines if line.startswith("• ")]
    assert len(bullets) == 50
    assert "&lt;!channel&gt; &amp; &lt;b&gt;boom&lt;/b&gt;" in bullets[0]
    assert "<!channel>" not in text and "<b>" not in text
    assert "<http://localhost:8000/alerts/0/|New patterns>" in bullets[0]
    assert "… and 6 more" in text
    assert lines[-1] == "<http://localhost:8000/alerts/|All alerts>"
    assert set(body) == {"text"}


@pytest.mark.sqlite
def test_digest_context_counts_every_notice_and_lists_the_first_fifty() -> None:
    notices = [notice("firing", index) for index in range(40)]
    notices += [notice("reminder", index, severity="critical") for index in range(40, 52)]
    notices += [notice("resolved", index) for index in range(52, 60)]

    context = digest_context(notices)

    assert context["count"] == 60 and context["more"] == 10
    assert context["counts"] == {"firing": 40, "reminder": 12, "resolved": 8}
    assert [item["alert_id"] for item in context["notices"]] == list(range(50))
    assert context["severity"] == "critical"


# Pages and metrics ----------------------------------------------------------------------------------------------


@override_settings(DLQ_NOTIFY_BURST=1, DLQ_NOTIFY_WINDOW=300)
def test_pages_show_held_notices_and_the_digest_they_went_in(
    hook: Channel, new_pattern_rule: AlertRule, admin_user: User, viewer: User
) -> None:
    storm(3)
    now = timezone.now()
    evaluate_rules(now=now)
    client = client_for(admin_user)
    held_alert = Notification.objects.filter(status=NotificationStatus.HELD).order_by("pk").first()
    assert held_alert is not None and held_alert.alert is not None

    channels = client.get(reverse("alerts:channels")).content.decode()
    channel_page = client.get(reverse("alerts:channel", args=[hook.pk])).content.decode()
    alert_page = client.get(reverse("alerts:detail", args=[held_alert.alert.pk])).content.decode()

    assert "2 held</span> for a digest" in channels
    assert "2 notices</span> over the channel" in channel_page
    assert "Held for digest" in alert_page and "goes in one digest at" in alert_page

    send_due_digests(now=now + WINDOW)
    digest = Notification.objects.get(kind=NotificationKind.DIGEST)
    channels = client.get(reverse("alerts:channels")).content.decode()
    fragment = client.get(reverse("alerts:channel", args=[hook.pk]), headers={"HX-Request": "true"}).content.decode()
    alert_page = spaced(client.get(reverse("alerts:detail", args=[held_alert.alert.pk])).content.decode())

    assert "held</span> for a digest" not in channels
    assert f"#{digest.pk}: 2 notices" in fragment
    # Each notice that went in it links to the digest's own page.
    assert fragment.count(f'href="{reverse("alerts:notification", args=[digest.pk])}"') == 2
    digest_link = f'<a href="{reverse("alerts:notification", args=[digest.pk])}">#{digest.pk}</a>'
    assert f'<span class="chip st-queued">Queued</span> in digest {digest_link}' in alert_page
    Notification.objects.filter(pk=digest.pk).update(status=NotificationStatus.SENT)
    alert_page = spaced(client.get(reverse("alerts:detail", args=[held_alert.alert.pk])).content.decode())
    assert f'<span class="chip st-sent">Sent</span> in digest {digest_link}' in alert_page
    # A viewer reads the same, without a link to a page only admins may open.
    viewer_page = spaced(client_for(viewer).get(reverse("alerts:detail", args=[held_alert.alert.pk])).content.decode())
    assert f'<span class="chip st-sent">Sent</span> in digest #{digest.pk}' in viewer_page


@override_settings(DLQ_NOTIFY_BURST=1, DLQ_NOTIFY_WINDOW=300)
def test_metrics_count_held_notices_per_channel_kind(hook: Channel, new_pattern_rule: AlertRule, client: Any) -> None:
    Channel.objects.create(name="mail", kind="email", target="oncall@example.com")
    storm(4)
    evaluate_rules()

    text = client.get("/metrics").content.decode()

    assert 'dlq_notifications_held{kind="webhook"} 3.0' in text
    assert 'dlq_notifications_held{kind="email"} 0.0' in text


@pytest.mark.sqlite
def test_the_window_setting_reads_durations(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DLQ_NOTIFY_WINDOW", "1h30m")
    assert env_duration("DLQ_NOTIFY_WINDOW", "5m", minimum=1) == 5400
    monkeypatch.setenv("DLQ_NOTIFY_WINDOW", "")
    assert env_duration("DLQ_NOTIFY_WINDOW", "5m", minimum=1) == 300
    monkeypatch.setenv("DLQ_NOTIFY_WINDOW", "soon")
    with pytest.raises(ImproperlyConfigured, match="DLQ_NOTIFY_WINDOW"):
        env_duration("DLQ_NOTIFY_WINDOW", "5m", minimum=1)
    monkeypatch.setenv("DLQ_NOTIFY_WINDOW", "0s")
    with pytest.raises(ImproperlyConfigured, match="at least 1"):
        env_duration("DLQ_NOTIFY_WINDOW", "5m", minimum=1)


def spaced(html: str) -> str:
    """The page with each run of white space as one space, as a browser shows it (templates break long lines)."""
    return re.sub(r"\s+", " ", html)
