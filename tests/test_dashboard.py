"""The dashboard with several brokers: queues grouped under their broker with each broker's totals, a line per broker
(its URL without the password, whether its queues were sampled lately), the same queue name on two brokers never
merged or counted twice, and ?broker=NAME for one broker. With the broker default alone the page is as before."""

from __future__ import annotations

import datetime as dt

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from dlqconsole import dashboard
from dlqconsole.brokers.models import Broker
from dlqconsole.deadletters import selectors
from dlqconsole.deadletters.models import DeadLetter
from dlqconsole.ingest.models import QueueSample, WatchedQueue
from tests.factories import ParsedDeadLetterFactory, parked, store

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]

HX = {"HX-Request": "true"}


@pytest.fixture
def viewer_client(viewer: User) -> Client:
    client = Client()
    client.force_login(viewer)
    return client


@pytest.fixture
def staging(db: None) -> Broker:
    # The URL shown is the one without the password, as the broker registry stores it.
    return Broker.objects.create(name="staging", url="amqp://ops@rabbit.staging.example:5672/staging")


def parked_on(broker: Broker, count: int, *, queue: str = "orders.dlq") -> list[DeadLetter]:
    return store(*ParsedDeadLetterFactory.build_batch(count, source_queue=queue, broker_id=broker.pk))


def watch(name: str, *, broker: Broker | None = None, depth: int, at: dt.datetime | None = None) -> None:
    owner = {"broker": broker} if broker is not None else {}
    WatchedQueue.objects.create(name=name, dead_letter_queue=f"{name}.dlq", dead_letter_exchange=f"{name}.dlx", **owner)
    QueueSample.objects.create(queue=name, messages=depth, consumers=1, sampled_at=at or timezone.now(), **owner)


def test_queue_summaries_keep_the_same_queue_of_two_brokers_apart(staging: Broker) -> None:
    parked(2, queue="orders.dlq")
    parked_on(staging, 3)

    found = {(summary.broker, summary.queue): summary.parked for summary in selectors.queue_summaries()}
    only_staging = selectors.queue_summaries(broker_ids=[staging.pk])

    assert found == {("default", "orders.dlq"): 2, ("staging", "orders.dlq"): 3}
    assert [(summary.broker, summary.parked) for summary in only_staging] == [("staging", 3)]


def test_the_dashboard_groups_queues_under_their_broker(staging: Broker, viewer_client: Client) -> None:
    parked(2, queue="orders.dlq")
    parked_on(staging, 3)
    parked_on(staging, 4, queue="emails.dlq")
    watch("orders", depth=11)
    watch("orders", broker=staging, depth=333)

    response = viewer_client.get("/")

    html = response.content.decode()
    context = response.context
    assert context["parked"] == 9 and context["hour_total"] == 9
    groups = {group.broker: (group.parked, [row.queue for row in group.rows]) for group in context["queue_groups"]}
    assert groups == {"default": (2, ["orders.dlq"]), "staging": (7, ["emails.dlq", "orders.dlq"])}
    assert '<strong class="clip" title="broker staging">staging</strong>' in html
    # Each queue links to its own broker's dead letters.
    assert "?queue=orders.dlq&amp;status=parked&amp;broker=staging" in html
    assert "?queue=orders.dlq&amp;status=parked&amp;broker=default" in html
    pressure = {group.broker: [row.depth for row in group.rows] for group in context["backpressure_groups"]}
    assert pressure == {"default": [11], "staging": [333]}
    # The broker card: the URL without a password, the queues sampled just now.
    assert 'aria-label="Brokers"' in html and "amqp://ops@rabbit.staging.example:5672/staging" in html
    statuses = {status.broker.name: (status.parked, status.state) for status in context["broker_statuses"]}
    assert statuses == {"default": (2, "sampled"), "staging": (7, "sampled")}


def test_a_broker_whose_queues_were_not_sampled_lately_is_said_to_be_unreached(staging: Broker) -> None:
    now = timezone.now()
    watch("orders", depth=1, at=now)
    watch("orders", broker=staging, depth=1, at=now - dt.timedelta(minutes=10))
    Broker.objects.create(name="quiet", url="amqp://quiet/")
    off = Broker.objects.create(name="retired", url="amqp://retired/", enabled=False)

    statuses = dashboard.broker_statuses(
        [*Broker.objects.exclude(pk=off.pk), off], queues=[], pressure=dashboard.backpressure(), now=now
    )

    assert {status.broker.name: status.state for status in statuses} == {
        "default": "sampled",
        "staging": "stale",
        "quiet": "idle",
        "retired": "disabled",
    }


def test_one_broker_of_the_dashboard(staging: Broker, viewer_client: Client) -> None:
    parked(2, queue="orders.dlq")
    parked_on(staging, 3)

    page = viewer_client.get("/", {"broker": "staging"})
    fragment = viewer_client.get("/", {"broker": "staging"}, headers=HX)

    assert page.context["parked"] == 3 and page.context["hour_total"] == 3
    assert "broker staging" in page.content.decode()
    body = fragment.content.decode()
    assert body.strip().startswith('<div id="panels">')
    # The fragment refreshes itself with the same broker.
    assert 'hx-get="/?broker=staging"' in body
    assert [status.broker.name for status in fragment.context["broker_statuses"]] == ["staging"]


def test_an_unknown_broker_shows_every_broker(staging: Broker, viewer_client: Client) -> None:
    parked(2, queue="orders.dlq")
    parked_on(staging, 3)

    response = viewer_client.get("/", {"broker": "<script>"})

    html = response.content.decode()
    assert response.status_code == 200 and response.context["parked"] == 5
    # Said, escaped, and not carried into the refresh address.
    assert "No broker named &#x27;&lt;script&gt;&#x27; (known: default, staging): every broker is shown." in html
    assert "<script>" not in html.split("</head>", 1)[1].replace('<script src="', "")
    assert "<script>" not in response.context["refresh_url"]


def test_with_the_broker_default_alone_the_dashboard_is_as_before(viewer_client: Client) -> None:
    parked(2, queue="orders.dlq")
    watch("orders", depth=5)

    html = viewer_client.get("/").content.decode()

    assert 'aria-label="Brokers"' not in html and "group-head" not in html
    assert '?queue=orders.dlq&amp;status=parked"' in html
    assert "broker=" not in html
