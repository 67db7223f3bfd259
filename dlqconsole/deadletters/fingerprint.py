"""Fingerprints: a deterministic key for (error type, masked message) and a readable template.

The key depends only on the text, never on process state, so every consumer process and every restart
computes the same key for the same failure. Variable parts are replaced by placeholders in a fixed order
(the more specific shapes first, so a URL is not half-eaten by the number rule).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

MAX_MESSAGE = 2000

MASKS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s'\"<>()\[\]{},]+", re.I), "<URL>"),
    (re.compile(r"\b[\w.+-]+@[\w-]+(\.[\w-]+)+\b"), "<EMAIL>"),
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I), "<UUID>"),
    (
        re.compile(r"\b\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}([.,]\d+)?)?(Z|[+-]\d{2}:?\d{2})?)?\b"),
        "<DATETIME>",
    ),
    (re.compile(r"\b\d{1,2}:\d{2}:\d{2}([.,]\d+)?\b"), "<TIME>"),
    (re.compile(r"\b(\d{1,3}\.){3}\d{1,3}(:\d{1,5})?\b"), "<IP>"),
    (re.compile(r"\[?\b([0-9a-f]{1,4}:){2,7}[0-9a-f]{1,4}\b\]?(:\d{1,5})?", re.I), "<IP>"),
    (re.compile(r"\b0x[0-9a-f]+\b", re.I), "<HEX>"),
    (re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{8,}\b", re.I), "<HEX>"),
    (re.compile(r"(?<![\w.])(/[\w.@-]+){2,}/?"), "<PATH>"),
    (re.compile(r"\b[A-Z]:\\[^\s'\"]+"), "<PATH>"),
    (re.compile(r"'[^'\n]{0,200}'|\"[^\"\n]{0,200}\"|`[^`\n]{0,200}`"), "<QUOTED>"),
    (re.compile(r"\b[\w-]+(\.[\w-]+)*:\d{2,5}\b"), "<HOST:PORT>"),
    (re.compile(r"(?<![\w<])[-+]?\d+([.,]\d+)?(?=(ms|us|µs|ns|s|m|h|d|kb|mb|gb|b|%)?\b)", re.I), "<NUM>"),
    (re.compile(r"\b(?=\w*\d)[A-Za-z0-9_-]{12,}\b"), "<ID>"),
]
SPACES = re.compile(r"\s+")


@dataclass(frozen=True)
class Fingerprint:
    key: str
    template: str
    error_type: str


def mask(message: str) -> str:
    text = message[:MAX_MESSAGE]
    for pattern, placeholder in MASKS:
        text = pattern.sub(placeholder, text)
    return SPACES.sub(" ", text).strip()


def fingerprint(*, error_type: str, message: str, fallback: str = "") -> Fingerprint:
    """Key and template of one failure. `fallback` names the failure when there is no error text at all
    (for example the broker's death reason and the original queue)."""
    template = mask(message) if message else ""
    if not template:
        template = fallback or "(no error message)"
    digest = hashlib.sha1(f"{error_type}\x00{template}".encode("utf-8", "replace"), usedforsecurity=False)
    return Fingerprint(key=digest.hexdigest(), template=template, error_type=error_type)
