"""The audit log as a console page: who did what, when, with which filter, on how many messages.

Everyone signed in may read it (viewers read everything the console shows), except the sign-in rows
(`accounts.login*`), which only admins see: a failed sign-in records the user name typed, often a password typed
into the wrong field, and the addresses people sign in from. Nothing here changes anything.
Newest first, keyset-paginated on the id (`?before=`), filtered by person, action (any part of it), target and
time (audit_filters.py, the filter language the API shares); each page's URL also serves its htmx fragment. A
pattern as the target (the pattern page's "audit log" link) also finds every row of the operations whose filter
named it.
"""

from __future__ import annotations

import re
from typing import Any

from django.http import HttpResponse
from django.shortcuts import render
from django.urls import NoReverseMatch, reverse
from django.views.decorators.http import require_GET
from django.views.decorators.vary import vary_on_headers

from dlqconsole.accounts.audit_filters import FILTER_NAMES, filter_entries, visible_entries
from dlqconsole.accounts.roles import VIEWER, require_role
from dlqconsole.core.views import HtmxHttpRequest, keyset_page, parse_id, partial_template

PAGE_SIZE = 50
# Targets are written 'operation:12' by some services and 'pattern #3' by others; both name a kind and an id.
TARGET = re.compile(r"^(?P<kind>[a-z_]+)(?::| #)(?P<id>\d+)$")
# The console page of each kind of target (the others, such as channels and rules, live in the admin).
TARGET_PAGES = {
    "operation": "operations:detail",
    "pattern": "deadletters:pattern",
    "deadletter": "deadletters:message",
    "dead_letter": "deadletters:message",
}


def target_link(target: str) -> str:
    """The console page a target names, or "" when it has none."""
    found = TARGET.match(target or "")
    if found is None or found["kind"] not in TARGET_PAGES:
        return ""
    try:
        return reverse(TARGET_PAGES[found["kind"]], args=[int(found["id"])])
    except NoReverseMatch:
        return ""


def filter_text(chosen: Any) -> str:
    """A filter as 'name=value; name=a,b' for reading (the JSON as stored, when it is not a mapping)."""
    if not chosen:
        return ""
    if not isinstance(chosen, dict):
        return str(chosen)
    parts = []
    for name, value in chosen.items():
        shown = ",".join(str(item) for item in value) if isinstance(value, list) else str(value)
        parts.append(f"{name}={shown}")
    return "; ".join(parts)


@require_GET
@vary_on_headers("HX-Request")
def audit_log(request: HtmxHttpRequest) -> HttpResponse:
    require_role(request.user, VIEWER)
    visible = visible_entries(request.user)
    entries, problems = filter_entries(request.GET, visible)
    if problems:
        # A filter that could not be read shows nothing rather than every entry under an error: the rows would
        # read as the answer to the filter (the messages page does the same).
        entries = entries.none()
    before = parse_id(request.GET.get("before"))
    # The id follows the time of writing; ordering by it keeps pages stable and the index small.
    rows, _, has_next = keyset_page(entries, size=PAGE_SIZE, before=before)
    kept = request.GET.copy()
    kept.pop("before", None)
    context: dict[str, Any] = {
        "entries": [(entry, target_link(entry.target), filter_text(entry.filter)) for entry in rows],
        "problems": list(problems.values()),
        "chosen": {name: request.GET.get(name, "") for name in FILTER_NAMES},
        "actions": sorted(set(visible.values_list("action", flat=True).distinct()[:200])),
        "next_query": f"{kept.urlencode()}&before={rows[-1].pk}" if has_next and rows else "",
        "first_page": before is None,
        "newest_query": kept.urlencode(),
    }
    return render(request, partial_template(request, "accounts/audit.html", "entries"), context)
