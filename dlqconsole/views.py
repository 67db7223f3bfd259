from __future__ import annotations

from django.contrib.auth.decorators import login_not_required
from django.db import connection
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.templatetags.static import static
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from django_prometheus.exports import ExportToDjangoView

from dlqconsole.core.amqp import connect


@login_not_required
@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """200 when the database and the broker answer, 503 (with which one failed) otherwise."""
    checks: dict[str, str] = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception as error:  # noqa: BLE001  (a health check reports failures, it does not raise them)
        checks["database"] = f"error: {type(error).__name__}"
    try:
        broker = connect(heartbeat=0)
        broker.close()
        checks["broker"] = "ok"
    except Exception as error:  # noqa: BLE001
        checks["broker"] = f"error: {type(error).__name__}"
    healthy = all(value == "ok" for value in checks.values())
    return JsonResponse({"status": "ok" if healthy else "error", **checks}, status=200 if healthy else 503)


@login_not_required
@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    return ExportToDjangoView(request)


@login_not_required
@require_GET
def favicon(request: HttpRequest) -> HttpResponseRedirect:
    """Browsers ask for /favicon.ico on pages that name no icon (the admin's): send them to the console's."""
    return HttpResponseRedirect(static("img/favicon.svg"))
