"""The forms of the app's pages: editing a dead letter's copy, and the triage posts of the patterns pages (status,
owner and note, merge, split). Each refuses a bad value with a sentence that says what is wrong, shown to the
operator as it is; the services behind them check again."""

from __future__ import annotations

import json
import re
from typing import Any

import pika.data
from django import forms
from django.conf import settings
from django.contrib.auth import get_user_model
from django.http import QueryDict

from dlqconsole.core import jsonsafe
from dlqconsole.core.amqp import is_death_header
from dlqconsole.core.publish import ENCODING_ERRORS
from dlqconsole.core.views import parse_id
from dlqconsole.deadletters.models import PatternStatus
from dlqconsole.deadletters.services import owner_refusal


def error_text(form: forms.Form) -> str:
    """Every error of an invalid form as one message for the page's flash list; each says what it is about."""
    return " ".join(str(message) for messages in form.errors.values() for message in messages)


# Edit and retry ------------------------------------------------------------------------------------------------

MAX_BODY_CHARACTERS = 5 * 1024 * 1024
# Room in a posted edit form for the headers and the other fields, besides the payload.
FORM_HEADROOM_BYTES = 256 * 1024


def editable_body_bytes() -> int:
    """The largest payload (UTF-8 bytes) offered for editing: one whose edited form the server will read back.
    The form is sent as multipart (no percent-encoding growth), and Django refuses form data above
    DATA_UPLOAD_MAX_MEMORY_SIZE before the view sees it; an edit that could not be sent must not be started."""
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    if limit is None:
        return MAX_BODY_CHARACTERS
    return max(0, min(MAX_BODY_CHARACTERS, limit - FORM_HEADROOM_BYTES))


class EditForm(forms.Form):
    """The edited copy of a dead letter: a UTF-8 payload and the headers as JSON (the tagged form of jsonsafe,
    so bytes, timestamps and decimals survive the round trip)."""

    body = forms.CharField(required=False, strip=False, widget=forms.Textarea(attrs={"rows": 16}))
    headers = forms.CharField(required=False, strip=False, widget=forms.Textarea(attrs={"rows": 10}))
    # One token per editing session: sending twice (a double click, a reload) sends one copy.
    submission = forms.RegexField(regex=r"^[0-9a-f]{32}$", widget=forms.HiddenInput)

    def clean_body(self) -> str:
        body = self.cleaned_data["body"].replace("\r\n", "\n")
        if len(body) > MAX_BODY_CHARACTERS:
            raise forms.ValidationError("The payload is too large to edit here.")
        return body

    def clean_headers(self) -> dict[str, Any]:
        text = self.cleaned_data["headers"].strip() or "{}"
        try:
            headers = json.loads(text)
        except ValueError as error:
            raise forms.ValidationError(f"Headers must be a JSON object: {error}") from None
        except RecursionError:
            raise forms.ValidationError("Headers must be a JSON object nested less deeply.") from None
        if not isinstance(headers, dict):
            raise forms.ValidationError("Headers must be a JSON object.")
        if any(is_death_header(name) for name in headers):
            raise forms.ValidationError("Death headers are stripped on replay; leave them out.")
        try:
            decoded = jsonsafe.decode(headers)
        except (ValueError, TypeError) as error:
            raise forms.ValidationError(f"A tagged value could not be read: {error}") from None
        for name, value in decoded.items():
            # What the publisher would meet only when sending: refuse it here, with the header's name.
            try:
                pika.data.encode_table([], {str(name): value})
            except ENCODING_ERRORS:
                raise forms.ValidationError(
                    f"Header {str(name)[:100]!r} cannot be sent over AMQP: integers must fit in 64 bits, numbers "
                    "must be finite (no Infinity or NaN), and names at most 255 bytes."
                ) from None
        return headers


# Triage --------------------------------------------------------------------------------------------------------

STATUSES = ", ".join(PatternStatus.values[:-1]) + " or " + PatternStatus.values[-1]


class PatternStatusForm(forms.Form):
    """A triage button: the status to set, and which part of the page an htmx answer replaces (the table's row by
    default, or the pattern page's summary card)."""

    status = forms.ChoiceField(
        choices=PatternStatus.choices,
        error_messages={
            "required": f"Choose a status: {STATUSES}.",
            "invalid_choice": f"“%(value)s” is not a pattern status; choose one of {STATUSES}.",
        },
    )
    fragment = forms.ChoiceField(
        choices=[("row", "row"), ("summary", "summary")],
        required=False,
        error_messages={"invalid_choice": "“%(value)s” is not a part of the page: row or summary."},
    )


class PatternAssignForm(forms.Form):
    """A pattern's owner and note as the pattern page posts them: `owner` is a user's number, or "" for nobody (an
    older form sent a tick box `take`, "I own this", instead). A note left out stays as it is."""

    owner = forms.CharField(
        required=False, error_messages={"null_characters_not_allowed": "Choose the owner from the list."}
    )
    take = forms.BooleanField(required=False)
    note = forms.CharField(
        required=False,
        strip=False,
        error_messages={"null_characters_not_allowed": "The note cannot hold a NUL character."},
    )

    def __init__(self, data: QueryDict, *, user: Any) -> None:
        super().__init__(data)
        self.user = user

    def clean_owner(self) -> Any:
        chosen = self.cleaned_data["owner"]
        if not chosen:
            return None
        owner_id = parse_id(chosen)
        if owner_id is None:
            raise forms.ValidationError(f"“{chosen[:40]}” is not a user's number; choose the owner from the list.")
        owner = get_user_model().objects.filter(pk=owner_id).first()
        if owner is None:
            raise forms.ValidationError("That user does not exist.")
        refusal = owner_refusal(owner)
        if refusal:
            raise forms.ValidationError(refusal)
        return owner

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if "owner" not in self.data:
            # Neither an owner nor the tick box: saving would silently make nobody the owner.
            if "take" not in self.data:
                raise forms.ValidationError("Choose the owner (or nobody).")
            cleaned["owner"] = self.user if cleaned.get("take") else None
        if "note" not in self.data:
            cleaned["note"] = None
        return cleaned


def pattern_numbers(values: list[str]) -> set[int]:
    """Pattern numbers typed or ticked ('12, #15 31'); ValidationError naming the first token that is not one."""
    numbers = set()
    for value in values:
        for token in re.split(r"[\s,;]+", value.strip()):
            token = token.lstrip("#")
            if not token:
                continue
            # A pattern id is a bigint: more digits than that is no pattern (and no database query).
            if not (token.isascii() and token.isdigit()) or len(token) > 18:
                raise forms.ValidationError(f"“{token[:40]}” is not a pattern number; nothing was merged.")
            numbers.add(int(token))
    return numbers


class PatternNumbersField(forms.Field):
    """The pattern numbers of every value posted under the field's name (ticked boxes, a typed list): a set."""

    def to_python(self, value: Any) -> set[int]:
        return pattern_numbers(value if isinstance(value, list) else [value or ""])


class PatternMergeForm(forms.Form):
    """A merge as the patterns pages post it: the patterns ticked or typed, the target typed or chosen (none: the
    busiest ticked one), the target the preview was made for, and whether to preview or merge."""

    sources = PatternNumbersField(required=False, widget=forms.MultipleHiddenInput)
    target = PatternNumbersField(required=False)
    previewed = forms.CharField(required=False)
    action = forms.ChoiceField(
        choices=[("preview", "Preview"), ("merge", "Merge")],
        required=False,
        error_messages={"invalid_choice": "“%(value)s” is not something a merge does: preview or merge."},
    )

    def clean_target(self) -> int | None:
        typed: set[int] = self.cleaned_data["target"]
        if len(typed) > 1:
            raise forms.ValidationError("Merge into one pattern: type a single pattern number as the target.")
        return next(iter(typed), None)

    def clean_previewed(self) -> int | None:
        value = self.cleaned_data["previewed"]
        if not value:
            return None
        number = parse_id(value)
        if number is None:
            raise forms.ValidationError(f"“{value[:40]}” is not a pattern number; preview the merge again.")
        return number


class PatternSplitForm(forms.Form):
    """A split rule as the pattern page's split card posts it, and whether to preview it or split. The rule
    services check the rule itself (rule_services.validate_rule)."""

    name = forms.CharField(
        error_messages={
            "required": "Give the rule a name; it becomes the template of its pattern.",
            "null_characters_not_allowed": "A rule's name cannot hold a NUL character.",
        }
    )
    regex = forms.CharField(
        required=False,
        strip=False,
        error_messages={"null_characters_not_allowed": "A rule cannot hold a NUL character."},
    )
    header = forms.CharField(
        required=False, error_messages={"null_characters_not_allowed": "A rule cannot hold a NUL character."}
    )
    action = forms.ChoiceField(
        choices=[("preview", "Preview"), ("split", "Split")],
        required=False,
        error_messages={"invalid_choice": "“%(value)s” is not something a split does: preview or split."},
    )
