"""Delivering notifications to real local receivers: outcomes recorded, failures retried with backoff, permanent
failures disable the channel, and evaluation never waits for a channel."""

from __future__ import annotations

import datetime as dt
import json
import socket

import pytest
import responses
from django.conf import settings
from django.test import override_settings
from django.utils import timezone

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.alerts.delivery import (
    deliver_notification,
    enqueue_due_notifications,
    prune_notifications,
    send_test_notification,
)
from dlqconsole.alerts.evaluation import evaluate_rules
from dlqconsole.alerts.models import (
    Alert,
    Channel,
    Notification,
    NotificationKind,
    NotificationStatus,
)
from tests.alerts.conftest import Receiver
from tests.factories import parked, rule

pytestmark = [pytest.mark.django_db]


def closed_port_url() -> str:
    """A URL on a local port nobody listens on (bound, then closed)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/hook"


def firing_notification(channel: Channel) -> Notification:
    rule("dlq_not_empty", channels=[channel])
    parked(3, queue="orders.dlq", message="Request <b>timed</b> out & failed", error_type="TimeoutError")
    evaluate_rules()
    return Notification.objects.get(channel=channel, kind=NotificationKind.FIRING)


def test_webhook_receives_the_alert_as_json(webhook: Channel, receiver: Receiver) -> None:
    notification = firing_notification(webhook)

    deliver_notification(notification_id=notification.pk)

    notification.refresh_from_db()
    assert (notification.status, notification.attempts, notification.error) == (NotificationStatus.SENT, 1, "")
    assert notification.sent_at is not None
    (request,) = receiver.received
    alert = Alert.objects.get()
    assert request.body["event"] == "firing"
    assert request.body["alert_id"] == alert.pk
    assert request.body["subject"] == "queue:orders.dlq"
    assert request.body["severity"] == "warning"
    assert request.body["value"] == 3
    assert request.body["url"].endswith(f"/alerts/{alert.pk}/")
    assert "3 dead letters waiting" in request.body["text"]
    webhook.refresh_from_db()
    assert (webhook.sent_count, webhook.failure_streak) == (1, 0)


@pytest.mark.sqlite
def test_slack_message_is_escaped_text(receiver: Receiver) -> None:
    slack = Channel.objects.create(name="slack", kind="slack", target=receiver.url)
    rule("new_pattern", channels=[slack])
    parked(1, queue="orders.dlq", message="Request <b>timed</b> out & failed @channel", error_type="TimeoutError")
    evaluate_rules()
    notification = Notification.objects.get(channel=slack)

    deliver_notification(notification_id=notification.pk)

    (request,) = receiver.received
    assert set(request.body) == {"text"}
    text = request.body["text"]
    assert "&lt;b&gt;timed&lt;/b&gt; out &amp; failed" in text
    assert "<b>" not in text
    # No mention on Slack-compatible servers that read a plain @channel (Mattermost, Rocket.Chat).
    assert "@\u200bchannel" in text and "@channel" not in text
    assert f"/alerts/{Alert.objects.get().pk}/|" in text


@pytest.mark.sqlite
def test_email_goes_to_every_address(mailoutbox) -> None:  # type: ignore[no-untyped-def]
    email = Channel.objects.create(name="mail", kind="email", target="oncall@example.com, lead@example.com")
    notification = firing_notification(email)

    deliver_notification(notification_id=notification.pk)

    (message,) = mailoutbox
    assert message.to == ["oncall@example.com", "lead@example.com"]
    assert message.subject.startswith("[dlqconsole] WARNING: test dlq_not_empty")
    assert "3 dead letters waiting" in message.body
    assert Notification.objects.get(pk=notification.pk).status == NotificationStatus.SENT


@override_settings(EMAIL_BACKEND="django.core.mail.backends.smtp.EmailBackend", EMAIL_HOST="127.0.0.1")
def test_email_to_an_unreachable_server_is_retried() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    email = Channel.objects.create(name="mail", kind="email", target="oncall@example.com")
    notification = firing_notification(email)

    with override_settings(EMAIL_PORT=port):
        deliver_notification(notification_id=notification.pk)

    notification.refresh_from_db()
    assert notification.status == NotificationStatus.RETRYING
    assert "ConnectionRefusedError" in notification.error


def test_receiver_down_is_recorded_and_retried_with_backoff(db: None) -> None:
    down = Channel.objects.create(name="down", kind="webhook", target=closed_port_url())
    notification = firing_notification(down)
    start = timezone.now()

    deliver_notification(notification_id=notification.pk, now=start)

    notification.refresh_from_db()
    assert notification.status == NotificationStatus.RETRYING
    assert notification.attempts == 1
    assert notification.error.startswith("Connection failed")
    assert notification.next_attempt_at == start + dt.timedelta(seconds=10)

    # The sweep hands the due retry to a worker again; the second failure waits three times as long.
    later = start + dt.timedelta(seconds=11)
    assert enqueue_due_notifications(now=later) == 1
    deliver_notification(notification_id=notification.pk, now=later)
    notification.refresh_from_db()
    assert (notification.status, notification.attempts) == (NotificationStatus.RETRYING, 2)
    assert notification.next_attempt_at == later + dt.timedelta(seconds=30)


def test_http_500_is_recorded_and_retried(webhook: Channel, receiver: Receiver) -> None:
    receiver.status = 500
    notification = firing_notification(webhook)

    deliver_notification(notification_id=notification.pk)

    notification.refresh_from_db()
    assert notification.status == NotificationStatus.RETRYING
    assert notification.error.startswith("HTTP 500")
    assert len(receiver.received) == 1

    receiver.status = 200
    enqueue_due_notifications(now=notification.next_attempt_at)
    deliver_notification(notification_id=notification.pk)
    notification.refresh_from_db()
    assert (notification.status, notification.attempts) == (NotificationStatus.SENT, 2)


@override_settings(DLQ_HTTP_TIMEOUT_SECONDS=0.3)
def test_slow_receiver_times_out_and_is_retried(webhook: Channel, receiver: Receiver) -> None:
    receiver.delay = 2.0
    notification = firing_notification(webhook)

    deliver_notification(notification_id=notification.pk)

    notification.refresh_from_db()
    assert notification.status == NotificationStatus.RETRYING
    assert notification.error == "Timed out after 0.3 s"


def test_gone_receiver_disables_the_channel(webhook: Channel, receiver: Receiver) -> None:
    receiver.status = 410
    notification = firing_notification(webhook)

    deliver_notification(notification_id=notification.pk)

    notification.refresh_from_db()
    webhook.refresh_from_db()
    assert notification.status == NotificationStatus.FAILED
    assert not webhook.enabled
    assert webhook.disabled_reason.startswith("Permanent error: HTTP 410")
    assert AuditEntry.objects.filter(action="alerts.channel.disable", target=f"channel:{webhook.pk}").exists()


@override_settings(DLQ_NOTIFICATION_MAX_ATTEMPTS=2, DLQ_CHANNEL_DISABLE_AFTER=2)
def test_channel_is_disabled_after_notifications_fail_for_good_in_a_row(webhook: Channel, receiver: Receiver) -> None:
    receiver.status = 503
    rule("dlq_not_empty", channels=[webhook])
    start = timezone.now()
    for round_number, queue in enumerate(["a.dlq", "b.dlq"]):
        parked(1, queue=queue)
        evaluate_rules(now=start + dt.timedelta(minutes=round_number))
        notification = Notification.objects.get(alert__subject=f"queue:{queue}")
        deliver_notification(notification_id=notification.pk)
        notification.refresh_from_db()
        assert notification.next_attempt_at is not None
        assert enqueue_due_notifications(now=notification.next_attempt_at) == 1
        deliver_notification(notification_id=notification.pk, now=notification.next_attempt_at)
        notification.refresh_from_db()
        assert (notification.status, notification.attempts) == (NotificationStatus.FAILED, 2)

    webhook.refresh_from_db()
    assert not webhook.enabled
    assert webhook.failed_count == 2
    assert webhook.disabled_reason.startswith("2 notifications in a row failed")


def test_queued_notifications_of_a_disabled_channel_are_not_sent(webhook: Channel, receiver: Receiver) -> None:
    notification = firing_notification(webhook)
    Channel.objects.filter(pk=webhook.pk).update(enabled=False, disabled_reason="switched off")

    deliver_notification(notification_id=notification.pk)

    notification.refresh_from_db()
    assert notification.status == NotificationStatus.FAILED
    assert receiver.received == []


def test_a_notification_is_sent_once_even_if_its_task_runs_twice(webhook: Channel, receiver: Receiver) -> None:
    notification = firing_notification(webhook)

    first = deliver_notification(notification_id=notification.pk)
    second = deliver_notification(notification_id=notification.pk)

    assert first is not None and second is None
    assert len(receiver.received) == 1


def test_sweep_requeues_lost_tasks_and_stuck_sends_but_not_future_retries(webhook: Channel) -> None:
    now = timezone.now()
    lost = Notification.objects.create(
        channel=webhook, kind="firing", status="queued", next_attempt_at=now - dt.timedelta(seconds=1)
    )
    stuck = Notification.objects.create(
        channel=webhook, kind="firing", status="sending", claimed_at=now - dt.timedelta(minutes=5)
    )
    waiting = Notification.objects.create(
        channel=webhook, kind="firing", status="retrying", next_attempt_at=now + dt.timedelta(minutes=1)
    )

    assert enqueue_due_notifications(now=now) == 2

    statuses = dict(Notification.objects.values_list("pk", "status"))
    assert statuses == {lost.pk: "queued", stuck.pk: "queued", waiting.pk: "retrying"}


@override_settings(DLQ_NOTIFICATION_RETENTION_DAYS=30)
def test_retention_deletes_only_old_finished_notifications(webhook: Channel) -> None:
    now = timezone.now()
    old = now - dt.timedelta(days=31)
    gone = [
        Notification.objects.create(channel=webhook, kind="firing", status=status, created_at=old)
        for status in ("sent", "failed", "digested", "silenced")
    ]
    kept_waiting = [
        Notification.objects.create(channel=webhook, kind="firing", status=status, created_at=old)
        for status in ("queued", "sending", "retrying", "held")
    ]
    kept_recent = Notification.objects.create(
        channel=webhook, kind="firing", status="sent", created_at=now - dt.timedelta(days=29)
    )

    assert prune_notifications(now=now, batch_size=3) == len(gone)

    assert set(Notification.objects.values_list("pk", flat=True)) == {
        *(row.pk for row in kept_waiting),
        kept_recent.pk,
    }
    audit = AuditEntry.objects.get(action="alerts.notification.retention")
    assert audit.count == len(gone) and audit.actor is None
    assert prune_notifications(now=now) == 0
    assert AuditEntry.objects.filter(action="alerts.notification.retention").count() == 1


def test_evaluation_never_waits_for_a_channel(webhook: Channel, receiver: Receiver) -> None:
    """Evaluation only writes rows; the hanging receiver is not even contacted until a worker sends."""
    receiver.delay = 30.0
    rule("dlq_not_empty", channels=[webhook])
    parked(1)

    evaluate_rules()
    parked(1, queue="emails.dlq")
    evaluate_rules()

    assert receiver.received == []
    assert Notification.objects.filter(status=NotificationStatus.QUEUED).count() == 2
    assert Alert.objects.filter(status="firing").count() == 2


def test_notifications_are_enqueued_on_commit_to_the_broker(
    webhook: Channel, django_capture_on_commit_callbacks, amqp_channel
) -> None:  # type: ignore[no-untyped-def]
    rule("dlq_not_empty", channels=[webhook])
    parked(1)
    # Sends that earlier tests enqueued (no worker consumes the control queue during these tests).
    amqp_channel.queue_declare(queue=settings.DLQ_CONTROL_QUEUE, durable=True)
    amqp_channel.queue_purge(queue=settings.DLQ_CONTROL_QUEUE)

    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        evaluate_rules()

    notification = Notification.objects.get()
    assert len(callbacks) == 1 and notification.status == NotificationStatus.QUEUED
    # The send task is really on RabbitMQ, in the control queue (never behind long operations), naming this
    # notification.
    found = []
    while True:
        method, properties, body = amqp_channel.basic_get(settings.DLQ_CONTROL_QUEUE, auto_ack=True)
        if method is None:
            break
        if properties.headers.get("task") == "alerts.send_notification":
            found.append(json.loads(body)[0])
    assert found == [[notification.pk]]


def test_test_send_is_tried_once_and_never_disables(receiver: Receiver) -> None:
    receiver.status = 404
    channel = Channel.objects.create(name="typo", kind="webhook", target=receiver.url, enabled=False)
    notification = send_test_notification(channel=channel, actor=None)

    deliver_notification(notification_id=notification.pk)

    notification.refresh_from_db()
    channel.refresh_from_db()
    assert (notification.status, notification.attempts) == (NotificationStatus.FAILED, 1)
    assert notification.error.startswith("HTTP 404")
    assert receiver.received[0].body["event"] == "test"
    assert channel.failed_count == 0 and channel.disabled_reason == ""


@responses.activate
def test_redirects_are_not_followed(db: None) -> None:
    responses.add(responses.POST, "https://hooks.example.com/x", status=301, headers={"Location": "http://evil/"})
    channel = Channel.objects.create(name="moved", kind="webhook", target="https://hooks.example.com/x")
    notification = firing_notification(channel)

    deliver_notification(notification_id=notification.pk)

    notification.refresh_from_db()
    assert notification.status == NotificationStatus.FAILED
    assert notification.error.startswith("HTTP 301")
    assert len(responses.calls) == 1
    assert json.loads(responses.calls[0].request.body or b"{}")["event"] == "firing"
