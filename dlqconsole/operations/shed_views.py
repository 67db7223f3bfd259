"""The shed form: a work queue of the dashboard's backpressure panel, planned as a shed operation (admins only).
The operation page then starts it with the queue's depth typed in, as a purge is started."""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from dlqconsole.accounts.roles import ADMIN, require_role
from dlqconsole.core.durations import parse_duration
from dlqconsole.core.views import HtmxHttpRequest
from dlqconsole.operations import services, shed

SHED_FIELDS = ("queue", "broker", "priority_below", "older_than", "limit", "rate")


@require_http_methods(["GET", "POST"])
def shed_plan(request: HtmxHttpRequest) -> HttpResponse:
    """GET: the shed form for a work queue (the dashboard's backpressure panel links here with the queue). POST:
    plan the shed and show it, to be started with its depth typed in. Admins only."""
    require_role(request.user, ADMIN)
    query = request.GET if request.method == "GET" else request.POST
    values = {name: query.get(name, "").strip() for name in SHED_FIELDS}
    context: dict[str, Any] = {"values": values, "error": ""}
    if request.method == "GET":
        return render(request, "operations/shed.html", context)
    try:
        operation = shed.plan_shed(actor=request.user, **_shed_arguments(values))
    except services.OperationError as problem:
        context["error"] = str(problem)
        return render(request, "operations/shed.html", context, status=400)
    return redirect("operations:detail", pk=operation.pk)


def _shed_arguments(values: dict[str, str]) -> dict[str, Any]:
    try:
        priority_below = shed.whole_number(values["priority_below"])
        limit = shed.whole_number(values["limit"]) if values["limit"] else None
    except ValueError:
        raise services.OperationError("The priority and the limit must be whole numbers.") from None
    try:
        older_than = parse_duration(values["older_than"]) if values["older_than"] else None
    except ValueError as error:
        raise services.OperationError(str(error)) from None
    return {
        "queue": values["queue"],
        "broker": values["broker"],
        "priority_below": priority_below,
        "older_than": older_than,
        "limit": limit,
        "rate": values["rate"],
    }
