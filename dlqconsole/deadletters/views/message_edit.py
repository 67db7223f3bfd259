"""Edit and retry: a copy of a dead letter's payload and headers edited in a form, its diff, and its sending (the
original is kept and linked)."""

from __future__ import annotations

import json
from typing import Any
from uuid import uuid4

from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods

from dlqconsole.accounts.roles import OPERATOR, require_role
from dlqconsole.core import jsonsafe
from dlqconsole.core.views import HtmxHttpRequest
from dlqconsole.deadletters import replays
from dlqconsole.deadletters.forms import EditForm, editable_body_bytes
from dlqconsole.deadletters.models import DeadLetter
from dlqconsole.deadletters.payload import (
    body_as_text,
    error_header_names,
    form_size_problem,
    headers_as_json,
    text_problem,
    unified_diff,
    with_line_endings_of,
)


@require_http_methods(["GET", "POST"])
def message_edit(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """Edit a copy of the payload and headers, see the diff, send it; the original is kept and linked."""
    require_role(request.user, OPERATOR)
    dead_letter = get_object_or_404(DeadLetter.objects.select_related("pattern"), pk=pk)
    raw = bytes(dead_letter.body)
    limit = editable_body_bytes()
    problem = not_editable(dead_letter)
    original_body = body_as_text(raw) if not problem else None
    original_headers = headers_as_json(dead_letter.headers)
    context: dict[str, Any] = {
        "letter": dead_letter,
        "editable": original_body is not None,
        "limit": limit,
        "not_editable": problem,
    }
    if len(raw) > limit:
        context["too_large"] = len(raw)
    elif problem and not text_problem(raw):
        context["too_large_for_page"] = True
    initial_headers = headers_as_json(dead_letter.headers, leave_out=error_header_names())
    form = EditForm(initial={"body": original_body or "", "headers": initial_headers, "submission": uuid4().hex})
    if request.method == "POST" and original_body is not None:
        # An edit grown past DATA_UPLOAD_MAX_MEMORY_SIZE never gets here: the CSRF check reads the form first and
        # Django answers 400. The form's data-max-bytes stops such a send in the browser, saying why.
        form = EditForm(request.POST)
    context["form"] = form
    if request.method == "GET" or original_body is None:
        return render(request, "deadletters/message_edit.html", context)
    if not form.is_valid():
        return render(request, "deadletters/message_edit.html", context, status=400)
    body = with_line_endings_of(original_body, form.cleaned_data["body"])
    headers: dict[str, Any] = form.cleaned_data["headers"]
    context["json_problem"] = _json_problem(body, content_type=dead_letter.content_type)
    context["body_diff"] = unified_diff(original_body, body, name="payload")
    context["headers_diff"] = unified_diff(original_headers, headers_as_json(headers), name="headers")
    context["unchanged"] = not context["body_diff"] and not context["headers_diff"]
    if request.POST.get("action") != "send":
        return render(request, "deadletters/message_edit.html", context)
    try:
        sent_by = replays.registered().send_edited(
            dead_letter=dead_letter,
            body=body.encode("utf-8"),
            headers=jsonsafe.decode(headers),
            actor=request.user,
            submission=form.cleaned_data["submission"],
        )
    except replays.ReplayRefused as problem:
        form.add_error(None, str(problem))
        return render(request, "deadletters/message_edit.html", context, status=400)
    messages.success(request, "The edited copy was sent; the original is archived (restorable from its page).")
    return redirect(sent_by)


def _json_problem(body: str, *, content_type: str) -> str:
    """Why an edited payload is not JSON although its content type says it is ("" when it is, or when the message
    is not JSON): shown as a warning beside the diff, not a refusal, since the operator may mean it."""
    if "json" not in content_type.lower() or not body.strip():
        return ""
    try:
        json.loads(body)
    except json.JSONDecodeError as error:
        return f"line {error.lineno}, column {error.colno}: {error.msg}"
    except RecursionError:
        return "nested too deeply to read"
    return ""


def not_editable(dead_letter: DeadLetter) -> str:
    """Why the edit form cannot take this dead letter ("" when it can), so that the page says so instead of
    offering an Edit and retry that only leads to a refusal (the edit view refuses the same cases)."""
    body = bytes(dead_letter.body)
    if len(body) > editable_body_bytes():
        return "the payload is too large to edit in a form"
    problem = text_problem(body)
    if problem:
        return problem
    return form_size_problem(
        body=body.decode("utf-8"), headers=headers_as_json(dead_letter.headers, leave_out=error_header_names())
    )
