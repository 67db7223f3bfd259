from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from dlqconsole.deadletters.models import DeadLetterCount, DeadLetterStatus


@require_GET
def dashboard(request: HttpRequest) -> HttpResponse:
    parked = DeadLetterCount.objects.filter(status=DeadLetterStatus.PARKED, count__gt=0)
    return render(request, "deadletters/dashboard.html", {"parked_cells": parked})
