"""Circuit breakers on the pages: what the operations list, an operation and the watched queues show of them, and
closing one by hand (admin)."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from dlqconsole.accounts.roles import ADMIN, has_role, require_role
from dlqconsole.core.views import safe_next
from dlqconsole.operations import services
from dlqconsole.operations.breakers import breaker_views, describe_key, ranked

# A breaker key is a destination (a queue or an exchange and routing key, each at most 255) and a broker name.
MAX_KEY = 600
# Breakers a page lists at most (those waited for or set in the admin first).
MAX_LISTED = 50


def breaker_context(request: HttpRequest) -> dict[str, Any]:
    """The breakers that are not closed (those waited for or set in the admin first, at most MAX_LISTED), for
    `operations/_breakers.html`."""
    shown, left_out = ranked([view for view in breaker_views() if not view.is_closed], limit=MAX_LISTED)
    return {"breakers": shown, "breakers_not_shown": left_out, "can_close_breakers": has_role(request.user, ADMIN)}


@require_POST
def breaker_close(request: HttpRequest) -> HttpResponse:
    require_role(request.user, ADMIN)
    key = request.POST.get("key", "")
    if not key or len(key) > MAX_KEY or key not in {view.key for view in breaker_views()}:
        raise Http404("no such circuit breaker")
    services.close_breaker(key=key, actor=request.user)
    messages.success(request, f"Circuit closed by hand for {describe_key(key)}: replays waiting for it go on.")
    return redirect(safe_next(request, request.POST.get("next")) or "operations:list")
