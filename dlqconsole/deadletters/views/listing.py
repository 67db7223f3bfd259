"""What the patterns page and the messages page share: the page's query without some of its parameters, the
queues that hold dead letters (the choices of their queue filter) and the brokers (those of the broker filter)."""

from __future__ import annotations

from django.http import QueryDict

from dlqconsole.brokers import registry
from dlqconsole.deadletters.models import DeadLetterCount


def query_without(query: QueryDict, *names: str) -> str:
    kept = query.copy()
    for name in names:
        kept.pop(name, None)
    return kept.urlencode()


def known_queues() -> list[str]:
    return sorted(set(DeadLetterCount.objects.filter(count__gt=0).values_list("source_queue", flat=True)))


def broker_names() -> dict[int, str]:
    """Every broker's name by id (a disabled broker's dead letters are still shown). With one broker, pages leave
    its name out."""
    return {broker.pk: broker.name for broker in registry.brokers(enabled=False)}
