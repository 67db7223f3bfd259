"""Admin for dead letters and patterns: read-mostly, and fast on a table of millions of dead letters.

The changelist never counts the whole table: no full result count, no facet counts, a paginator that counts at
most CountCappedPaginator.cap rows, filters whose choices come from small tables (watched queues, recent
patterns) or from field choices, and an ingested-date filter with fixed ranges instead of a date hierarchy
(Django's hierarchy runs SELECT DISTINCT over every row to draw its years and months). Dead letters are never
added, changed or deleted here: they enter through ingest and leave through operations, which keep the
counters and the audit log. Pattern triage writes go through dlqconsole.deadletters.services.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, ClassVar
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin.options import ShowFacets
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.db.models import Q, QuerySet
from django.forms import ModelChoiceField, ModelForm
from django.http import HttpRequest
from django.urls import reverse
from django.utils.functional import cached_property
from django.utils.html import format_html
from django.utils.text import Truncator

from dlqconsole.accounts.admin import AuditedModelAdmin
from dlqconsole.accounts.roles import ADMIN, OPERATOR, has_role
from dlqconsole.deadletters import admin_rules  # noqa: F401  (registers the FingerprintRule admin)
from dlqconsole.deadletters.models import DeadLetter, DeadLetterCount, FailurePattern, PatternEvent
from dlqconsole.deadletters.payload import show_body, show_json
from dlqconsole.deadletters.services import PatternError, assign_pattern, set_pattern_status


class CountCappedPaginator(Paginator):
    """Counts at most `cap` + 1 rows (SELECT COUNT(*) FROM (SELECT ... LIMIT cap + 1)), so the cost of a page
    does not grow with the table. Past the cap the page links stop there and the list says "more than"."""

    cap = 10_000

    @cached_property
    def count(self) -> int:
        object_list: Any = self.object_list
        return int(object_list[: self.cap + 1].count())

    @property
    def capped(self) -> bool:
        return self.count > self.cap


class SourceQueueFilter(admin.SimpleListFilter):
    title = "queue"
    parameter_name = "queue"
    # More queue names to offer, each read from a small table: ingest adds its watched DLQs when its admin loads
    # (ingest/admin.py), so that one holding no dead letter yet is offered too. This app cannot import ingest.
    more_names: ClassVar[list[Callable[[], Iterable[str]]]] = []

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        # The watched DLQs and the counter table are small; a DISTINCT over the dead letters is not.
        names = set(DeadLetterCount.objects.values_list("source_queue", flat=True).distinct())
        for more in self.more_names:
            names.update(more())
        return [(name, name) for name in sorted(names)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(source_queue=value) if value else queryset


class PatternFilter(admin.SimpleListFilter):
    """Offers the most recently seen patterns; any pattern id works in the URL (links from the pattern admin)."""

    title = "pattern"
    parameter_name = "pattern"
    choices_shown = 30

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        recent = FailurePattern.objects.active().order_by("-last_seen_at").only("pk", "template")
        choices = [(str(pattern.pk), Truncator(pattern.template).chars(80)) for pattern in recent[: self.choices_shown]]
        chosen = self.value()
        if chosen and chosen not in {value for value, _ in choices} and chosen.isdigit():
            pattern = FailurePattern.objects.filter(pk=int(chosen)).only("template").first()
            if pattern is not None:
                choices.insert(0, (chosen, Truncator(pattern.template).chars(80)))
        return choices

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if not value:
            return queryset
        return queryset.filter(pattern_id=int(value)) if value.isdigit() else queryset.none()


def pretty_json(value: Any, *, record_url: str) -> str:
    """Stored JSON (headers, properties, x-death in core.jsonsafe's tagged form) as escaped text: laid out with
    indentation, or on one line and cut when that would be too deep or too large (payload.show_json), saying so
    with a link to the whole record."""
    shown = show_json(value)
    if not shown.cut:
        return format_html('<pre class="dlq-raw">{}</pre>', shown.text)
    return format_html(
        '<p class="dlq-raw-cut">{} (<a href="{}">download the whole record</a>)</p><pre class="dlq-raw">{}</pre>',
        shown.cut,
        record_url,
        shown.text,
    )


def record_url(obj: DeadLetter) -> str:
    """The console's export of this one dead letter as JSON lines: every header and the whole body."""
    query = urlencode({"ids": obj.pk, "status": obj.status, "format": "jsonl"})
    return f"{reverse('deadletters:export')}?{query}"


DEAD_LETTER_FIELDS: list[tuple[str | None, list[str]]] = [
    (
        None,
        [
            "source_queue",
            "status",
            "status_changed_at",
            "pattern",
            "fingerprint",
            "failure_reason",
            "transient",
            "death_reason",
            "attempt_count",
            "replay_count",
            "next_retry_at",
            "retry_exhausted",
        ],
    ),
    (
        "Origin",
        [
            "original_queue",
            "original_exchange",
            "original_routing_keys",
            "first_failed_at",
            "last_failed_at",
            "ingested_at",
            "host",
            "app_version",
            "task_name",
            "task_id",
            "task_retries",
            "previous",
            "edited_from",
        ],
    ),
    ("Error", ["error_type", "error_message", "stack_trace_text"]),
    (
        "Message",
        [
            "message_id",
            "correlation_id",
            "priority",
            "content_type",
            "content_encoding",
            "body_size",
            "payload",
            "headers_json",
            "properties_json",
            "x_death_json",
            "parse_errors_json",
            "dedupe_key",
        ],
    ),
]


@admin.register(DeadLetter)
class DeadLetterAdmin(AuditedModelAdmin[DeadLetter]):
    list_display = [
        "id",
        "broker",
        "source_queue",
        "failure_reason",
        "death_reason",
        "pattern_template",
        "status",
        "error",
        "ingested_at",
    ]
    list_display_links = ["id"]
    list_filter = [
        "broker",
        SourceQueueFilter,
        "failure_reason",
        "death_reason",
        PatternFilter,
        "status",
        "transient",
        ("ingested_at", admin.DateFieldListFilter),
    ]
    # Only declares that the list has a search box; get_search_results decides how to search.
    search_fields = ["message_id", "correlation_id", "task_id", "error_message"]
    search_help_text = "An exact message id, correlation id or task id; otherwise words of the error message."
    list_select_related = ["pattern", "broker"]
    ordering = ["-id"]
    sortable_by = ["id", "ingested_at"]
    list_per_page = 100
    paginator = CountCappedPaginator
    show_full_result_count = False
    show_facets = ShowFacets.NEVER
    raw_id_fields = ["pattern", "previous", "edited_from"]
    # Bulk actions on dead letters (retry, move, archive, ...) are operations: the operations app adds them here
    # when its admin loads (operations/admin.py), since this app cannot import it. Each must go through a service
    # that keeps the counters and writes the audit log. Django's delete_selected is not offered (see
    # has_delete_permission).
    actions: list[Any] = []
    fieldsets = [(title, {"fields": tuple(fields)}) for title, fields in DEAD_LETTER_FIELDS]
    # Every field shown is read-only, the raw ones (headers, properties, x-death, body) included.
    readonly_fields = [name for _, fields in DEAD_LETTER_FIELDS for name in fields]

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        """The actions without those the user's role may not use (an action names the role it needs in
        `required_role`): controls a user may not use are not shown, as on the console's pages (a viewer sees
        none, an operator no purge). The server checks the role again when an action runs."""
        actions: dict[str, Any] = super().get_actions(request)
        return {
            name: entry
            for name, entry in actions.items()
            if (role := getattr(entry[0], "required_role", None)) is None or has_role(request.user, role)
        }

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[DeadLetter], search_term: str
    ) -> tuple[QuerySet[DeadLetter], bool]:
        """An id first, exactly and case-sensitively (the message id uses its index); Django's default would OR
        a case-insensitive match of every field with a substring search of the error text, a full scan of the
        table for every search. Only when no id matches is the term looked up in the error messages."""
        term = search_term.strip()
        if not term:
            return queryset, False
        if " " not in term:
            # One field at a time: an OR across them cannot use the message id index.
            for field in ("message_id", "correlation_id", "task_id"):
                by_id = queryset.filter(**{field: term})
                if by_id.exists():
                    return by_id, False
        return queryset.filter(error_message__icontains=term), False

    @admin.display(description="pattern")
    def pattern_template(self, obj: DeadLetter) -> str:
        return Truncator(obj.pattern.template).chars(60)

    @admin.display(description="error")
    def error(self, obj: DeadLetter) -> str:
        text = f"{obj.error_type}: {obj.error_message}" if obj.error_type else obj.error_message
        return Truncator(text).chars(80)

    @admin.display(description="stack trace")
    def stack_trace_text(self, obj: DeadLetter) -> str:
        return format_html('<pre class="dlq-raw">{}</pre>', obj.stack_trace) if obj.stack_trace else "-"

    @admin.display(description="payload")
    def payload(self, obj: DeadLetter) -> str:
        # show_body returns plain text (laid-out JSON, text or a hex dump), bounded in size, with a description of
        # what it shows and what it left out; format_html escapes it, so a payload is never rendered as markup.
        shown = show_body(body=bytes(obj.body), content_type=obj.content_type, content_encoding=obj.content_encoding)
        return format_html(
            '<p class="dlq-payload-kind">{} (<a href="{}">download raw</a>)</p>'
            '<pre class="dlq-payload dlq-payload-{}">{}</pre>',
            shown.description,
            reverse("deadletters:message-body", args=[obj.pk]),
            shown.kind,
            shown.text,
        )

    @admin.display(description="headers")
    def headers_json(self, obj: DeadLetter) -> str:
        return pretty_json(obj.headers, record_url=record_url(obj))

    @admin.display(description="properties")
    def properties_json(self, obj: DeadLetter) -> str:
        return pretty_json(obj.properties, record_url=record_url(obj))

    @admin.display(description="x-death")
    def x_death_json(self, obj: DeadLetter) -> str:
        return pretty_json(obj.x_death, record_url=record_url(obj))

    @admin.display(description="parse errors")
    def parse_errors_json(self, obj: DeadLetter) -> str:
        return pretty_json(obj.parse_errors, record_url=record_url(obj)) if obj.parse_errors else "-"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    # Read-only: the change page is a view page. Status changes are operations (counters, audit, broker).
    def has_change_permission(self, request: HttpRequest, obj: DeadLetter | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: DeadLetter | None = None) -> bool:
        return False


class FailurePatternForm(ModelForm[FailurePattern]):
    class Meta:
        model = FailurePattern
        fields = ["status", "owner", "note"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Who may own a pattern, as on its console page: active operators and admins (and whoever owns it now). A
        # plain select, not an autocomplete: that asks the user admin, which only admins may read.
        # A user who may not change the pattern (a viewer) gets the form without fields: the admin shows every
        # field read-only, so there is no owner choice to narrow.
        owner = self.fields.get("owner")
        if owner is None:
            return
        assert isinstance(owner, ModelChoiceField)
        may_own = Q(is_superuser=True) | Q(groups__name__in=[OPERATOR, ADMIN]) | Q(pk=self.instance.owner_id)
        owner.queryset = get_user_model().objects.filter(may_own, is_active=True).distinct().order_by("username")

    def clean(self) -> dict[str, Any]:
        # What the triage services would refuse is refused here, as a form error: refused after the form passed,
        # the page showed the refusal beside Django's "changed successfully".
        data = super().clean() or {}
        if self.instance.merged_into_id is not None and self.changed_data:
            raise ValidationError(
                f"Pattern #{self.instance.pk} was merged into #{self.instance.merged_into_id}; triage that one."
            )
        return data


@admin.register(FailurePattern)
class FailurePatternAdmin(AuditedModelAdmin[FailurePattern]):
    # Triage (status, owner, note) is an operator's, as on the pattern pages.
    write_role = OPERATOR
    # Triage goes through the services in save_model, which write the audit rows (and patterns are never deleted).
    writes_own_audit = True
    form = FailurePatternForm
    list_display = [
        "id",
        "short_template",
        "error_type",
        "failure_reason",
        "status",
        "owner",
        "total_count",
        "first_seen_at",
        "last_seen_at",
    ]
    list_filter = ["status", "failure_reason", "transient", ("last_seen_at", admin.DateFieldListFilter)]
    search_fields = ["template", "error_type", "=key", "note"]
    list_select_related = ["owner"]
    ordering = ["-last_seen_at"]
    fields = [
        "template",
        "error_type",
        "failure_reason",
        "transient",
        "key",
        "status",
        "status_changed_at",
        "owner",
        "note",
        "total_count",
        "first_seen_at",
        "last_seen_at",
        "merged_into",
        "dead_letters",
    ]
    readonly_fields = [
        "template",
        "error_type",
        "failure_reason",
        "transient",
        "key",
        "status_changed_at",
        "total_count",
        "first_seen_at",
        "last_seen_at",
        "merged_into",
        "dead_letters",
    ]

    @admin.display(description="template")
    def short_template(self, obj: FailurePattern) -> str:
        return Truncator(obj.template).chars(100)

    @admin.display(description="dead letters")
    def dead_letters(self, obj: FailurePattern) -> str:
        # From the counters, never COUNT(*) over the dead letters.
        cells = DeadLetterCount.objects.filter(pattern=obj, count__gt=0).order_by("source_queue", "status")
        summary = ", ".join(f"{cell.source_queue} {cell.status}: {cell.count:,}" for cell in cells) or "none"
        url = reverse("admin:deadletters_deadletter_changelist") + f"?pattern={obj.pk}"
        return format_html('{} (<a href="{}">list</a>)', summary, url)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: FailurePattern | None = None) -> bool:
        # Dead letters point at their pattern (PROTECT); patterns are merged, never deleted.
        return False

    def has_change_permission(self, request: HttpRequest, obj: FailurePattern | None = None) -> bool:
        # Triage is an operator's job, as on the console's own pages.
        return super().has_change_permission(request, obj) and has_role(request.user, OPERATOR)

    def save_model(self, request: HttpRequest, obj: FailurePattern, form: Any, change: bool) -> None:
        """Never save the row directly: status, owner and note changes go through the triage services, which
        write the PatternEvent history and the audit log."""
        stored = FailurePattern.objects.get(pk=obj.pk)
        try:
            if "status" in form.changed_data:
                set_pattern_status(pattern=stored, status=obj.status, actor=request.user)
                stored.refresh_from_db()
            if "owner" in form.changed_data or "note" in form.changed_data:
                assign_pattern(pattern=stored, owner=obj.owner, note=obj.note, actor=request.user)
        except PatternError as problem:
            self.message_user(request, str(problem), level=messages.ERROR)


@admin.register(DeadLetterCount)
class DeadLetterCountAdmin(AuditedModelAdmin[DeadLetterCount]):
    list_display = ["source_queue", "broker", "status", "failure_reason", "pattern", "count"]
    list_filter = ["broker", "status", "failure_reason", "source_queue"]
    search_fields = ["source_queue", "pattern__template"]
    list_select_related = ["pattern", "broker"]
    ordering = ["source_queue", "status", "-count"]

    # Kept exact by ingest and operations; an edit here would make every page and alert wrong.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: DeadLetterCount | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: DeadLetterCount | None = None) -> bool:
        return False


@admin.register(PatternEvent)
class PatternEventAdmin(AuditedModelAdmin[PatternEvent]):
    list_display = ["created_at", "pattern", "kind", "from_status", "to_status", "actor", "detail"]
    list_filter = ["kind", ("created_at", admin.DateFieldListFilter)]
    search_fields = ["detail", "pattern__template"]
    list_select_related = ["pattern", "actor"]
    raw_id_fields = ["pattern", "actor"]

    # History is append-only.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: PatternEvent | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: PatternEvent | None = None) -> bool:
        return False
