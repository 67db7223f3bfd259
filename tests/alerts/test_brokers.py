"""Alerts by broker: the same queue name on two brokers is two subjects with two alerts, a rule can be scoped to
one broker, the subjects of the broker default keep their old form, and the pages and notices name the broker.

The second broker here is a row of the table: nothing in these tests connects to it."""

from __future__ import annotations

import datetime as dt

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.alerts.evaluation import evaluate_rules
from dlqconsole.alerts.forms import RuleForm
from dlqconsole.alerts.models import Alert, AlertRule, AlertStatus, GrowthSample, Notification
from dlqconsole.alerts.subjects import parse_queue_subject, queue_subject
from dlqconsole.brokers.models import Broker, default_broker_id
from dlqconsole.deadletters.models import DeadLetter
from dlqconsole.ingest.models import QueueSample, WatchedQueue
from tests.alerts.conftest import settle
from tests.factories import ChannelFactory, ParsedDeadLetterFactory, parked, rule, store

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]

HTMX = {"HX-Request": "true"}


@pytest.fixture
def staging(db: None) -> Broker:
    return Broker.objects.create(name="staging", url="amqp://guest@127.0.0.1:5672/staging")


def parked_on(broker: Broker, count: int, *, queue: str = "orders.dlq") -> list[DeadLetter]:
    return store(*ParsedDeadLetterFactory.build_batch(count, source_queue=queue, broker_id=broker.pk))


def open_alerts(rule_: AlertRule) -> dict[str, Alert]:
    return {alert.subject: alert for alert in Alert.objects.open().filter(rule=rule_)}


def test_queue_subjects_of_other_brokers_cannot_be_read_as_a_queue_of_default() -> None:
    assert queue_subject("orders.dlq") == "queue:orders.dlq"
    assert queue_subject("orders.dlq", broker="staging") == "queue@staging:orders.dlq"
    # Whatever a queue of the broker default is called, it reads back as a queue of the broker default.
    for name in ("staging/orders.dlq", "queue@staging:orders.dlq", "a:b", "", "on staging"):
        assert parse_queue_subject(queue_subject(name)) == ("default", name)
        assert parse_queue_subject(queue_subject(name, broker="prod-eu.1")) == ("prod-eu.1", name)
    for other in ("pattern:12", "operation:7", "queue@:x", "queue@bad name:x", "queue@default:x", "queues:x", "q"):
        assert parse_queue_subject(other) is None


def test_the_same_queue_on_two_brokers_raises_two_alerts(staging: Broker) -> None:
    waiting = rule("dlq_not_empty")
    on_default = parked(2, queue="orders.dlq")
    parked_on(staging, 3)

    evaluate_rules()

    alerts = open_alerts(waiting)
    assert set(alerts) == {"queue:orders.dlq", "queue@staging:orders.dlq"}
    default, other = alerts["queue:orders.dlq"], alerts["queue@staging:orders.dlq"]
    assert (default.value, other.value) == (2, 3)
    assert default.subject_label == "orders.dlq on default" and other.subject_label == "orders.dlq on staging"
    assert other.summary == "orders.dlq on staging: 3 dead letters waiting."
    assert other.link.endswith("?queue=orders.dlq&broker=staging")
    assert default.status == other.status == AlertStatus.FIRING

    # The default broker's dead letters are dealt with: its alert resolves, staging's fires on.
    settle(on_default)
    evaluate_rules()

    assert set(open_alerts(waiting)) == {"queue@staging:orders.dlq"}
    assert Alert.objects.get(pk=default.pk).status == AlertStatus.RESOLVED


def test_an_open_alert_of_the_broker_default_carries_on_when_a_second_broker_appears() -> None:
    waiting = rule("dlq_not_empty")
    parked(1, queue="orders.dlq")
    evaluate_rules()
    before = Alert.objects.get(rule=waiting)
    assert (before.subject, before.subject_label) == ("queue:orders.dlq", "orders.dlq")

    Broker.objects.create(name="staging", url="amqp://127.0.0.1/staging")
    evaluate_rules()

    after = Alert.objects.open().get(rule=waiting)
    assert after.pk == before.pk and after.status == AlertStatus.FIRING
    # Its page now names its broker; its subject, cooldown and history stay those of before.
    assert after.subject == "queue:orders.dlq" and after.subject_label == "orders.dlq on default"


def test_a_rule_scoped_to_a_broker_looks_at_its_queues_only(staging: Broker) -> None:
    scoped = rule("dlq_not_empty", broker=staging)
    parked(5, queue="orders.dlq")
    parked(1, queue="emails.dlq")
    parked_on(staging, 1, queue="emails.dlq")

    evaluate_rules()

    assert set(open_alerts(scoped)) == {"queue@staging:emails.dlq"}
    assert AlertRule.objects.select_related("broker").get(pk=scoped.pk).scope_display == "every queue on staging"


def test_a_queue_scope_means_the_queue_on_each_broker_or_on_the_rules_broker(staging: Broker) -> None:
    WatchedQueue.objects.create(name="orders", dead_letter_queue="orders.dlq", dead_letter_exchange="orders.dlx")
    WatchedQueue.objects.create(
        broker=staging, name="orders", dead_letter_queue="orders.dlq", dead_letter_exchange="orders.dlx"
    )
    everywhere = rule("dlq_not_empty", queue="orders")
    on_staging = rule("dlq_not_empty", queue="orders", broker=staging)
    parked(1, queue="orders.dlq")
    parked_on(staging, 2)

    evaluate_rules()

    assert set(open_alerts(everywhere)) == {"queue:orders.dlq", "queue@staging:orders.dlq"}
    assert set(open_alerts(on_staging)) == {"queue@staging:orders.dlq"}


def test_growth_is_measured_per_broker(staging: Broker) -> None:
    growing = rule("dlq_growth", threshold=2, window_seconds=60)
    start = timezone.now() - dt.timedelta(minutes=2)
    parked(1, queue="orders.dlq")
    parked_on(staging, 1)
    evaluate_rules(now=start)

    parked(2, queue="orders.dlq")  # 2 more: not above the threshold
    parked_on(staging, 3)  # 3 more: above it
    evaluate_rules()

    assert set(open_alerts(growing)) == {"queue@staging:orders.dlq"}
    assert open_alerts(growing)["queue@staging:orders.dlq"].value == 3
    recorded = set(GrowthSample.objects.values_list("subject", flat=True))
    assert {"queue:orders.dlq", "queue@staging:orders.dlq"} <= recorded


def test_a_pattern_rule_scoped_to_a_broker_counts_that_brokers_dead_letters(staging: Broker) -> None:
    letters = parked(4, queue="orders.dlq")
    parked_on(staging, 1)
    pattern = letters[0].pattern
    assert DeadLetter.objects.filter(pattern=pattern).count() == 5
    on_staging = rule("dlq_not_empty", pattern=pattern, threshold=2, broker=staging)
    everywhere = rule("dlq_not_empty", pattern=pattern, threshold=2)

    evaluate_rules()

    assert open_alerts(on_staging) == {}
    assert open_alerts(everywhere)[f"pattern:{pattern.pk}"].value == 5

    parked_on(staging, 2)
    evaluate_rules()

    alert = open_alerts(on_staging)[f"pattern:{pattern.pk}"]
    assert alert.value == 3 and alert.summary.endswith("” on staging.")


def test_depth_is_judged_against_each_brokers_own_thresholds(staging: Broker) -> None:
    WatchedQueue.objects.create(name="orders", dead_letter_queue="orders.dlq", dead_letter_exchange="orders.dlx")
    WatchedQueue.objects.create(
        broker=staging,
        name="orders",
        dead_letter_queue="orders.dlq",
        dead_letter_exchange="orders.dlx",
        warning_depth=5,
    )
    depth = rule("queue_depth", severity="warning")
    now = timezone.now()
    QueueSample.objects.create(queue="orders", messages=10, consumers=1, sampled_at=now)
    QueueSample.objects.create(broker=staging, queue="orders", messages=10, consumers=0, sampled_at=now)

    evaluate_rules(now=now)

    alerts = open_alerts(depth)
    assert set(alerts) == {"queue@staging:orders"}
    assert alerts["queue@staging:orders"].summary == (
        "orders on staging: 10 messages ready (warning at 5), 0 consumers."
    )

    # Staging's queue drains: its alert resolves, whatever the default broker's queue holds.
    later = now + dt.timedelta(seconds=1)
    QueueSample.objects.create(broker=staging, queue="orders", messages=0, consumers=1, sampled_at=later)
    evaluate_rules(now=later)
    assert open_alerts(depth) == {}


def test_notices_and_the_alerts_page_name_the_broker(staging: Broker, client: Client, viewer: User) -> None:
    channel = ChannelFactory.create(kind="webhook", target="http://127.0.0.1:9/hook")
    waiting = rule("dlq_not_empty", channels=[channel])
    parked_on(staging, 1)
    parked(1, queue="orders.dlq")

    evaluate_rules()

    contexts = {n.context["subject"]: n.context for n in Notification.objects.filter(alert__rule=waiting)}
    assert contexts["queue@staging:orders.dlq"]["broker"] == "staging"
    assert contexts["queue:orders.dlq"]["broker"] == "default"
    assert contexts["queue@staging:orders.dlq"]["label"] == "orders.dlq on staging"
    alert = Alert.objects.get(subject="queue@staging:orders.dlq")
    client.force_login(viewer)
    page = client.get(reverse("alerts:detail", args=[alert.pk])).content.decode()
    assert "<dt>Broker</dt><dd>staging</dd>" in page
    assert "orders.dlq on staging" in page


def test_the_alerts_list_filters_by_broker(staging: Broker, client: Client, viewer: User) -> None:
    rule("dlq_not_empty")
    parked(1, queue="orders.dlq")
    parked_on(staging, 1, queue="emails.dlq")
    evaluate_rules()
    client.force_login(viewer)

    page = client.get(reverse("alerts:list"), {"broker": "staging"})
    fragment = client.get(reverse("alerts:list"), {"broker": "default"}, headers=HTMX)
    unknown = client.get(reverse("alerts:list"), {"broker": "<nope>"})

    html = page.content.decode()
    assert 'name="broker"' in html and '<option value="staging" selected>' in html
    assert "emails.dlq on staging" in html and "orders.dlq on default" not in html
    body = fragment.content.decode()
    assert "orders.dlq on default" in body and "emails.dlq on staging" not in body
    assert unknown.status_code == 200 and "emails.dlq on staging" in unknown.content.decode()


def test_the_alerts_list_shows_no_broker_filter_with_the_broker_default_alone(client: Client, viewer: User) -> None:
    client.force_login(viewer)

    html = client.get(reverse("alerts:list")).content.decode()

    assert 'name="broker"' not in html


def test_the_rule_form_offers_and_checks_a_broker(staging: Broker, client: Client, admin_user: User) -> None:
    client.force_login(admin_user)
    fields = {"name": "test staging orders", "kind": "dlq_not_empty", "severity": "warning", "enabled": "on"}

    form_page = client.get(reverse("alerts:rule-new")).content.decode()
    refused = client.post(reverse("alerts:rule-new"), {**fields, "broker": "999999"})

    assert '<select name="broker"' in form_page and "Every broker" in form_page and ">staging<" in form_page
    assert refused.status_code == 400 and "No such broker" in refused.content.decode()
    assert not AlertRule.objects.filter(name=fields["name"]).exists()

    saved = client.post(reverse("alerts:rule-new"), {**fields, "broker": str(staging.pk), "queue": "nowhere.dlq"})

    assert saved.status_code == 302
    created = AlertRule.objects.get(name=fields["name"])
    assert created.broker == staging
    audit = AuditEntry.objects.get(action="alerts.rule.create", target=f"rule:{created.pk}")
    assert "queue nowhere.dlq on staging" in audit.detail


def test_a_queue_warning_looks_at_the_rules_broker(staging: Broker) -> None:
    WatchedQueue.objects.create(name="orders", dead_letter_queue="orders.dlq", dead_letter_exchange="orders.dlx")
    data = {"name": "test depth", "kind": "queue_depth", "severity": "warning", "queue": "orders"}

    everywhere = RuleForm({**data}, instance=AlertRule())
    on_staging = RuleForm({**data, "broker": str(staging.pk)}, instance=AlertRule())

    assert everywhere.is_valid() and on_staging.is_valid()
    assert everywhere.warnings == []
    assert on_staging.warnings and "on broker “staging”" in on_staging.warnings[0]


def test_with_the_broker_default_alone_the_broker_is_carried_unseen(client: Client, admin_user: User) -> None:
    client.force_login(admin_user)

    html = client.get(reverse("alerts:rule-new")).content.decode()

    assert '<input type="hidden" name="broker"' in html and "Every broker" not in html
    saved = client.post(
        reverse("alerts:rule-new"),
        {"name": "test one broker", "kind": "dlq_not_empty", "severity": "warning", "broker": str(default_broker_id())},
    )
    assert saved.status_code == 302
    assert AlertRule.objects.get(name="test one broker").broker_id == default_broker_id()


def test_changing_a_rules_broker_ends_its_open_alerts_quietly(
    staging: Broker, client: Client, admin_user: User
) -> None:
    waiting = rule("dlq_not_empty")
    parked(1, queue="orders.dlq")
    evaluate_rules()
    assert open_alerts(waiting)
    client.force_login(admin_user)

    response = client.post(
        reverse("alerts:rule", args=[waiting.pk]),
        {"name": waiting.name, "kind": "dlq_not_empty", "severity": "warning", "broker": str(staging.pk)},
    )

    assert response.status_code == 302
    assert open_alerts(waiting) == {}


def test_the_watched_queues_page_groups_queues_by_broker(staging: Broker, client: Client, viewer: User) -> None:
    WatchedQueue.objects.create(name="orders", dead_letter_queue="orders.dlq", dead_letter_exchange="orders.dlx")
    WatchedQueue.objects.create(
        broker=staging, name="orders", dead_letter_queue="orders.dlq", dead_letter_exchange="orders.dlx"
    )
    now = timezone.now()
    QueueSample.objects.create(queue="orders", messages=111, consumers=1, sampled_at=now)
    QueueSample.objects.create(broker=staging, queue="orders", messages=222, consumers=1, sampled_at=now)
    client.force_login(viewer)

    page = client.get(reverse("alerts:queues")).content.decode()
    one = client.get(reverse("alerts:queues"), {"broker": "staging"}, headers=HTMX).content.decode()

    assert page.index(">\n              default</a>") < page.index(">111<") < page.index(">\n              staging</a>")
    assert page.index(">\n              staging</a>") < page.index(">222<")
    assert "222" in one and "111" not in one and "<html" not in one


def test_the_watched_queues_page_says_when_no_broker_has_the_name_it_was_given(
    staging: Broker, client: Client, viewer: User
) -> None:
    WatchedQueue.objects.create(name="orders", dead_letter_queue="orders.dlq", dead_letter_exchange="orders.dlx")
    WatchedQueue.objects.create(
        broker=staging, name="payments", dead_letter_queue="payments.dlq", dead_letter_exchange="payments.dlx"
    )
    client.force_login(viewer)

    html = client.get(reverse("alerts:queues"), {"broker": "stagin"}).content.decode()

    assert "No broker named &#x27;stagin&#x27; (known: default, staging): every broker is shown." in html
    assert "orders" in html and "payments" in html
    assert "of broker stagin" not in html
