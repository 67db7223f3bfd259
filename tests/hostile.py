"""Hostile message bodies: what anyone with publish rights can put in a dead-letter queue, to break a page or a
process that reads it. Shared by the ingest test (every one is stored, nothing left in the queue) and the page
tests (every one opens its message page and its admin page, each under 5 MB)."""

from __future__ import annotations

import gzip
import hashlib
from dataclasses import dataclass


@dataclass(frozen=True)
class HostileBody:
    name: str
    body: bytes
    content_type: str = "application/json"
    content_encoding: str = ""


def _twenty_megabytes() -> bytes:
    return hashlib.sha256(b"hostile").digest() * (20 * 1024 * 1024 // 32)


HOSTILE_BODIES: tuple[HostileBody, ...] = (
    # json.dumps recurses per level: 1,200 levels pass json.loads (C) and overflow the pretty-printer on 3.12.
    HostileBody("nested-1200", b"[" * 1200 + b"]" * 1200),
    HostileBody("nested-10000", b"[" * 10_000 + b"]" * 10_000),
    # 64 KB that pretty-prints to tens of megabytes: every element indented 900 levels deep.
    HostileBody("indent-bomb-64k", b"[" * 900 + b"0," * 31_000 + b"0" + b"]" * 900),
    # 12 KB of 2,000 nested objects: megabytes of indentation.
    HostileBody("nested-objects-12k", b'{"a":' * 2000 + b"1" + b"}" * 2000),
    HostileBody("twenty-megabytes", _twenty_megabytes(), "application/octet-stream"),
    HostileBody("binary", bytes(range(256)) * 64, "application/octet-stream"),
    HostileBody("invalid-utf8", b'{"name": "caf\xc3\x28 \xff\xfe bad"}', "text/plain"),
    HostileBody("nul", b'{"note": "before\x00after"}\x00trailing', "application/json"),
    HostileBody("mixed-line-endings", b"line one\r\nline two\nline three\rline four\r\n", "text/plain"),
    HostileBody("markup", b'<script>alert(1)</script><img src=x onerror=alert(2)>{{ 7*7 }}{% now "Y" %}', "text/html"),
    HostileBody("right-to-left-override", "invoice \u202egnp.exe\u202c total".encode(), "text/plain"),
    HostileBody("long-line", b"x" * 600_000, "text/plain"),
    HostileBody("many-lines", b"\n" * 400_000, "text/plain"),
    HostileBody("wide-json-object", b"{" + b",".join(b'"k%d":%d' % (i, i) for i in range(40_000)) + b"}"),
    HostileBody("json-long-string", b'{"s": "' + b"\\u0041" * 200_000 + b'"}'),
    # 50 MB of JSON in 50 KB of gzip: a page that inflates it whole holds 50 MB.
    HostileBody("gzip-bomb", gzip.compress(b"[" + b"0," * (25 * 1024 * 1024) + b"0]", 9), "application/json", "gzip"),
    HostileBody("lone-surrogates", b'{"s": "\\ud800\\udfff\\ud800"}'),
    HostileBody("huge-number", b"[" + b"9" * 100_000 + b"]"),
    HostileBody("empty", b"", "application/json"),
    HostileBody("whitespace-only", b" \t\r\n" * 1000, "text/plain"),
)
