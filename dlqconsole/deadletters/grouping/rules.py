"""Custom fingerprint rules, compiled once per process and matched against dead letters.

Rules are few and change rarely; ingest reads the enabled ones at most once a second (one query) and compiles
only those it has not seen in this version (`updated_at`), so a rule edited in the admin applies within a second
in every consumer process (at once in the process that saved it).

Expressions are typed by operators (split rules) and admins, and Python's `re` cannot be stopped: one that
backtracks catastrophically (`(a|aa)+$`) on a long error text would hold an ingest process, or a web worker
splitting a pattern, for good. Rules are therefore compiled with the `regex` module (the same syntax as `re`)
and each search may take at most MATCH_TIMEOUT seconds; a search that runs out counts as no match, logged.

The admin refuses, when it is saved, an expression that backtracks on the usual suspects, but one may still be
slow only on real texts. A rule whose searches run out SLOW_LIMIT times within SLOW_WINDOW seconds in one process
is therefore disabled for every process (after the batch commits), with the reason on the rule and in the audit
log: each such search costs up to two timeouts per dead letter, and ingest must keep up.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import regex
from django.db import transaction

from dlqconsole.core import jsonsafe
from dlqconsole.deadletters.models import FingerprintRule

# Rules search at most this much of the error text, so one careless expression cannot stall ingest for long.
MAX_TEXT = 4000
# The longest one search of one rule may take (seconds); an ordinary expression takes microseconds.
MATCH_TIMEOUT = 0.05

# A rule whose searches run out this many times within SLOW_WINDOW seconds (in one process) is disabled.
SLOW_LIMIT = 3
SLOW_WINDOW = 60.0

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CompiledRule:
    id: int
    key: str
    pattern_id: int | None
    scope_id: int | None
    regex: Any  # a compiled `regex` pattern, searched through search() below
    header: str


_compiled: dict[tuple[int, dt.datetime, str, str], CompiledRule] = {}
# The enabled rules, read at most once per RULES_TTL seconds per process: a consumer writing several batches a
# second reads them once a second, and a rule saved in any process applies everywhere within that second.
RULES_TTL = 1.0
_loaded: tuple[float, list[CompiledRule]] | None = None


def compile_rule(rule: FingerprintRule) -> CompiledRule:
    """Raises re.error when the expression does not compile."""
    return CompiledRule(
        id=rule.pk,
        key=rule.fingerprint_key,
        pattern_id=rule.pattern_id,
        scope_id=rule.scope_id,
        regex=_compile(rule.regex) if rule.regex else None,
        header=rule.header.strip().lower(),
    )


def _compile(expression: str) -> Any:
    try:
        return regex.compile(expression, regex.VERSION0)
    except regex.error as problem:
        raise re.error(str(problem)) from None


class RuleTooSlowError(Exception):
    """A search of a rule's expression ran past MATCH_TIMEOUT where the caller asked to be told (a split)."""


def search(rule: CompiledRule, text: str, *, strict: bool = False) -> bool:
    """Whether the rule's expression is found in the text; a search past MATCH_TIMEOUT counts as not found, or
    raises RuleTooSlowError when `strict` (a split must not file a dead letter by a search that gave up)."""
    try:
        return rule.regex.search(text, timeout=MATCH_TIMEOUT) is not None
    except TimeoutError:
        if strict:
            raise RuleTooSlowError(
                f"The expression took longer than {MATCH_TIMEOUT * 1000:.0f} ms on one dead letter's text; "
                "make it simpler (nested repetition such as (a|aa)+ backtracks without end)."
            ) from None
        logger.warning(
            "Fingerprint rule #%s took longer than %s s on a text and was taken as not matching", rule.id, MATCH_TIMEOUT
        )
        _note_slow(rule, text)
        return False


# Rule id → when its recent searches ran out (this process); rules already being disabled.
_slow: dict[int, deque[float]] = {}
_disabling: set[int] = set()
_clock = time.monotonic


def _note_slow(rule: CompiledRule, text: str) -> None:
    """Count a search that ran out; at SLOW_LIMIT within SLOW_WINDOW, disable the rule once the current
    transaction (the ingest batch) commits, or at once outside one."""
    now = _clock()
    times = _slow.setdefault(rule.id, deque(maxlen=SLOW_LIMIT))
    times.append(now)
    if len(times) < SLOW_LIMIT or now - times[0] > SLOW_WINDOW or rule.id in _disabling:
        return
    _disabling.add(rule.id)
    excerpt = text[:120] + ("…" if len(text) > 120 else "")
    reason = (
        f"Disabled by ingest: searches of its expression ran past {MATCH_TIMEOUT * 1000:.0f} ms {SLOW_LIMIT} times "
        f"within {SLOW_WINDOW:.0f} s (the last on a text beginning {excerpt!r}); each such search holds up ingest. "
        "Make the expression simpler and enable the rule again."
    )

    def disable() -> None:
        # Imported here: the rule services import this module, so it imports them where it uses them.
        from dlqconsole.deadletters.rule_services import disable_slow_rule

        try:
            disable_slow_rule(rule_id=rule.id, reason=reason)
        finally:
            _disabling.discard(rule.id)
            _slow.pop(rule.id, None)

    transaction.on_commit(disable, robust=True)


def forget_rules() -> None:
    """Read the rules again on the next batch (called by the services that change them)."""
    global _loaded
    _loaded = None


def load_rules() -> list[CompiledRule]:
    """The enabled rules in the order they are tried, read again after RULES_TTL seconds."""
    global _loaded
    now = time.monotonic()
    if _loaded is None or now - _loaded[0] >= RULES_TTL:
        _loaded = (now, _read_rules())
    return _loaded[1]


def _read_rules() -> list[CompiledRule]:
    # A rule whose expression no longer compiles is skipped (the admin refuses such expressions; this only
    # guards against rows edited elsewhere).
    rules: list[CompiledRule] = []
    for rule in FingerprintRule.objects.filter(enabled=True).order_by("position", "id"):
        version = (rule.pk, rule.updated_at, rule.regex, rule.header)
        compiled = _compiled.get(version)
        if compiled is None or compiled.pattern_id != rule.pattern_id or compiled.scope_id != rule.scope_id:
            try:
                compiled = compile_rule(rule)
            except re.error:
                continue
            _compiled[version] = compiled
        rules.append(compiled)
    return rules


def error_text(*, error_type: str, message: str) -> str:
    """The error as one line, '<error type>: <message>', as a log would show it."""
    return f"{error_type}: {message}" if error_type else message


def header_text(headers: Any, name: str) -> str | None:
    """The value of a header (name compared without regard to case) as text, or None when it is absent."""
    if not isinstance(headers, dict):
        return None
    if "$map" in headers:
        headers = jsonsafe.decode(headers)
        if not isinstance(headers, dict):
            return None
    for key, value in headers.items():
        if str(key).lower() == name:
            return jsonsafe.to_text(value, limit=MAX_TEXT)
    return None


def matches(rule: CompiledRule, *, error_type: str, message: str, headers: Any, strict: bool = False) -> bool:
    if rule.header:
        value = header_text(headers, rule.header)
        if value is None:
            return False
        return rule.regex is None or search(rule, value, strict=strict)
    if rule.regex is None:
        return False
    # The expression is searched in the message alone (so `^Connection refused` means what it says) and then in
    # '<error type>: <message>' (so an expression may name the type, `^TimeoutError: ` or `KeyError`).
    if search(rule, message[:MAX_TEXT], strict=strict):
        return True
    text = error_text(error_type=error_type, message=message)
    return bool(error_type) and search(rule, text[:MAX_TEXT], strict=strict)


def first_match(
    rules: list[CompiledRule], *, error_type: str, message: str, headers: Any, scope_id: int | None = None
) -> CompiledRule | None:
    """The first rule of the given scope (None: the rules that apply to every dead letter) that matches."""
    for rule in rules:
        if rule.scope_id == scope_id and matches(rule, error_type=error_type, message=message, headers=headers):
            return rule
    return None
