"""The arguments of the console's Celery tasks, checked as if a stranger sent them.

Anyone who can publish to the console's Celery vhost can send any of its tasks any arguments: a message is only
JSON. So every task of the console is a `CheckedTask` that names a check for each of its parameters:

    @app.task(name="operations.run_operation", base=CheckedTask, argument_checks={"operation_id": row_id(Operation)})

Before the task runs, the call is bound to the function's signature (a missing, extra or unknown keyword argument
is refused) and each value goes through its check, which returns the value to use or raises RefusedArgument. A
refused call logs one error line naming the task and what was wrong, and returns None having done nothing: the
task ends as a success, so Celery neither retries it nor requeues the message. A task without parameters takes
no arguments at all.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Collection, Mapping
from typing import Any, ClassVar

from celery.contrib.django.task import DjangoTask
from django.db import connection
from django.db.models import Model

logger = logging.getLogger(__name__)

Check = Callable[[Any], Any]


class RefusedArgument(ValueError):
    """An argument a task will not act on; the message says which and why."""


class CheckedTask(DjangoTask):  # type: ignore[type-arg]
    """A task (Django's, for delay_on_commit) that checks its arguments with `argument_checks` (parameter name →
    check) before it runs."""

    argument_checks: ClassVar[Mapping[str, Check]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Celery makes a subclass of the base for each task function; a parameter without a check (or a check
        # without a parameter) is a mistake to catch when the task is defined, not when a message arrives.
        super().__init_subclass__(**kwargs)
        if "run" not in cls.__dict__:
            return
        parameters = inspect.signature(cls.run).parameters.values()
        variadic = [item.name for item in parameters if item.kind in (item.VAR_POSITIONAL, item.VAR_KEYWORD)]
        if variadic:
            raise TypeError(f"task {cls.name}: *{variadic[0]} cannot be checked; name each parameter")
        names = {item.name for item in parameters}
        if names != set(cls.argument_checks):
            raise TypeError(
                f"task {cls.name}: parameters {sorted(names)} but argument_checks for {sorted(cls.argument_checks)}"
            )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            bound = inspect.signature(self.run).bind(*args, **kwargs)
        except TypeError as error:
            return self._refuse(str(error))
        for name, value in bound.arguments.items():
            try:
                bound.arguments[name] = self.argument_checks[name](value)
            except RefusedArgument as problem:
                return self._refuse(f"{name}: {problem}")
        return super().__call__(*bound.args, **bound.kwargs)

    def _refuse(self, problem: str) -> None:
        logger.error("task %s refused its arguments, did nothing: %s", self.name, problem)


def whole_number(value: Any, *, minimum: int, maximum: int) -> int:
    # JSON's true and false arrive as bools, which Python counts as integers; 1.0 is not a whole number here.
    if type(value) is not int:
        raise RefusedArgument(f"{shown(value)} is not a whole number")
    if not minimum <= value <= maximum:
        raise RefusedArgument(f"{value} is outside {minimum}..{maximum}")
    return value


def row_id(model: type[Model]) -> Check:
    """A primary key of `model`: a whole number in its column's range that names an existing row."""

    def check(value: Any) -> int:
        _, maximum = connection.ops.integer_field_range(model._meta.pk.get_internal_type())
        number = whole_number(value, minimum=1, maximum=maximum)
        if not model._default_manager.filter(pk=number).exists():
            raise RefusedArgument(f"no {model._meta.object_name} {number}")
        return number

    return check


def one_of(choices: Collection[str]) -> Check:
    def check(value: Any) -> str:
        if not isinstance(value, str) or value not in choices:
            raise RefusedArgument(f"{shown(value)} is not one of {', '.join(sorted(choices))}")
        return value

    return check


def shown(value: Any) -> str:
    """A value in a message: its repr, cut short (a stranger's argument may be megabytes)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
