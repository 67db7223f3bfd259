from __future__ import annotations

import json
from typing import Any

import pika.data
from django import forms
from django.conf import settings

from dlqconsole.core import jsonsafe
from dlqconsole.core.amqp import is_death_header
from dlqconsole.core.publish import ENCODING_ERRORS

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
