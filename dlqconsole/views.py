from __future__ import annotations

import hmac
import threading
import time

from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.db import DatabaseError, connection
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.templatetags.static import static
from django.views import defaults
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from django_prometheus.exports import ExportToDjangoView

from dlqconsole.api import errors as api_errors
from dlqconsole.brokers import registry
from dlqconsole.brokers.models import DEFAULT, Broker
from dlqconsole.core.amqp import connect


@login_not_required
@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """200 when the database and the broker default answer, 503 (with which one failed) otherwise. Every other
    enabled broker is reported under "brokers"; one that does not answer makes the status "degraded" (still 200:
    restarting the console does not bring a broker back)."""
    checks: dict[str, str] = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception as error:  # noqa: BLE001  (a health check reports failures, it does not raise them)
        checks["database"] = f"error: {type(error).__name__}"
    others: dict[str, str] = {}
    brokers = _brokers() if checks["database"] == "ok" else None
    if brokers is not None:
        for broker in brokers:
            others[broker.name] = broker_status(broker)
        checks["broker"] = others.pop(DEFAULT, "error: disabled")
    else:
        checks["broker"] = broker_status(None)
    healthy = all(value == "ok" for value in checks.values())
    status = "error" if not healthy else "degraded" if any(value != "ok" for value in others.values()) else "ok"
    body: dict[str, object] = {"status": status, **checks}
    if others:
        body["brokers"] = others
    return JsonResponse(body, status=200 if healthy else 503)


def _brokers() -> list[Broker] | None:
    """The enabled brokers, or None when the database cannot say (not migrated yet)."""
    try:
        return registry.brokers()
    except DatabaseError:
        return None


# Each broker's last answer in this process, by its shown URL: (when it was asked, "ok" or the error).
_broker_answers: dict[str, tuple[float, str]] = {}
_broker_lock = threading.Lock()


def broker_status(broker: Broker | None) -> str:
    """Whether the broker (AMQP_URL when None: the database cannot say which brokers exist) answers, asked at most
    once per DLQ_HEALTHZ_BROKER_CACHE_SECONDS in a process: /healthz needs no login, and calls piling up must not
    pile up AMQP connections. The lock makes a thread that comes while another asks wait for that answer instead
    of connecting too."""
    key = broker.url if broker is not None else ""
    with _broker_lock:
        asked_at, answer = _broker_answers.get(key, (float("-inf"), ""))
        if time.monotonic() - asked_at < settings.DLQ_HEALTHZ_BROKER_CACHE_SECONDS:
            return answer
        try:
            if broker is None:
                connect(settings.AMQP_URL, heartbeat=0).close()
            else:
                registry.connect(broker, heartbeat=0).close()
            answer = "ok"
        except Exception as error:  # noqa: BLE001  (a health check reports failures, it does not raise them)
            answer = f"error: {type(error).__name__}"
        _broker_answers[key] = (time.monotonic(), answer)
        return answer


@login_not_required
@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus metrics; with DLQ_METRICS_TOKEN set, only for `Authorization: Bearer <token>`."""
    token = settings.DLQ_METRICS_TOKEN
    if token:
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        # compare_digest takes as long for a wrong token as for a right one of the same length.
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
            response = HttpResponse("A bearer token is needed (DLQ_METRICS_TOKEN).\n", status=401)
            response["Content-Type"] = "text/plain; charset=utf-8"
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
            return response
    return ExportToDjangoView(request)


@login_not_required
@require_GET
def favicon(request: HttpRequest) -> HttpResponseRedirect:
    """Browsers ask for /favicon.ico on pages that name no icon (the admin's): send them to the console's."""
    return HttpResponseRedirect(static("img/favicon.svg"))


def server_error(request: HttpRequest) -> HttpResponse:
    """Django's 500 page, or JSON under /api/ (scripts read the answer, not a page)."""
    if request.path.startswith("/api/"):
        return api_errors.server_error(request)
    return defaults.server_error(request)


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    """Django's 400 page, or JSON under /api/ (a refusal raised before any view runs, such as a bad Host header)."""
    if request.path.startswith("/api/"):
        return api_errors.bad_request(request, exception)
    return defaults.bad_request(request, exception)
