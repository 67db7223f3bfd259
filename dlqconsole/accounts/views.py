"""The audit log as a console page: who did what, when, with which filter, on how many messages.

Everyone signed in may read it (viewers read everything the console shows), except the sign-in rows
(`accounts.login*`), which only admins see: a failed sign-in records the user name typed, often a password typed
into the wrong field, and the addresses people sign in from. Nothing here changes anything.
Newest first, keyset-paginated on the id (`?before=`), filtered by person, action (any part of it), target and
time; each page's URL also serves its htmx fragment. A pattern as the target (the pattern page's "audit log" link)
also finds every row of the operations whose filter named it.
"""

from __future__ import annotations

import re
from typing import Any

from django.db import connection
from django.db.models import Q, QuerySet
from django.http import HttpResponse, QueryDict
from django.shortcuts import render
from django.urls import NoReverseMatch, reverse
from django.views.decorators.http import require_GET
from django.views.decorators.vary import vary_on_headers

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.accounts.roles import ADMIN, VIEWER, has_role, require_role
from dlqconsole.core.durations import parse_moment
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


def _target_filter(value: str) -> Q:
    """'pattern:3', 'pattern #3' or 'pattern 3' finds both spellings; any other text is searched in the target.
    A pattern also finds the rows of the operations that acted on it through their filter."""
    found = re.match(r"^\s*(?P<kind>[a-z_]+)\s*(?::|#|\s)\s*#?(?P<id>\d+)\s*$", value)
    if found is None:
        return Q(target__icontains=value.strip())
    kind, pk = found["kind"], found["id"]
    spellings = Q(target__in=[f"{kind}:{pk}", f"{kind} #{pk}"])
    if kind != "pattern":
        return spellings
    return spellings | Q(target__in=_operations_naming_pattern(int(pk)))


def _operations_naming_pattern(pk: int) -> list[str]:
    """The targets ('operation:12') of the operations whose filter named the pattern. Their plan, start and cancel
    rows keep that filter; their other rows (pause, rate, the runner's) are then found by the target.

    PostgreSQL answers from the GIN index on `filter` (JSON containment). SQLite has no JSON containment: there the
    JSON is matched here, after a scan of the operations' rows that name any pattern."""
    if connection.vendor == "postgresql":
        return sorted(
            set(
                AuditEntry.objects.filter(filter__contains={"pattern": [pk]}, target__startswith="operation:")
                .order_by()
                .values_list("target", flat=True)
                .distinct()
            )
        )
    named = (
        AuditEntry.objects.filter(target__startswith="operation:", filter__has_key="pattern")
        .order_by()
        .values_list("target", "filter__pattern")
        .distinct()
    )
    return sorted({target for target, patterns in named if isinstance(patterns, list) and pk in patterns})


# Audit rows of sign-ins (accounts.login, .failed, .refused): admins only.
SIGN_IN_ACTIONS = "accounts.login"


def _visible(user: Any) -> QuerySet[AuditEntry]:
    entries = AuditEntry.objects.all()
    return entries if has_role(user, ADMIN) else entries.exclude(action__startswith=SIGN_IN_ACTIONS)


def _filtered(query: QueryDict, visible: QuerySet[AuditEntry]) -> tuple[QuerySet[AuditEntry], list[str]]:
    entries = visible.select_related("actor")
    problems: list[str] = []
    for name in ("actor", "action", "target"):
        if "\x00" in query.get(name, ""):
            # No entry holds one (PostgreSQL text cannot), and a query that compares with one fails.
            return entries.none(), [f"{name}: a NUL character matches nothing."]
    if person := query.get("actor", "").strip():
        entries = entries.filter(Q(actor_name__iexact=person) | Q(actor__username__iexact=person))
    if action := query.get("action", "").strip():
        entries = entries.filter(action__icontains=action)
    if target := query.get("target", "").strip():
        entries = entries.filter(_target_filter(target))
    for name, lookup in (("since", "created_at__gte"), ("until", "created_at__lte")):
        if not (value := query.get(name, "").strip()):
            continue
        try:
            entries = entries.filter(**{lookup: parse_moment(value, name=name)})
        except ValueError as problem:
            problems.append(str(problem))
    return entries, problems


@require_GET
@vary_on_headers("HX-Request")
def audit_log(request: HtmxHttpRequest) -> HttpResponse:
    require_role(request.user, VIEWER)
    visible = _visible(request.user)
    entries, problems = _filtered(request.GET, visible)
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
        "problems": problems,
        "chosen": {name: request.GET.get(name, "") for name in ("actor", "action", "target", "since", "until")},
        "actions": sorted(set(visible.values_list("action", flat=True).distinct()[:200])),
        "next_query": f"{kept.urlencode()}&before={rows[-1].pk}" if has_next and rows else "",
        "first_page": before is None,
        "newest_query": kept.urlencode(),
    }
    return render(request, partial_template(request, "accounts/audit.html", "entries"), context)
