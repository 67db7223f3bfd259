"""Flash messages for htmx requests.

A view answering an htmx request swaps a fragment, so the page's flash list is not rendered again; a message it
queued would otherwise wait for the next full page load and turn up there, stale. For htmx HTML responses this
appends the queued messages as an out-of-band swap of the page's `#flash` list (the pattern django-htmx's docs
describe), which consumes them.
"""

from __future__ import annotations

from collections.abc import Callable

from django.contrib.messages import get_messages
from django.http import HttpRequest, HttpResponse
from django.template.loader import render_to_string


class HtmxMessagesMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        htmx = getattr(request, "htmx", None)
        if not htmx or response.streaming or "text/html" not in response.get("Content-Type", ""):
            return response
        if 300 <= response.status_code < 400 or "HX-Redirect" in response or "HX-Refresh" in response:
            return response  # the next page shows them
        queued = list(get_messages(request))
        if queued:
            response.content += render_to_string("includes/flash.html", {"messages": queued, "oob": True}).encode()
        return response
