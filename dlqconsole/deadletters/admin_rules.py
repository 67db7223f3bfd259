"""Admin for custom fingerprint rules. Imported by admin.py (which registers the rest of the app's admin).

Rules decide where dead letters of every queue are filed, so changing them is an admin's job; operators can
read them. Every save and delete goes through the services, which validate the expression, create the rule's
pattern and write the audit log.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from dlqconsole.accounts.admin import AuditedModelAdmin
from dlqconsole.accounts.roles import ADMIN, OPERATOR, has_role
from dlqconsole.deadletters.models import FingerprintRule
from dlqconsole.deadletters.rule_services import delete_fingerprint_rule, save_fingerprint_rule, validate_rule
from dlqconsole.deadletters.services import PatternError


class FingerprintRuleForm(forms.ModelForm[FingerprintRule]):
    class Meta:
        model = FingerprintRule
        fields = ["name", "regex", "header", "scope", "position", "enabled"]

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if any(name in self.errors for name in ("name", "regex", "header")):
            return cleaned  # a field already refused (too long, say): its value is not here to check further
        try:
            validate_rule(
                name=cleaned.get("name") or "",
                regex=cleaned.get("regex") or "",
                header=cleaned.get("header") or "",
                rule_id=self.instance.pk,
            )
        except PatternError as problem:
            raise forms.ValidationError(str(problem)) from None
        return cleaned


@admin.register(FingerprintRule)
class FingerprintRuleAdmin(AuditedModelAdmin[FingerprintRule]):
    # save_fingerprint_rule and delete_fingerprint_rule write the audit rows.
    writes_own_audit = True
    form = FingerprintRuleForm
    list_display = [
        "name",
        "regex",
        "header",
        "scope",
        "rule_pattern",
        "position",
        "enabled",
        "off_because",
        "updated_at",
    ]
    list_filter = ["enabled"]
    search_fields = ["name", "regex", "header"]
    raw_id_fields = ["scope"]
    readonly_fields = ["disabled_reason", "rule_pattern", "created_by", "created_at", "updated_at"]
    ordering = ["position", "id"]

    @admin.display(description="pattern")
    def rule_pattern(self, obj: FingerprintRule) -> str:
        if obj.pattern_id is None:
            return "-"
        url = reverse("admin:deadletters_failurepattern_change", args=[obj.pattern_id])
        return format_html('<a href="{}">#{}</a>', url, obj.pattern_id)

    @admin.display(description="disabled because")
    def off_because(self, obj: FingerprintRule) -> str:
        if obj.enabled or not obj.disabled_reason:
            return "-"
        return obj.disabled_reason[:140] + ("…" if len(obj.disabled_reason) > 140 else "")

    def has_view_permission(self, request: HttpRequest, obj: FingerprintRule | None = None) -> bool:
        return super().has_view_permission(request, obj) and has_role(request.user, OPERATOR)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return super().has_add_permission(request) and has_role(request.user, ADMIN)

    def has_change_permission(self, request: HttpRequest, obj: FingerprintRule | None = None) -> bool:
        return super().has_change_permission(request, obj) and has_role(request.user, ADMIN)

    def has_delete_permission(self, request: HttpRequest, obj: FingerprintRule | None = None) -> bool:
        return super().has_delete_permission(request, obj) and has_role(request.user, ADMIN)

    def save_model(self, request: HttpRequest, obj: FingerprintRule, form: Any, change: bool) -> None:
        save_fingerprint_rule(rule=obj, actor=request.user)

    def delete_model(self, request: HttpRequest, obj: FingerprintRule) -> None:
        delete_fingerprint_rule(rule=obj, actor=request.user)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[FingerprintRule]) -> None:
        for rule in queryset:
            delete_fingerprint_rule(rule=rule, actor=request.user)
