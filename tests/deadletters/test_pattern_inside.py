"""A pattern says what it holds before anyone acts on all of it: its distinct messages with their counts, each
position where its template varies with the values it took, and where its stack traces were thrown from."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from dlqconsole.deadletters import explain as explain_module
from dlqconsole.deadletters.explain import explain
from dlqconsole.deadletters.models import FailurePattern
from dlqconsole.deadletters.services import merge_patterns
from tests.conftest import client_for
from tests.deadletters.conftest import Ingest

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]

TRACE = """Traceback (most recent call last):
  File "/usr/local/lib/python3.12/site-packages/celery/app/trace.py", line 453, in trace_task
    R = retval = fun(*args, **kwargs)
  File "/app/orders/tasks.py", line 88, in {task}
    total = pricing.{function}(order, code)
  File "/app/orders/pricing.py", line 41, in {function}
    rate = DISCOUNTS[code]
KeyError: 'SPRING'"""


def test_the_values_of_a_varying_position_are_counted_and_the_commonest_come_first(ingest: Ingest) -> None:
    rows = ingest(
        "user alice not found in directory",
        "user alice not found in directory",
        "user alice not found in directory",
        "user bob not found in directory",
        "user bob not found in directory",
        "user carol not found in directory",
    )
    pattern = FailurePattern.objects.get(pk=rows[0].pattern_id)
    assert {row.pattern_id for row in rows} == {pattern.pk}
    assert "<*>" in pattern.template

    inside = explain(pattern)

    assert inside.sampled == 6
    assert inside.template_count == 3
    assert [(item.template, item.count) for item in inside.templates] == [
        ("user alice not found in directory", 3),
        ("user bob not found in directory", 2),
        ("user carol not found in directory", 1),
    ]
    assert [(slot.number, slot.distinct, slot.values, slot.more) for slot in inside.slots] == [
        (1, 3, ("alice", "bob", "carol"), False)
    ]
    assert inside.call_sites == []


def test_only_the_latest_dead_letters_are_read_and_the_values_shown_are_bounded(
    ingest: Ingest, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = ["acme", "bolt", "cirrus", "delta", "ember", "fjord", "gale", "harbor", "iris", "juniper"]
    # One batch each, so that they are stored in this order.
    rows = [ingest(f"tenant {name} not found")[0] for name in names]
    # Mined together as they came: all ten end in one pattern.
    (pattern,) = FailurePattern.objects.filter(dead_letters__pk__in=[row.pk for row in rows]).distinct()
    monkeypatch.setattr(explain_module, "SAMPLE", 4)
    monkeypatch.setattr(explain_module, "SHOWN_VALUES", 2)

    inside = explain(pattern)

    # The four newest, each once: the values are shown by count, then by name.
    assert inside.sampled == 4
    assert sorted(item.template for item in inside.templates) == [f"tenant {name} not found" for name in names[6:]]
    (slot,) = inside.slots
    assert (slot.distinct, slot.values, slot.more) == (4, ("gale", "harbor"), True)


def test_a_merged_pattern_shows_both_places_its_traces_were_thrown_from(ingest: Ingest, operator: User) -> None:
    def failure(task: str, function: str) -> dict[str, str]:
        return {
            "message": "'SPRING'",
            "error_type": "KeyError",
            "stack_trace": TRACE.format(task=task, function=function),
        }

    here = ingest(*[failure("apply", "rate") for _ in range(3)])
    there = ingest(failure("bill", "tax"))
    target = FailurePattern.objects.get(pk=here[0].pattern_id)
    source = FailurePattern.objects.get(pk=there[0].pattern_id)
    assert target != source
    merge_patterns(target=target, source=source, actor=operator)

    inside = explain(target)

    assert inside.traces_read == 4
    assert [(site.frames, site.count) for site in inside.call_sites] == [
        ("orders/pricing.py:rate ← orders/tasks.py:apply", 3),
        ("orders/pricing.py:tax ← orders/tasks.py:bill", 1),
    ]


def test_the_pattern_page_shows_what_it_holds_escaped(ingest: Ingest, viewer: User) -> None:
    rows = ingest(
        "user alice<b> not found",
        "user bob<b> not found",
        "user alice<b> not found",
    )
    pattern = FailurePattern.objects.get(pk=rows[0].pattern_id)

    page = client_for(viewer).get(pattern.get_absolute_url())

    assert page.status_code == 200
    html = page.content.decode()
    section = html[html.index('id="inside"') : html.index('id="pattern-history"')]
    assert "What it holds" in section
    assert "2 distinct messages" in " ".join(section.split())
    assert "alice&lt;b&gt;" in section and "<b>" not in section
    assert "took 2 values" in " ".join(section.split())


def test_dead_letters_grouped_by_their_stack_trace_show_their_own_messages(ingest: Ingest, operator: User) -> None:
    """One place in the code can raise several causes: grouping keeps them apart by their masked messages, and a
    pattern that holds several (an operator merged them) shows each."""
    trace = TRACE.format(task="apply", function="rate")
    rows = ingest(
        *[
            {"message": message, "error_type": "ValueError", "stack_trace": trace}
            for message in [
                "customer_email bob@example.com is not a valid e-mail address",
                "customer_email eve@example.com is not a valid e-mail address",
                "quantity -3 must be positive",
                "shipping_address is required",
            ]
        ]
    )
    patterns = list(FailurePattern.objects.filter(dead_letters__pk__in=[row.pk for row in rows]).distinct())
    assert len(patterns) == 3
    pattern, *others = patterns
    merge_patterns(target=pattern, sources=others, actor=operator)
    pattern.refresh_from_db()

    inside = explain(pattern)

    assert [(item.template, item.count) for item in inside.templates] == [
        ("customer_email <EMAIL> is not a valid e-mail address", 2),
        ("quantity <NUM> must be positive", 1),
        ("shipping_address is required", 1),
    ]
    assert [(site.frames, site.count) for site in inside.call_sites] == [
        ("orders/pricing.py:rate ← orders/tasks.py:apply", 4)
    ]


def test_an_htmx_refresh_of_the_summary_does_not_read_what_the_pattern_holds(
    ingest: Ingest, viewer: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    (row,) = ingest("user alice not found")
    pattern = FailurePattern.objects.get(pk=row.pattern_id)

    def refuse(pattern: FailurePattern) -> None:
        raise AssertionError("explain() ran for a fragment that does not show it")

    monkeypatch.setattr("dlqconsole.deadletters.views.patterns.explain", refuse)
    summary = client_for(viewer).get(pattern.get_absolute_url(), headers={"HX-Request": "true"})

    assert summary.status_code == 200
    assert 'id="pattern-summary"' in summary.content.decode()
    assert 'id="inside"' not in summary.content.decode()


def test_the_quoted_values_of_a_stack_traces_message_are_shown_where_its_pattern_varies(ingest: Ingest) -> None:
    # A stack trace's message holds quoted values as <*> from the start: the values come from the messages.
    trace = TRACE.format(task="apply", function="rate")
    rows = ingest(
        *[
            {"message": f"unknown discount code '{code}' for region EU", "error_type": "KeyError", "stack_trace": trace}
            for code in ("SPRING", "SPRING", "SUMMER", "WINTER")
        ]
    )
    pattern = FailurePattern.objects.get(pk=rows[0].pattern_id)
    assert {row.pattern_id for row in rows} == {pattern.pk} and "<*>" in pattern.template

    inside = explain(pattern)

    assert [(slot.number, slot.distinct, slot.values) for slot in inside.slots] == [
        (1, 3, ("'SPRING'", "'SUMMER'", "'WINTER'"))
    ]
