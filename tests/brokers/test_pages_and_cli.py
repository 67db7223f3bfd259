"""The same queue name on two brokers, as the pages and the CLI show it: a broker filter, the broker beside each
queue where there are several, one pattern with counts per broker."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command

from dlqconsole.brokers.models import Broker
from dlqconsole.deadletters.models import DeadLetter
from tests.conftest import client_for
from tests.factories import ParsedDeadLetterFactory, store

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]


@pytest.fixture
def two_brokers() -> tuple[list[DeadLetter], list[DeadLetter]]:
    """Three timeouts in orders.dlq of default, two of the same pattern in orders.dlq of staging."""
    staging = Broker.objects.create(name="staging", url="amqp://ops@mq:5672/staging")
    first = store(*ParsedDeadLetterFactory.build_batch(3, source_queue="orders.dlq"))
    second = store(*ParsedDeadLetterFactory.build_batch(2, source_queue="orders.dlq", broker_id=staging.pk))
    return first, second


def test_report_counts_a_pattern_per_broker_and_filters_by_one(two_brokers: Any) -> None:
    out = io.StringIO()
    call_command("dlq", "report", "failure-patterns", "--json", stdout=out)
    (row,) = map(json.loads, out.getvalue().splitlines())
    assert (row["parked"], row["parked_by_broker"]) == (5, {"default": 3, "staging": 2})

    only = io.StringIO()
    call_command("dlq", "report", "failure-patterns", "--json", "--broker", "staging", stdout=only)
    (row,) = map(json.loads, only.getvalue().splitlines())
    assert (row["parked"], row["parked_by_broker"]) == (2, {"staging": 2})

    with pytest.raises(CommandError, match="no broker named 'nope' \\(known: default, staging\\)"):
        call_command("dlq", "report", "failure-patterns", "--broker", "nope")


def test_the_messages_page_filters_by_broker_and_names_each_rows_broker(two_brokers: Any, viewer: User) -> None:
    first, second = two_brokers
    client = client_for(viewer)

    everything = client.get("/messages/").content.decode()
    assert 'name="broker"' in everything
    assert "staging ·" in everything and "default ·" in everything

    html = client.get("/messages/?broker=staging").content.decode()
    assert all(f"#{letter.pk}<" in html for letter in second)
    assert not any(f"#{letter.pk}<" in html for letter in first)

    unknown = client.get("/messages/?broker=nope").content.decode()
    assert "no broker named" in unknown


def test_a_patterns_page_counts_what_waits_on_each_broker(two_brokers: Any, viewer: User) -> None:
    first, _ = two_brokers
    client = client_for(viewer)

    html = client.get(f"/patterns/{first[0].pattern_id}/").content.decode()
    assert "Waiting by broker" in html
    assert f"?pattern={first[0].pattern_id}&amp;broker=staging" in html

    (only_default,) = store(
        ParsedDeadLetterFactory.build(source_queue="orders.dlq", error_type="KeyError", error_message="no sku")
    )
    listed = client.get("/patterns/?broker=staging").content.decode()
    assert f"/patterns/{first[0].pattern_id}/" in listed
    assert f"/patterns/{only_default.pattern_id}/" not in listed
    assert f"/patterns/{only_default.pattern_id}/" in client.get("/patterns/?broker=default").content.decode()


def test_a_messages_retry_button_names_its_broker_where_there_are_several(two_brokers: Any, operator: User) -> None:
    _, second = two_brokers
    html = client_for(operator).get(f"/messages/{second[0].pk}/").content.decode()
    assert "on broker staging?" in html
