"""Brokers in the admin. Those of the environment (AMQP_URL as default, DLQ_BROKERS) are shown read-only; others are
added and edited here by admins. A URL's password is asked for and never shown back: the form's URL fields are
write-only (left empty, the stored URL stays), and the list, the change page, the audit rows and the logs only
ever see the URL without its password."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from dlqconsole.accounts.admin import AuditedModelAdmin
from dlqconsole.brokers import registry, secrets
from dlqconsole.brokers.models import Broker
from dlqconsole.brokers.services import BrokerError, set_urls
from dlqconsole.core.http import HttpError, check_target


class BrokerForm(forms.ModelForm[Broker]):
    amqp_url = forms.CharField(
        label="AMQP URL",
        required=False,
        max_length=2000,
        widget=forms.PasswordInput(attrs={"autocomplete": "off", "size": 80}),
        help_text=(
            "amqp://user:password@host:5672/vhost or amqps://...; the vhost is part of the broker. Stored encrypted "
            "(DLQ_CREDENTIALS_KEY) and never shown again: leave empty to keep the stored URL."
        ),
    )
    management_url = forms.CharField(
        label="Management API URL",
        required=False,
        max_length=2000,
        widget=forms.PasswordInput(attrs={"autocomplete": "off", "size": 80}),
        help_text=(
            "http(s)://user:password@host:15672/ for the plan's routing check; empty derives it from the AMQP URL, "
            '"off" skips the check. Leave empty to keep the stored one.'
        ),
    )

    class Meta:
        model = Broker
        fields = ["name", "amqp_url", "management_url", "tls_ca_certificate", "tls_verify", "enabled"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            # Beside the stored URLs (shown without their passwords): these replace them.
            self.fields["amqp_url"].label = "New AMQP URL"
            self.fields["management_url"].label = "New management API URL"

    def clean_management_url(self) -> str:
        value: str = self.cleaned_data.get("management_url", "").strip()
        if value and value.lower() != "off":
            if not value.startswith(("http://", "https://")):
                raise forms.ValidationError("The management API URL must start with http:// or https://.")
            try:
                check_target(value)
            except HttpError as error:
                raise forms.ValidationError(str(error)) from None
        return value

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        amqp_url = cleaned.get("amqp_url", "")
        if not amqp_url and not self.instance.url_secret:
            self.add_error("amqp_url", "This broker has no stored AMQP URL: give it one.")
        if (amqp_url or cleaned.get("management_url")) and not secrets.available():
            raise forms.ValidationError(
                "DLQ_CREDENTIALS_KEY is not set: broker credentials are stored encrypted with it. Set it in the "
                "environment of every console process, or name the broker in DLQ_BROKERS instead."
            )
        if amqp_url:
            try:
                set_urls(self.instance, amqp_url=amqp_url, api_url=cleaned.get("management_url") or None)
            except BrokerError as error:
                self.add_error("amqp_url", str(error))
        elif cleaned.get("management_url"):
            try:
                set_urls(self.instance, amqp_url=registry.amqp_url(self.instance), api_url=cleaned["management_url"])
            except (BrokerError, secrets.CredentialsError) as error:
                self.add_error("management_url", str(error))
        return cleaned


@admin.register(Broker)
class BrokerAdmin(AuditedModelAdmin[Broker]):
    form = BrokerForm
    list_display = ["name", "url", "api_url", "managed", "enabled", "updated_at"]
    list_filter = ["managed", "enabled"]
    search_fields = ["name", "url"]
    actions = ["check_connection"]
    readonly_fields = ["url", "api_url", "managed", "created_at", "updated_at"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Broker]:
        registry.sync_environment()
        return super().get_queryset(request)

    def get_fields(self, request: HttpRequest, obj: Broker | None = None) -> Any:
        if obj is not None and obj.managed:
            return ["name", "url", "api_url", "tls_ca_certificate", "tls_verify", "managed", "enabled"]
        shown = ["url", "api_url"] if obj is not None else []
        return ["name", *shown, "amqp_url", "management_url", "tls_ca_certificate", "tls_verify", "enabled"]

    def get_readonly_fields(self, request: HttpRequest, obj: Broker | None = None) -> list[str]:
        if obj is not None and obj.managed:
            return ["name", "url", "api_url", "tls_ca_certificate", "tls_verify", "managed", "enabled"]
        # A broker's name is in stored filters and audit rows: it is chosen once.
        return ["url", "api_url", "name"] if obj is not None else []

    def has_change_permission(self, request: HttpRequest, obj: Broker | None = None) -> bool:
        # The environment's brokers open read-only (their change page shows them; saving is refused).
        if obj is not None and obj.managed and request.method == "POST":
            return False
        return super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Broker | None = None) -> bool:
        if obj is not None and obj.managed:
            return False
        return super().has_delete_permission(request, obj)

    @admin.action(description="Check the connection to the selected brokers")
    def check_connection(self, request: HttpRequest, queryset: QuerySet[Broker]) -> None:
        for broker in queryset:
            try:
                registry.connect(broker, heartbeat=0).close()
            except secrets.CredentialsError as error:
                self.message_user(request, f"Broker {broker.name}: {error}", level=messages.ERROR)
            except Exception as error:  # noqa: BLE001  (any failure to connect is the answer)
                self.message_user(
                    request,
                    f"Broker {broker.name} ({broker.url}): cannot connect: {type(error).__name__} {str(error)[:200]}",
                    messages.ERROR,
                )
            else:
                self.message_user(request, f"Broker {broker.name} ({broker.url}): connected.", level=messages.SUCCESS)
