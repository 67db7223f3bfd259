"""The plan form: the numbers, names and rate typed for a new operation are judged by PlanForm before anything is
planned, and a bad one is refused with the form's error, in the words plan_operation uses for the admin and the CLI."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils.html import escape

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.operations.forms import WHOLE_NUMBERS, PlanForm
from dlqconsole.operations.models import Operation
from tests.conftest import client_for
from tests.factories import many


def post_plan(user: User, kind: str, **fields: str) -> Any:
    letters = many(3)
    data = {"kind": kind, "scope": "all", "pattern": str(letters[0].pattern_id), **fields}
    return client_for(user).post("/operations/plan/", data)


def assert_refused(response: Any, message: str) -> None:
    assert response.status_code == 400
    assert f'<p class="error-box" role="alert">{escape(message)}</p>' in response.content.decode()
    assert not Operation.objects.exists()
    assert not AuditEntry.objects.filter(action__startswith="operation.").exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("field", "value"),
    [("canary_size", "five"), ("canary_size", "1,5"), ("limit", "ten"), ("limit", " "), ("limit", "1e3")],
)
def test_a_canary_or_limit_that_is_no_whole_number_is_refused_and_shown_back(
    operator: User, field: str, value: str
) -> None:
    response = post_plan(operator, "retry", **{field: value})

    assert_refused(response, WHOLE_NUMBERS)
    if field == "limit":
        assert f'name="limit" value="{escape(value)}"' in response.content.decode()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("canary_size", "-1", "the canary size cannot be negative"),
        ("canary_size", "1000001", "the canary size must be at most 1,000,000"),
        ("limit", "0", "the limit must be between 1 and 1,000,000,000"),
        ("limit", "-5", "the limit must be between 1 and 1,000,000,000"),
        ("limit", "1000000001", "the limit must be between 1 and 1,000,000,000"),
    ],
)
def test_numbers_out_of_bounds_are_refused_in_the_plans_own_words(
    operator: User, field: str, value: str, message: str
) -> None:
    assert_refused(post_plan(operator, "retry", **{field: value}), message)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("target_queue", "orders\x00retry", "the target queue cannot hold a NUL character"),
        ("target_queue", "é" * 128, "the target queue is longer than 255 bytes, the most AMQP allows"),
        ("target_exchange", "e" * 256, "the target exchange is longer than 255 bytes, the most AMQP allows"),
        ("target_routing_key", "key\x00", "the routing key cannot hold a NUL character"),
    ],
)
def test_a_target_with_a_nul_or_too_long_is_refused_in_the_plans_own_words(
    operator: User, field: str, value: str, message: str
) -> None:
    assert_refused(post_plan(operator, "move", **{field: value}), message)


@pytest.mark.django_db
def test_a_rate_that_does_not_parse_is_refused_saying_what_is_wrong(operator: User) -> None:
    response = post_plan(operator, "retry", rate=" fast ")

    assert_refused(
        response,
        "rate 'fast' has no '/': write N/period[:burst] with a unit s, m or h, e.g. 50/1s, 10/60s or 4000/3h:50",
    )


@pytest.mark.django_db
def test_typed_values_are_stripped_and_planned(operator: User) -> None:
    response = post_plan(operator, "move", target_queue="  orders.retry ", rate=" 10/1s ", canary_size="1", limit=" 2 ")

    operation = Operation.objects.get()
    assert response.status_code == 302
    assert (operation.target_queue, operation.rate, operation.canary_size, operation.total) == (
        "orders.retry",
        "10/1s",
        1,
        2,
    )


@pytest.mark.sqlite
def test_an_empty_form_means_no_target_no_rate_no_canary_and_no_limit() -> None:
    form = PlanForm({})

    assert form.is_valid()
    assert form.cleaned_data == {
        "target_queue": "",
        "target_exchange": "",
        "target_routing_key": "",
        "target_broker": "",
        "rate": "",
        "canary_size": 0,
        "limit": None,
    }
    assert form.problem() == ""


@pytest.mark.sqlite
def test_the_form_says_its_first_problem_and_keeps_every_one() -> None:
    form = PlanForm({"target_queue": "a\x00b", "canary_size": "x", "limit": "0"})

    assert not form.is_valid()
    assert form.problem() == "the target queue cannot hold a NUL character"
    assert form.errors["canary_size"] == [WHOLE_NUMBERS]
    assert form.errors["limit"] == ["the limit must be between 1 and 1,000,000,000"]
