"""Fingerprints: a deterministic key for one failure, and the masked tokens that template mining compares.

Two kinds:
- a *text* fingerprint: the error message with its variable parts masked (`<NUM>`, `<IP>`, `<UUID>`, ...),
  cut into tokens; its key hashes (error type, template);
- a *trace* fingerprint, when a stack trace is present: the exception type plus the innermost frames of the
  application's own code (see `stacktrace`) as one token, then the masked first line of the message, which
  mining treats like text within the traces of that type and frames (`trace_scope`).

The key depends only on the text, never on process state, so every process and every restart computes the same
key for the same failure. `masking` cuts a message into masked tokens (shapes that vary in any system: numbers,
ids, addresses, times); words that vary are left to `grouping.mining`. This module also reads an error type off
the front of a message. docs/grouping.md, "Masking", has the details.
"""

from __future__ import annotations

import hashlib
import re
from typing import NamedTuple

from dlqconsole.deadletters import masking, stacktrace
from dlqconsole.deadletters.masking import WILDCARD, tokenize, tokenize_joined

# Whole answers by (error type, message, stack trace, fallback); smaller, since its keys can be long.
_FINGERPRINT_CACHE: dict[tuple[str, str, str, str], Fingerprint] = {}
FINGERPRINT_CACHE_SIZE = 20000
# Keys by (error type, template): most messages repeat a template, and a lookup is cheaper than a hash.
_KEY_CACHE: dict[tuple[str, str], str] = {}
# Trace scopes and the heads of trace templates by (error type, *frames): one place raises many traces.
_SCOPE_CACHE: dict[tuple[str, ...], str] = {}
_HEAD_CACHE: dict[tuple[str, ...], str] = {}


class Fingerprint(NamedTuple):
    # A named tuple rather than a frozen dataclass: one is made for every new text, and a tuple is made in a
    # fraction of the time.
    key: str
    template: str
    error_type: str
    # Masked tokens (what mining compares): of the message, after the type and frames for a trace fingerprint.
    tokens: tuple[str, ...] = ()
    kind: str = "text"
    # What sets a trace fingerprint's cluster apart (its type and frames, `trace_scope`); "" for text.
    scope: str = ""


# Keys whose value names what failed, not data: the host that refused, the table or constraint that said no
# (grouping.mining never lets their values vary). The value of any other key ("tag=View Lock", "name=android") is
# data, like a number.
DEPENDENCY_KEYS = frozenset(
    [
        "host",
        "hostname",
        "server",
        "addr",
        "address",
        "endpoint",
        "url",
        "uri",
        "service",
        "database",
        "db",
        "dsn",
        "port",
        "table",
        "constraint",
        "index",
    ]
)
TRACE_PREFIX = "trace "


def trace_scope(error_type: str, frames: tuple[str, ...] | list[str]) -> str:
    """A digest of a stack trace's type and frames: the traces whose messages are mined together."""
    cache_key = (error_type, *frames)
    scope = _SCOPE_CACHE.get(cache_key)
    if scope is None:
        text = "\x00".join(cache_key)
        scope = TRACE_PREFIX + hashlib.sha1(text.encode("utf-8", "replace"), usedforsecurity=False).hexdigest()
        if len(_SCOPE_CACHE) >= FINGERPRINT_CACHE_SIZE:
            _SCOPE_CACHE.clear()
        _SCOPE_CACHE[cache_key] = scope
    return scope


def pattern_key(*, error_type: str, template: str) -> str:
    """The key of a pattern with this template: the same formula for a fingerprint and for a mined template."""
    key = _KEY_CACHE.get((error_type, template))
    if key is None:
        digest = hashlib.sha1(f"{error_type}\x00{template}".encode("utf-8", "replace"), usedforsecurity=False)
        key = digest.hexdigest()
        if len(_KEY_CACHE) >= FINGERPRINT_CACHE_SIZE:
            _KEY_CACHE.clear()
        _KEY_CACHE[(error_type, template)] = key
    return key


# An exception type as Python, Java, .NET, Ruby, Rust, PHP and JavaScript print it: identifiers joined by dots, "::"
# or backslashes.
TYPE_NAME = re.compile(r"\\?[A-Za-z_$][\w$]*(?:(?:\.|::|\\)[A-Za-z_$][\w$]*)*")
# What joins the parts of a qualified name: Python, Java and .NET's dots, Ruby and Rust's "::", PHP's backslash.
NAME_PARTS = re.compile(r"\.|::|\\")


def leading_error_type(message: str) -> tuple[str, str]:
    """How ingest reads a dead letter whose headers carry a message and no type: ("ValueError", "bad id 42") from
    "ValueError: bad id 42", as Python and Java print exceptions, when the part before ": " is one word that starts
    with a capital or is dotted; ("", message) otherwise. (`split_error_type`, for lines typed or pasted without
    headers, is stricter: a dotted logger or job name is not taken for a type.)"""
    head, separator, rest = message.partition(": ")
    if separator and head and " " not in head and len(head) < 200 and (head[0].isupper() or _qualified(head)):
        return head, rest
    return "", message


def split_error_type(message: str) -> tuple[str, str]:
    """("ValueError", "bad id 42") from "ValueError: bad id 42", as Python and Java print exceptions;
    ("", message) when the message does not start with a type."""
    head, separator, rest = message.partition(": ")
    if separator and len(head) < 200 and TYPE_NAME.fullmatch(head) and (head[0].isupper() or _qualified(head)):
        # A qualified name is a type when its last part is a class name ("requests.exceptions.HTTPError");
        # "com.example.daily.cleanup: ..." names a job or a logger, whose message follows.
        parts = NAME_PARTS.split(head.lstrip("\\"))
        if (parts[-1].lstrip("_")[:1].isupper() or len(parts) == 1) and not _is_bundle_id(parts):
            return head, rest
    return "", message


def _qualified(name: str) -> bool:
    """A name with a module or namespace: "requests.exceptions.HTTPError", "reqwest::Error", "GuzzleHttp\\Exception"."""
    return "." in name or "::" in name or "\\" in name


# The first part of a reverse domain name ("com.apple.Safari.SafeBrowsing.Update", "org.acme.Billing.Nightly").
REVERSE_DOMAINS = frozenset({"com", "org", "net", "io", "edu", "gov"})


def _is_bundle_id(parts: list[str]) -> bool:
    """Whether a dotted name is a reverse-domain identifier of an app, job or logger rather than a class: a JVM class
    name has capitals only in its last part (a nested class is joined with "$"), so "com.apple.Safari.Update" with a
    capitalised part before the last names a bundle or a job."""
    return parts[0] in REVERSE_DOMAINS and any(part[:1].isupper() for part in parts[1:-1])


def fingerprint(*, error_type: str, message: str, stack_trace: str = "", fallback: str = "") -> Fingerprint:
    """Key and template of one failure. `fallback` names the failure when there is no error text at all
    (for example the broker's death reason and the original queue)."""
    # The same failure text recurs (one outage, thousands of dead letters): remember the answer.
    cache_key = (error_type, message, stack_trace, fallback)
    found = _FINGERPRINT_CACHE.get(cache_key)
    if found is None:
        found = _fingerprint(error_type=error_type, message=message, stack_trace=stack_trace, fallback=fallback)
        if len(_FINGERPRINT_CACHE) >= FINGERPRINT_CACHE_SIZE:
            _FINGERPRINT_CACHE.clear()
        _FINGERPRINT_CACHE[cache_key] = found
    return found


MASKED = re.compile(r"<[^<>]*>")
WORD = re.compile(r"[^\W\d_]{2,}")
QUOTES = "'\"`"


def _trace_tokens(found: stacktrace.TraceSignature, message: str) -> tuple[str, ...]:
    """The tokens of a trace fingerprint: 'KeyError at orders/tasks.py:apply_promotions → orders/pricing.py:
    apply_discount:' as one token (the type's own name, then the frames that key the pattern as a call path, caller
    first: the innermost frame is often a shared helper, so the caller is what tells two patterns apart in a
    truncated list), then the masked first line of the message, mined like any text. One place raises several
    causes ("customer_email ... is not a valid e-mail address", "quantity must be positive"): the message keeps them
    apart. A quoted value is a value there (the pattern holds every field or key the place names); a message of
    values only ("KeyError: 'SPRING'") adds nothing to what the type says."""
    head = _trace_head(found.error_type, found.frames)
    masked = trace_message_tokens(message)
    tokens = [
        (" " + WILDCARD if token.startswith(" ") else WILDCARD)
        if token[-1] in QUOTES and _is_quoted(token) and not _names_dependency(masked, position)
        else token
        for position, token in enumerate(masked)
    ]
    if not tokens or not WORD.search(MASKED.sub("", "".join(tokens))):
        return (head,)
    if not tokens[0].startswith(" "):
        tokens[0] = " " + tokens[0]
    return (head, ":", *tokens)


def _trace_head(error_type: str, frames: tuple[str, ...]) -> str:
    cache_key = (error_type, *frames)
    head = _HEAD_CACHE.get(cache_key)
    if head is None:
        short_type = NAME_PARTS.split(error_type)[-1] if error_type else "Error"
        head = f"{short_type} at {' → '.join(_short_frame(frame) for frame in reversed(frames))}"
        if len(_HEAD_CACHE) >= FINGERPRINT_CACHE_SIZE:
            _HEAD_CACHE.clear()
        _HEAD_CACHE[cache_key] = head
    return head


def trace_message_tokens(message: str) -> tuple[str, ...]:
    """The masked tokens of a stack trace's message as its fingerprint reads them (its first line, without the type
    it opens with), before its quoted values become `<*>`."""
    first_line = message.strip().split("\n", 1)[0]
    error_type, rest = split_error_type(first_line)
    return tokenize(rest if error_type else first_line)


def _names_dependency(tokens: tuple[str, ...], position: int) -> bool:
    """Whether the token follows a key whose value names what failed ("host='fraud-check.internal'")."""
    index = position - 1
    while index >= 0 and tokens[index].strip() in ("=", ":"):
        index -= 1
    return index >= 0 and tokens[index].strip().lower() in DEPENDENCY_KEYS


def _is_quoted(token: str) -> bool:
    body = token.strip()
    return len(body) >= 2 and body[0] in QUOTES and body[-1] == body[0]


def _short_frame(frame: str) -> str:
    """A frame as people name it: 'orders/pricing.py:apply_discount' stays; a JVM or .NET method keeps its class
    ('com.acme.payments.psp.PspClient.capture' → 'PspClient.capture'); a Go function its package
    ('github.com/acme/shipping/label.Render' → 'label.Render')."""
    if ":" in frame:
        return frame
    name = frame.rpartition("/")[2]
    parts = name.split(".")
    return ".".join(parts[-2:]) if len(parts) > 2 else name


def clear_caches() -> None:
    """Forget every cached answer (benchmarks measure the work, not the caches), classification's too."""
    # Imported here: fingerprints know nothing of failure reasons (classify imports the models).
    from dlqconsole.deadletters.classify import clear_cache as clear_classify_cache
    from dlqconsole.deadletters.grouping.vocabulary import clear_cache as clear_vocabulary_cache

    _FINGERPRINT_CACHE.clear()
    masking.clear_cache()
    _KEY_CACHE.clear()
    _SCOPE_CACHE.clear()
    _HEAD_CACHE.clear()
    stacktrace.clear_cache()
    clear_classify_cache()
    clear_vocabulary_cache()


def _fingerprint(*, error_type: str, message: str, stack_trace: str, fallback: str) -> Fingerprint:
    # Templates and keys are stored; PostgreSQL refuses NUL characters in text.
    if "\x00" in message or "\x00" in stack_trace or "\x00" in error_type:
        message, stack_trace = message.replace("\x00", "\ufffd"), stack_trace.replace("\x00", "\ufffd")
        error_type = error_type.replace("\x00", "\ufffd")
    error_type = error_type[:255]
    trace = stack_trace
    if not trace and stacktrace.looks_like_trace(message):
        # Some services send the whole printed exception as the message; group it as a trace, and fall back
        # to its first line as text when no frame of the application's own code is found.
        trace, message = message, stacktrace.headline(message)
    if trace:
        found = stacktrace.signature(trace, error_type=error_type)
        if found is not None:
            tokens = _trace_tokens(found, message or stacktrace.headline(trace))
            template = "".join(tokens)
            scope = trace_scope(found.error_type, found.frames)
            key = pattern_key(error_type=f"{found.error_type}\x00{scope}", template=template)
            return Fingerprint(
                key=key, template=template, error_type=found.error_type, tokens=tokens, kind="trace", scope=scope
            )
    tokens, template = tokenize_joined(message) if message else ((), "")
    if not tokens:
        template = fallback or "(no error message)"
        return Fingerprint(
            key=pattern_key(error_type=error_type, template=template),
            template=template,
            error_type=error_type,
            kind="empty",
        )
    return Fingerprint(
        key=pattern_key(error_type=error_type, template=template),
        template=template,
        error_type=error_type,
        tokens=tokens,
    )
