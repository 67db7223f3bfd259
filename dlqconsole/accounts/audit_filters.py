"""The audit log's filter language, shared by the audit page and `GET /api/v1/audit/`: who may read which rows, and
the rows a filter (actor, action, target, since, until) selects.

Everyone with the viewer role reads the log, except the sign-in rows (`accounts.login*`), which only admins see: a
failed sign-in records the user name typed, often a password typed into the wrong field, and the addresses people
sign in from. A pattern as the target also finds every row of the operations whose filter named it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from django.db import connection
from django.db.models import Q, QuerySet

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.accounts.roles import ADMIN, has_role
from dlqconsole.core.durations import parse_moment

# The filter's parameters, in the order the page shows them.
FILTER_NAMES = ("actor", "action", "target", "since", "until")
# Audit rows of sign-ins (accounts.login, .failed, .refused): admins only.
SIGN_IN_ACTIONS = "accounts.login"


def visible_entries(user: Any) -> QuerySet[AuditEntry]:
    """The rows `user` may read: every row for an admin, all but the sign-in rows for anyone else."""
    entries = AuditEntry.objects.all()
    return entries if has_role(user, ADMIN) else entries.exclude(action__startswith=SIGN_IN_ACTIONS)


def filter_entries(
    query: Mapping[str, str], visible: QuerySet[AuditEntry]
) -> tuple[QuerySet[AuditEntry], dict[str, str]]:
    """The visible rows the filter in `query` selects, and what could not be read in it, by parameter. With a
    problem the rows are not an answer to the filter: the callers show none (the page) or refuse (the API)."""
    entries = visible.select_related("actor")
    for name in ("actor", "action", "target"):
        if "\x00" in (query.get(name) or ""):
            # No entry holds one (PostgreSQL text cannot), and a query that compares with one fails.
            return entries.none(), {name: f"{name}: a NUL character matches nothing."}
    problems: dict[str, str] = {}
    if person := (query.get("actor") or "").strip():
        entries = entries.filter(Q(actor_name__iexact=person) | Q(actor__username__iexact=person))
    if action := (query.get("action") or "").strip():
        entries = entries.filter(action__icontains=action)
    if target := (query.get("target") or "").strip():
        entries = entries.filter(target_filter(target))
    for name, lookup in (("since", "created_at__gte"), ("until", "created_at__lte")):
        if not (value := (query.get(name) or "").strip()):
            continue
        try:
            entries = entries.filter(**{lookup: parse_moment(value, name=name)})
        except ValueError as problem:
            problems[name] = str(problem)
    return entries, problems


def target_filter(value: str) -> Q:
    """'pattern:3', 'pattern #3' or 'pattern 3' finds both spellings; any other text is searched in the target.
    A pattern also finds the rows of the operations that acted on it through their filter."""
    # One separator: a colon or # with spaces around, or spaces alone. Written so that a run of spaces is read one
    # way only (the plainer `\s*(?::|#|\s)\s*` tries every split of it: quadratic in the spaces typed).
    found = re.match(r"^\s*(?P<kind>[a-z_]+)(?:\s*[:#]\s*|\s+)#?(?P<id>\d+)\s*$", value)
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
