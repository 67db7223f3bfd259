"""What the patterns page and the messages page share: the page's query without some of its parameters, and
the queues that hold dead letters (the choices of their queue filter)."""

from __future__ import annotations

from django.http import QueryDict

from dlqconsole.deadletters.models import DeadLetterCount


def query_without(query: QueryDict, *names: str) -> str:
    kept = query.copy()
    for name in names:
        kept.pop(name, None)
    return kept.urlencode()


def known_queues() -> list[str]:
    return sorted(set(DeadLetterCount.objects.filter(count__gt=0).values_list("source_queue", flat=True)))
