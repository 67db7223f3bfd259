"""What the console's views share: the request htmx makes, the template of a page or of its partial, the address
to return to after a form, ids read from an address, and keyset pages."""

from __future__ import annotations

from collections.abc import Sequence

from django.db.models import Model, QuerySet
from django.http import HttpRequest
from django.utils.http import url_has_allowed_host_and_scheme
from django_htmx.middleware import HtmxDetails

# An id is a bigint: more digits than this is no id (and no database query).
MAX_ID_DIGITS = 18


class HtmxHttpRequest(HttpRequest):
    """What HtmxMiddleware makes of every request (for the type checker)."""

    htmx: HtmxDetails


def partial_template(request: HtmxHttpRequest, template: str, name: str) -> str:
    """The page's template, or only its partial `name` when htmx asks for the fragment: one URL serves both."""
    return f"{template}#{name}" if request.htmx else template


def safe_next(request: HttpRequest, target: str | None) -> str:
    """`target` when it is a path on this site to go back to (after a form, a sign-in), else "".

    A path only: no scheme and no host, not even this one, so that nothing can send the browser elsewhere or from
    HTTPS to HTTP. It starts with one slash: `//host` and `/\\host` are other hosts to a browser (which reads a
    backslash as a slash). Django's own check comes on top."""
    if not target or not target.startswith("/") or target.startswith(("//", "/\\")):
        return ""
    if not url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return ""
    return target


def parse_id(value: str | None) -> int | None:
    """A positive id typed into an address or a form (a row, a keyset cursor), or None. ASCII digits only: '²' is
    a digit to isdigit() but not to int(), and '١' should not name #1."""
    if not value or not (value.isascii() and value.isdigit()) or len(value) > MAX_ID_DIGITS:
        return None
    number = int(value)
    return number if number > 0 else None


def keyset_page[RowT: Model](
    rows: QuerySet[RowT],
    *,
    size: int,
    before: int | None = None,
    after: int | None = None,
    columns: Sequence[str] = (),
) -> tuple[list[RowT], bool, bool]:
    """One page of `rows`, newest (highest id) first, and whether there are newer and older pages: keyset on the
    id, never OFFSET. `before` walks to older rows, `after` back to newer ones; `columns` are the only ones read,
    when given."""
    if columns:
        rows = rows.only(*columns)
    if after is not None:
        newer = list(rows.filter(pk__gt=after).order_by("id")[: size + 1])
        return list(reversed(newer[:size])), len(newer) > size, bool(newer)
    older = rows.filter(pk__lt=before) if before is not None else rows
    page = list(older.order_by("-id")[: size + 1])
    return page[:size], before is not None, len(page) > size
