"""htmx responses that need more than the fragment: a lost login, and flash messages.

**A lost login.** LoginRequiredMiddleware answers a signed-out request with a redirect to the login page. The
browser follows that redirect inside htmx's request, so a polling dashboard or a clicked button would swap the
whole login page into a table cell while the top bar still shows the old user. For htmx requests the redirect
becomes `HX-Redirect` to the login page, whose `next` is the page the user was on (not the fragment's URL), so
the whole window goes to the login and comes back to that page after it.

**Flash messages.** A view answering an htmx request swaps a fragment, so the page's flash list is not rendered
again; a message it queued would otherwise wait for the next full page load and turn up there, stale. For htmx
HTML responses this appends the queued messages as an out-of-band swap of the page's `#flash` list (the pattern
django-htmx's docs describe), which consumes them.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlencode

from django.conf import settings
from django.contrib.messages import get_messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import resolve_url
from django.template.loader import render_to_string
from django_htmx.http import HttpResponseClientRedirect
from django_htmx.middleware import HtmxDetails

from dlqconsole.core.views import safe_next


class HtmxMessagesMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        htmx = getattr(request, "htmx", None)
        if not htmx:
            return response
        if _is_login_redirect(request, response):
            return _to_login(request)
        if response.streaming or "text/html" not in response.get("Content-Type", ""):
            return response
        if 300 <= response.status_code < 400 or "HX-Redirect" in response or "HX-Refresh" in response:
            return response  # the next page shows them
        queued = list(get_messages(request))
        if queued:
            response.content += render_to_string("includes/flash.html", {"messages": queued, "oob": True}).encode()
        return response


def _is_login_redirect(request: HttpRequest, response: HttpResponse) -> bool:
    user = getattr(request, "user", None)
    if response.status_code not in (301, 302) or user is None or user.is_authenticated:
        return False
    login = resolve_url(settings.LOGIN_URL)
    return str(response.get("Location", "")).split("?", 1)[0] == login


def _to_login(request: HttpRequest) -> HttpResponse:
    """HX-Redirect to the login page, coming back to the page the user had open (when it is one of ours)."""
    login = resolve_url(settings.LOGIN_URL)
    htmx: HtmxDetails = request.htmx  # type: ignore[attr-defined]  # set by django-htmx's middleware
    current = safe_next(request, htmx.current_url_abs_path) or "/"
    return HttpResponseClientRedirect(f"{login}?{urlencode({'next': current})}")
