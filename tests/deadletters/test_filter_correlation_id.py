"""The correlation id filter: every dead letter of one business transaction, on the messages page and in the
filter language the operations, exports and the API share."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.http import QueryDict

from dlqconsole.deadletters.filters import DeadLetterFilter, FilterError
from dlqconsole.deadletters.models import DeadLetter
from tests.conftest import client_for
from tests.factories import EnvelopeFactory, store

pytestmark = [pytest.mark.django_db]

HX = {"HX-Request": "true"}


def correlated(*pairs: tuple[str, str]) -> list[DeadLetter]:
    """Dead letters from the queues named, each with the correlation id given."""
    rows = store(*(EnvelopeFactory.build(queue=queue) for queue, _ in pairs))
    for row, (_, correlation_id) in zip(rows, pairs, strict=True):
        DeadLetter.objects.filter(pk=row.pk).update(correlation_id=correlation_id)
    return rows


def test_the_messages_page_filters_by_correlation_id(viewer: User) -> None:
    correlated(("orders", "checkout-1"), ("billing", "checkout-1"), ("stock", "checkout-2"))
    client = client_for(viewer)

    def shown(query: str) -> set[str]:
        html = client.get(f"/messages/?{query}", headers=HX).content.decode()
        return {queue for queue in ("orders.dlq", "billing.dlq", "stock.dlq") if f">{queue}<" in html}

    assert shown("correlation_id=checkout-1") == {"orders.dlq", "billing.dlq"}
    assert shown("correlation_id=checkout-2,nothing") == {"stock.dlq"}
    assert shown("correlation_id=checkout-1&correlation_id=checkout-2") == {"orders.dlq", "billing.dlq", "stock.dlq"}
    assert shown("correlation_id=nothing") == set()


def test_the_filter_form_has_the_field_and_keeps_what_was_typed(viewer: User) -> None:
    html = client_for(viewer).get("/messages/?correlation_id=checkout-1,checkout-2").content.decode()

    assert '<label for="f-correlation-id">Correlation id</label>' in html
    assert 'name="correlation_id" value="checkout-1,checkout-2"' in html


def test_a_nul_in_a_correlation_id_is_refused() -> None:
    with pytest.raises(FilterError, match="correlation_id cannot hold a NUL"):
        DeadLetterFilter.from_querydict(QueryDict("correlation_id=a%00b"))


def test_the_correlation_id_is_kept_in_the_stored_filter() -> None:
    chosen = DeadLetterFilter.from_querydict(QueryDict("correlation_id=a,b&correlation_id=c"))

    assert chosen.to_dict() == {"correlation_id": ["a", "b", "c"]}
    assert DeadLetterFilter.from_dict(chosen.to_dict()) == chosen


def test_correlation_ids_have_an_index() -> None:
    with connection.cursor() as cursor:
        indexes = connection.introspection.get_constraints(cursor, DeadLetter._meta.db_table)

    assert indexes["deadletter_correlation_id"]["columns"] == ["correlation_id"]
