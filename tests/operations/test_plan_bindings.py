"""The plan asks RabbitMQ's management API whether each retry's exchange still routes the message's key to a
queue: an exchange that exists but whose binding is gone would take the messages only to return them."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from urllib.parse import quote

import pika
import pytest
import requests
from django.test import Client

from dlqconsole.operations import routing
from dlqconsole.operations.models import OperationKind
from dlqconsole.operations.planning import plan_operation
from dlqconsole.operations.routing import Api, api_from_settings, api_from_urls, topic_matches
from tests.support import declare_with_dlq, ingest_from, kill_on_broker, wait_for_depth

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _management_api(settings) -> None:
    """The test broker's management API (scripts/services enables the plugin); a clear failure when it is off."""
    settings.RABBITMQ_API_URL = ""
    api = api_from_settings()
    assert api is not None
    try:
        routing.RoutingChecker(api=api).exchange("amq.direct")
    except routing.RoutingUnknown as error:
        pytest.fail(f"RabbitMQ's management API is needed here (rabbitmq-plugins enable rabbitmq_management): {error}")


@pytest.fixture
def exchanges(channel) -> Iterator[Callable[..., None]]:
    made: list[str] = []

    def declare(name: str, kind: str = "direct", **options) -> None:
        channel.exchange_declare(exchange=name, exchange_type=kind, **options)
        made.append(name)

    yield declare
    for name in made:
        channel.exchange_delete(exchange=name)


def died_through(channel, queue: str, exchange: str, key: str) -> None:
    """One message published to `exchange` with `key`, routed to `queue`, rejected there, ingested from its DLQ:
    its newest x-death names that exchange and key, where a retry sends it."""
    declare_with_dlq(channel, queue)
    channel.queue_bind(queue=queue, exchange=exchange, routing_key=key)
    channel.basic_publish(exchange=exchange, routing_key=key, body=b"dies")
    wait_for_depth(channel, queue, 1)
    kill_on_broker(channel, queue, 1)
    wait_for_depth(channel, queue + ".dlq", 1)
    (letter,) = ingest_from(channel, queue + ".dlq")
    assert (letter.original_exchange, letter.original_routing_keys) == (exchange, [key])


def plan(operator, queue: str):
    return plan_operation(kind=OperationKind.RETRY, filter={"queue": [queue + ".dlq"]}, actor=operator)


def test_an_exchange_whose_binding_was_removed_is_flagged_and_a_rebound_one_is_not(
    channel, queue_name, exchanges, operator
):
    orders, exchange = queue_name("orders"), queue_name("ex")
    exchanges(exchange)
    died_through(channel, orders, exchange, "order.created")
    channel.queue_unbind(queue=orders, exchange=exchange, routing_key="order.created")
    channel.queue_bind(queue=orders, exchange=exchange, routing_key="order.updated")  # another key still bound

    operation = plan(operator, orders)

    reason = f"exchange {exchange!r} routes key 'order.created' to no queue (no matching binding)"
    assert operation.unreplayable_reasons == {reason: 1}
    assert operation.bindings_note == "checked on http://localhost:15672"
    client = Client()
    client.force_login(operator)
    page = client.get(f"/operations/{operation.pk}/").content.decode()
    assert "routes key &#x27;order.created&#x27; to no queue" in page
    assert 'data-testid="bindings-note">checked on http://localhost:15672<' in page

    channel.queue_bind(queue=orders, exchange=exchange, routing_key="order.created")
    assert plan(operator, orders).unreplayable == 0


def test_topic_patterns_exchange_to_exchange_bindings_and_alternate_exchanges_count_as_routes(
    channel, queue_name, exchanges, operator
):
    orders, front, back, spare = queue_name("orders"), queue_name("front"), queue_name("back"), queue_name("ae")
    exchanges(spare, "fanout")
    exchanges(front, "direct", arguments={"alternate-exchange": spare})
    exchanges(back, "topic")
    died_through(channel, orders, front, "eu.order.created")
    channel.queue_unbind(queue=orders, exchange=front, routing_key="eu.order.created")
    assert plan(operator, orders).unreplayable == 1  # the alternate exchange routes nowhere yet

    # front → back (exchange to exchange, same key) → orders through a topic pattern.
    channel.exchange_bind(destination=back, source=front, routing_key="eu.order.created")
    channel.queue_bind(queue=orders, exchange=back, routing_key="*.order.#")
    assert plan(operator, orders).unreplayable == 0

    channel.queue_unbind(queue=orders, exchange=back, routing_key="*.order.#")
    channel.queue_bind(queue=orders, exchange=back, routing_key="us.#")
    assert plan(operator, orders).unreplayable == 1  # the pattern no longer matches

    channel.queue_bind(queue=orders, exchange=spare)  # the alternate exchange takes what front cannot route
    assert plan(operator, orders).unreplayable == 0


def test_an_exchange_redeclared_internal_is_flagged(channel, queue_name, exchanges, operator):
    orders, exchange = queue_name("orders"), queue_name("ex")
    exchanges(exchange)
    died_through(channel, orders, exchange, "k")
    channel.exchange_delete(exchange=exchange)
    exchanges(exchange, "direct", internal=True)
    channel.queue_bind(queue=orders, exchange=exchange, routing_key="k")

    operation = plan(operator, orders)

    assert operation.unreplayable_reasons == {
        f"exchange {exchange!r} is internal: only other exchanges can publish to it": 1
    }


@pytest.mark.parametrize(
    ("setting", "note"),
    [
        (
            "http://127.0.0.1:9/",
            "not checked: the management API at http://127.0.0.1:9 did not answer (ConnectionError)",
        ),
        (
            "http://guest:wrong@127.0.0.1:15672/",
            "not checked: the management API at http://127.0.0.1:15672 refused the login (401)",
        ),
        ("off", "not checked (RABBITMQ_API_URL is off)"),
    ],
)
def test_a_plan_without_the_api_says_bindings_were_not_checked_and_still_plans(
    channel, queue_name, exchanges, operator, settings, setting, note
):
    orders, exchange = queue_name("orders"), queue_name("ex")
    exchanges(exchange)
    died_through(channel, orders, exchange, "k")
    channel.queue_unbind(queue=orders, exchange=exchange, routing_key="k")
    settings.RABBITMQ_API_URL = setting

    operation = plan(operator, orders)

    assert operation.total == 1
    assert operation.unreplayable == 0  # unknown, not refused: the run's mandatory publish still catches it
    assert operation.bindings_note == note


def test_a_retry_through_the_default_exchange_needs_no_api(channel, queue_name, operator, settings):
    orders = queue_name("orders")
    declare_with_dlq(channel, orders)
    channel.basic_publish(exchange="", routing_key=orders, body=b"dies")
    kill_on_broker(channel, orders, 1)
    wait_for_depth(channel, orders + ".dlq", 1)
    ingest_from(channel, orders + ".dlq")

    operation = plan(operator, orders)

    assert (operation.unreplayable, operation.bindings_note) == (0, "")


@pytest.mark.parametrize(
    ("pattern", "key", "expected"),
    [
        ("a.b.c", "a.b.c", True),
        ("a.b.c", "a.b", False),
        ("a.*.c", "a.x.c", True),
        ("a.*.c", "a.c", False),
        ("a.*", "a.x.y", False),
        ("a.#", "a", True),
        ("a.#", "a.x.y", True),
        ("#", "", True),
        ("#", "anything.at.all", True),
        ("#.c", "c", True),
        ("#.c", "a.b.c", True),
        ("#.c", "a.b.d", False),
        ("*.#.*", "a", False),
        ("*.#.*", "a.b", True),
        ("a.#.b.#.c", "a.b.x.c", True),
        ("a.#.b.#.c", "a.x.c", False),
        ("*", "", False),  # an empty key has no words
        ("", "", True),
        ("", "a", False),
        ("a.*", "a.", True),  # "a." is the words "a" and ""
        ("#.#", "a", True),
    ],
)
def test_topic_matching_is_rabbitmqs(channel, queue_name, exchanges, pattern, key, expected):
    """Each case is also published, mandatory, through a real topic exchange bound with the pattern: the broker
    routes it exactly when topic_matches says it would."""
    exchange, queue = queue_name("topic"), queue_name("q")
    exchanges(exchange, "topic")
    channel.queue_declare(queue=queue)
    channel.queue_bind(queue=queue, exchange=exchange, routing_key=pattern)
    returned = []
    channel.add_on_return_callback(lambda *args: returned.append(args))
    channel.confirm_delivery()
    try:
        channel.basic_publish(exchange=exchange, routing_key=key, body=b"probe", mandatory=True)
        routed_by_broker = True
    except pika.exceptions.UnroutableError:
        routed_by_broker = False

    assert (routed_by_broker, topic_matches(pattern, key)) == (expected, expected)


@pytest.mark.parametrize(
    ("amqp", "configured", "expected"),
    [
        ("amqp://u:p@rabbit:5672/%2F", "", Api("http://rabbit:15672/", ("u", "p"), "/")),
        ("amqps://u:p%40ss@rabbit/shop", "", Api("https://rabbit:15672/", ("u", "p@ss"), "shop")),
        ("amqp://u:p@[::1]:5672/", "", Api("http://[::1]:15672/", ("u", "p"), "/")),
        (
            "amqp://u:p@rabbit/",
            "https://admin:s3cret@mgmt.example:443/rabbit/",
            Api("https://mgmt.example:443/rabbit/", ("admin", "s3cret"), "/"),
        ),
        ("amqp://u:p@rabbit/", "http://mgmt:15672", Api("http://mgmt:15672/", None, "/")),
    ],
)
def test_the_api_is_derived_from_amqp_url_or_configured(amqp, configured, expected):
    assert api_from_urls(amqp_url=amqp, configured=configured) == expected


def test_an_alternate_exchange_given_by_a_policy_counts_as_a_route(channel, queue_name, exchanges, operator):
    orders, exchange, spare = queue_name("orders"), queue_name("ex"), queue_name("ae")
    exchanges(spare, "fanout")
    exchanges(exchange)
    died_through(channel, orders, exchange, "k")
    channel.queue_unbind(queue=orders, exchange=exchange, routing_key="k")
    channel.queue_bind(queue=orders, exchange=spare)
    api = api_from_settings()
    assert api is not None
    policy = api.base + "api/policies/%2F/" + quote(exchange, safe="")
    body = {"pattern": f"^{re.escape(exchange)}$", "apply-to": "exchanges", "definition": {"alternate-exchange": spare}}
    assert requests.put(policy, json=body, auth=api.auth, timeout=5).status_code in (201, 204)
    try:
        wait_for_policy(api, exchange, exchange)
        assert plan(operator, orders).unreplayable == 0
    finally:
        requests.delete(policy, auth=api.auth, timeout=5)
    wait_for_policy(api, exchange, None)
    assert plan(operator, orders).unreplayable == 1


def wait_for_policy(api: Api, exchange: str, name: str | None) -> None:
    """Policies are applied (and lifted) a moment after the API call returns."""
    deadline = time.monotonic() + 5
    while (routing.RoutingChecker(api=api).exchange(exchange) or {}).get("policy") != name:
        assert time.monotonic() < deadline, f"the policy on {exchange} did not become {name}"
        time.sleep(0.1)
