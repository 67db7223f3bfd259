"""The Content Security Policy: every response forbids scripts from anywhere but our own static files, and no page
(ours or the admin's) relies on inline script, inline event handlers or htmx expressions evaluated as JavaScript,
which the policy would block."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client

from tests.factories import EnvelopeFactory, store

pytestmark = [pytest.mark.django_db]

TEMPLATES = Path(__file__).resolve().parents[1] / "templates"


class InlineCode(HTMLParser):
    """Real tags only (escaped text that reads like a tag is text): inline scripts, on* handler attributes and
    javascript: URLs."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "script" and not values.get("src") and values.get("type") != "application/json":
            self.found.append("<script>")
        for name, value in attrs:
            if name.startswith("on"):
                self.found.append(f"{tag} {name}")
            # htmx evaluates these as JavaScript, which the policy refuses (no 'unsafe-eval').
            elif evaluated(name, value or ""):
                self.found.append(f"{tag} {name} (eval)")
            elif name in ("href", "src", "action") and (value or "").strip().lower().startswith("javascript:"):
                self.found.append(f"{tag} {name}=javascript:")


def evaluated(name: str, value: str) -> bool:
    if name.startswith(("hx-on", "data-hx-on")):
        return True
    if name == "hx-trigger":
        return "[" in value
    return name in ("hx-vals", "hx-vars") and value.strip().startswith("js:")


def inline_code(html: str) -> list[str]:
    parser = InlineCode()
    parser.feed(html)
    parser.close()
    return parser.found


def test_every_response_carries_the_policy(client: Client) -> None:
    policy = client.get("/login/")["Content-Security-Policy"]

    directives = dict(part.strip().split(" ", 1) for part in policy.split(";") if part.strip())
    assert directives["script-src"] == "'self'"
    assert directives["object-src"] == "'none'" and directives["base-uri"] == "'none'"
    assert directives["frame-ancestors"] == "'none'"


def test_our_templates_hold_no_inline_script() -> None:
    found = {
        str(path.relative_to(TEMPLATES)): inline_code(path.read_text())
        for path in TEMPLATES.rglob("*.html")
        if inline_code(path.read_text())
    }
    assert found == {}


def test_the_scan_finds_inline_script() -> None:
    assert inline_code('<form onsubmit="return confirm(1)"><script>x()</script><a href="javascript:y()">') == [
        "form onsubmit",
        "<script>",
        "a href=javascript:",
    ]
    assert inline_code("<pre>&lt;img src=x onerror=alert(1)&gt;</pre>") == []
    assert inline_code('<form hx-trigger="change[target.value]"><div hx-on:click="x()">') == [
        "form hx-trigger (eval)",
        "div hx-on:click (eval)",
    ]
    assert inline_code('<script src="/static/a.js" defer></script><script type="application/json">{}</script>') == []


def test_rendered_pages_and_admin_pages_hold_no_inline_script() -> None:
    (stored,) = store(EnvelopeFactory.build(error='<img src=x onerror="alert(1)">', body=b"<script>alert(2)</script>"))
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw-root"))
    paths = [
        "/",
        "/patterns/",
        f"/patterns/{stored.pattern_id}/",
        "/messages/",
        f"/messages/{stored.pk}/",
        f"/messages/{stored.pk}/edit/",
        "/operations/",
        "/alerts/",
        "/alerts/rules/",
        "/alerts/channels/",
        "/admin/",
        "/admin/deadletters/deadletter/",
        f"/admin/deadletters/deadletter/{stored.pk}/change/",
        "/admin/deadletters/failurepattern/",
        "/admin/operations/operation/",
        "/admin/accounts/auditentry/",
    ]
    found = {}
    for path in paths:
        response = client.get(path)
        assert response.status_code == 200, path
        if code := inline_code(response.content.decode()):
            found[path] = code
    assert found == {}
