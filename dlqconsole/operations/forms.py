"""The plan form: the values a person types for a new operation, besides its filter (DeadLetterFilter reads that).

Each value is judged by the check plan_operation uses, so the page refuses it in the same words as a plan made by
the admin or the `dlq` command; what depends on the kind or on the other values (a target only for a move, a rate
only for what publishes, a canary smaller than the plan) is left to plan_operation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import forms

from dlqconsole.core.ratelimit import parse_rate
from dlqconsole.operations.models import OperationKind
from dlqconsole.operations.planning import check_amqp_name, check_canary_size, check_limit, find_target_broker
from dlqconsole.operations.services import OperationError

WHOLE_NUMBERS = "Canary size and limit must be whole numbers."


def _judge(check: Callable[[Any], object], value: Any) -> None:
    """Run a check that raises OperationError or ValueError saying what is wrong; that is the field's error."""
    try:
        check(value)
    except (OperationError, ValueError) as error:
        raise forms.ValidationError(str(error)) from None


class CheckedTextField(forms.Field):
    """Optional text, stripped, judged by `check` when given. Not a CharField: its own NUL check would answer
    first, in other words than the plan's."""

    def __init__(self, *, check: Callable[[str], object], **kwargs: Any) -> None:
        self.check = check
        super().__init__(required=False, **kwargs)

    def to_python(self, value: Any) -> str:
        return "" if value in self.empty_values else str(value).strip()

    def validate(self, value: Any) -> None:
        super().validate(value)
        if value:
            _judge(self.check, value)


class PlanForm(forms.Form):
    """What the plan page posts besides the kind and the filter, named as plan_operation's arguments."""

    target_queue = CheckedTextField(check=lambda name: check_amqp_name("target queue", name))
    target_exchange = CheckedTextField(check=lambda name: check_amqp_name("target exchange", name))
    target_routing_key = CheckedTextField(check=lambda name: check_amqp_name("routing key", name))
    # A broker's name; empty: each dead letter's own broker.
    target_broker = CheckedTextField(check=lambda name: find_target_broker(OperationKind.MOVE, name))
    rate = CheckedTextField(check=parse_rate)
    canary_size = forms.IntegerField(required=False, error_messages={"invalid": WHOLE_NUMBERS})
    limit = forms.IntegerField(required=False, error_messages={"invalid": WHOLE_NUMBERS})

    def clean_canary_size(self) -> int:
        canary_size = self.cleaned_data["canary_size"] or 0
        _judge(check_canary_size, canary_size)
        return canary_size

    def clean_limit(self) -> int | None:
        limit = self.cleaned_data["limit"]
        _judge(check_limit, limit)
        return limit

    def problem(self) -> str:
        """The first field's error ("" when valid): the page says one thing at a time, as plan_operation does."""
        for name in self.fields:
            if name in self.errors:
                return str(self.errors[name][0])
        return ""
