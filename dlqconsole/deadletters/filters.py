"""The one filter language for dead letters, shared by the messages page, operations, the admin and the CLI.

A filter is a plain dict of strings and lists (so it can be stored on an Operation, put in a URL and written to
the audit log). `DeadLetterFilter.from_querydict` and `from_options` parse it strictly; `apply` turns it into a
queryset. Bad values raise FilterError with a message fit for the user.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from django.db.models import F, Lookup, Q
from django.db.models.sql.compiler import SQLCompiler
from django.http import QueryDict

from dlqconsole.brokers.models import NAME_PATTERN as BROKER_NAME
from dlqconsole.brokers.models import Broker
from dlqconsole.core.durations import parse_moment
from dlqconsole.deadletters import time_bounds
from dlqconsole.deadletters.models import DeadLetter, DeadLetterQuerySet, DeadLetterStatus, FailureReason
from dlqconsole.deadletters.search import INDEXABLE, MIN_SEARCH_CHARS, search_term

MAX_IDS = 10000


class FilterError(ValueError):
    pass


class BytesContains(Lookup):  # type: ignore[type-arg]
    """True when a binary column contains the given bytes.

    Django's `contains` on a BinaryField compares the column cast to text with LIKE, which on PostgreSQL
    searches the hex form of the bytea and never finds a payload; this compares bytes with bytes instead
    (position() on bytea, instr() on SQLite blobs), with no LIKE wildcards to escape.
    """

    lookup_name = "bytes_contains"

    def as_sql(self, compiler: SQLCompiler, connection: Any) -> Any:
        lhs, lhs_params = self.process_lhs(compiler, connection)
        rhs, rhs_params = self.process_rhs(compiler, connection)
        return f"instr({lhs}, {rhs}) > 0", [*lhs_params, *rhs_params]

    def as_postgresql(self, compiler: SQLCompiler, connection: Any) -> Any:
        lhs, lhs_params = self.process_lhs(compiler, connection)
        rhs, rhs_params = self.process_rhs(compiler, connection)
        return f"position({rhs} in {lhs}) > 0", [*rhs_params, *lhs_params]


@dataclass
class DeadLetterFilter:
    pattern: list[int] = field(default_factory=list)
    # Broker names: a filter is stored and shown, and a name reads better than an id.
    broker: list[str] = field(default_factory=list)
    queue: list[str] = field(default_factory=list)
    reason: list[str] = field(default_factory=list)
    status: list[str] = field(default_factory=list)
    error_type: str = ""
    since: str = ""
    until: str = ""
    priority: str = ""
    message_id: list[str] = field(default_factory=list)
    correlation_id: list[str] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    host: str = ""
    version: str = ""
    text: str = ""
    payload: str = ""

    FIELDS = (
        "pattern",
        "broker",
        "queue",
        "reason",
        "status",
        "error_type",
        "since",
        "until",
        "priority",
        "message_id",
        "correlation_id",
        "ids",
        "host",
        "version",
        "text",
        "payload",
    )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeadLetterFilter:
        """From a stored filter, or a mapping where list fields may be lists or single values."""
        values: dict[str, Any] = {}
        for name in cls.FIELDS:
            raw = data.get(name)
            if raw in (None, "", []):
                continue
            default = getattr(cls(), name)
            if isinstance(default, list):
                items = raw if isinstance(raw, list | tuple) else [raw]
                values[name] = [item for item in items if item not in (None, "")]
            else:
                values[name] = str(raw).strip()
        found = cls(**values)
        found.validate()
        return found

    @classmethod
    def from_querydict(cls, query: QueryDict) -> DeadLetterFilter:
        return cls.from_dict(cls._query_data(query))

    @classmethod
    def as_typed(cls, query: QueryDict) -> DeadLetterFilter:
        """What the query holds, unchecked: refills a filter form after from_querydict refused it, so that one
        bad value does not blank the good ones. Never applied."""
        typed: dict[str, Any] = {
            name: [item for item in value if item] if isinstance(value, list) else value.strip()
            for name, value in cls._query_data(query).items()
        }
        return cls(**typed)

    @classmethod
    def _query_data(cls, query: QueryDict) -> dict[str, Any]:
        data: dict[str, Any] = {}
        for name in cls.FIELDS:
            if isinstance(getattr(cls(), name), list):
                # Accept both ?queue=a&queue=b and ?queue=a,b
                data[name] = [part.strip() for value in query.getlist(name) for part in value.split(",")]
            else:
                data[name] = query.get(name, "")
        return data

    def validate(self) -> None:
        try:
            self.pattern = [int(value) for value in self.pattern]
            self.ids = [int(value) for value in self.ids]
        except (TypeError, ValueError):
            raise FilterError("pattern and ids must be whole numbers") from None
        if any(not 0 < value < 2**63 for value in self.pattern + self.ids):
            raise FilterError("pattern and ids are whole numbers from 1 to 9223372036854775807")
        if max(len(self.ids), len(self.message_id), len(self.correlation_id)) > MAX_IDS:
            raise FilterError(f"at most {MAX_IDS} ids in one filter; use another filter for more")
        self.queue = [str(value) for value in self.queue]
        self.broker = [str(value) for value in self.broker]
        bad = [value for value in self.broker if not re.fullmatch(BROKER_NAME, value)]
        if bad:
            raise FilterError(f"{bad[0][:64]!r} is not a broker name")
        if self.broker:
            broker_ids(self.broker)
        self.message_id = [str(value) for value in self.message_id]
        self.correlation_id = [str(value) for value in self.correlation_id]
        # Stored text never holds a NUL (PostgreSQL refuses one); a payload, searched as bytes, may.
        for name in (
            "queue",
            "message_id",
            "correlation_id",
            "error_type",
            "host",
            "version",
            "text",
            "since",
            "until",
        ):
            value = getattr(self, name)
            if any("\x00" in item for item in (value if isinstance(value, list) else [value])):
                raise FilterError(f"{name} cannot hold a NUL character")
        reasons = set(FailureReason.values)
        self.reason = [str(value).upper() for value in self.reason]
        unknown = [value for value in self.reason if value not in reasons]
        if unknown:
            raise FilterError(f"unknown reason {unknown[0]!r}; one of {', '.join(sorted(reasons))}")
        statuses = set(DeadLetterStatus.values)
        self.status = [str(value).lower() for value in self.status]
        unknown = [value for value in self.status if value not in statuses]
        if unknown:
            raise FilterError(f"unknown status {unknown[0]!r}; one of {', '.join(sorted(statuses))}")
        if self.text and len(self.text) < MIN_SEARCH_CHARS:
            raise FilterError(
                f"text must be at least {MIN_SEARCH_CHARS} characters: a shorter one would read every row"
            )
        if self.text and not INDEXABLE.search(self.text):
            raise FilterError(
                f"text must hold at least {MIN_SEARCH_CHARS} letters or digits in a row: the index knows no shorter "
                "run, and the search would read every row"
            )
        if self.priority and not re.fullmatch(r"\d{1,3}(-\d{1,3})?", self.priority):
            raise FilterError("priority must be a number or a range like 5-9")
        for name in ("since", "until"):
            value = getattr(self, name)
            if value:
                _moment(value, name=name)

    def to_dict(self) -> dict[str, Any]:
        """Only the fields in use: compact in URLs, operations and the audit log."""
        return {name: value for name, value in asdict(self).items() if value not in ("", [])}

    def is_empty(self) -> bool:
        return not self.to_dict()

    def apply(self, queryset: DeadLetterQuerySet | None = None) -> DeadLetterQuerySet:
        """The dead letters matching this filter. Without a status filter, archived ones are left out."""
        found = queryset if queryset is not None else DeadLetter.objects.all()
        found = found.filter(status__in=self.status) if self.status else found.visible()
        if self.pattern:
            found = found.filter(pattern_id__in=self.pattern)
        if self.broker:
            found = found.filter(broker_id__in=list(broker_ids(self.broker)))
        if self.queue:
            found = found.filter(Q(source_queue__in=self.queue) | Q(original_queue__in=self.queue))
        if self.reason:
            found = found.filter(failure_reason__in=self.reason)
        if self.error_type:
            found = found.filter(error_type=self.error_type)
        if self.since:
            since = _moment(self.since, name="since")
            found = found.filter(ingested_at__gte=since)
            if time_bounds.kept():
                lowest = time_bounds.lowest_id_from(since)
                found = found.none() if lowest is None else found.filter(pk__gte=lowest)
        if self.until:
            until = _moment(self.until, name="until")
            found = found.filter(ingested_at__lt=until)
            if time_bounds.kept():
                # Without it, a window far from the newest rows reads every newer row first (time_bounds.py).
                found = found.filter(pk__lte=time_bounds.highest_id_before(until))
        if self.priority:
            low, _, high = self.priority.partition("-")
            found = found.filter(priority__gte=int(low), priority__lte=int(high or low))
        if self.message_id:
            found = found.filter(message_id__in=self.message_id)
        if self.correlation_id:
            found = found.filter(correlation_id__in=self.correlation_id)
        if self.ids:
            found = found.filter(pk__in=self.ids)
        if self.host:
            found = found.filter(host=self.host)
        if self.version:
            found = found.filter(app_version=self.version)
        if self.text:
            # search_text through its trigram index; rows stored before that column existed (NULL until beat fills
            # them in) by their error as before. On PostgreSQL the second arm reads the small partial index of those
            # rows, joined to the trigram index's (a BitmapOr), so it costs nothing once they are all filled in.
            pending = Q(search_text__isnull=True) & (
                Q(error_message__icontains=self.text) | Q(error_type__icontains=self.text)
            )
            found = found.filter(Q(search_text__contains=search_term(self.text)) | pending)
        if self.payload:
            # Bodies are bytes; search the UTF-8 form of the text. Fine for filters, slow on huge sets by nature.
            found = found.filter(BytesContains(F("body"), self.payload.encode()))
        return found


def broker_ids(names: list[str]) -> list[int]:
    """The ids of the brokers named; FilterError naming the known ones when a name is none of theirs."""
    found = dict(Broker.objects.filter(name__in=names).values_list("name", "pk"))
    unknown = [name for name in names if name not in found]
    if unknown:
        known = ", ".join(Broker.objects.values_list("name", flat=True)) or "none"
        raise FilterError(f"no broker named {unknown[0][:64]!r} (known: {known})")
    return list(found.values())


def _moment(value: str, *, name: str) -> dt.datetime:
    """`since` or `until` as a moment, or the filter's own error saying why it is none."""
    try:
        return parse_moment(value, name=name)
    except ValueError as problem:
        raise FilterError(str(problem)) from None
