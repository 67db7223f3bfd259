"""Assign each incoming dead letter to a FailurePattern: ingest calls file_ahead before a batch's transaction and
assign_patterns in it.

In order: custom fingerprint rules that apply everywhere (the first that matches decides); otherwise the
fingerprint (stack trace signature, or masked message mined together with its cluster, see `store`); then
split rules scoped to the pattern that came out. Merge decisions live in the database, so every consumer
process files a fingerprint under the same pattern.

Cost per batch, whatever its size: one query to read (and share-lock) where its fingerprints are filed; plus,
only for fingerprints this process has not met, one to learn which are new and the work of filing them (which
ingest does ahead, in a transaction of its own: `file_ahead`). Compiled rules (read once a second), masked
tokens and the fingerprint keys met are cached per process.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any, Protocol

from django.db import transaction

from dlqconsole.deadletters.fingerprint import fingerprint
from dlqconsole.deadletters.grouping.rules import CompiledRule, first_match, forget_rules, load_rules
from dlqconsole.deadletters.grouping.store import (
    Candidate,
    file_fingerprints,
    file_new_fingerprints,
    is_known,
    read_filing,
    resolve,
)
from dlqconsole.deadletters.models import Fingerprint, FingerprintRule
from dlqconsole.deadletters.search import fallback_name


class Letter(Protocol):
    """What grouping reads of a dead letter on its way in, and its fingerprint, which grouping sets: ingest's
    ParsedDeadLetter, or a line that `dlq fingerprint --save` files."""

    source_queue: str
    original_queue: str
    death_reason: str
    failure_reason: str
    transient: bool
    task_name: str
    error_type: str
    error_message: str
    stack_trace: str
    headers: dict[str, Any]
    fingerprint: str


def assign_patterns(*, letters: Sequence[Letter], now: dt.datetime) -> dict[str, int]:
    """Set each letter's fingerprint and return {fingerprint: pattern id} for all of them.

    Runs inside the caller's batch transaction; safe with any number of concurrent callers.
    """
    filing = _assign(letters, load_rules(), now=now)
    gone = {letter.fingerprint for letter in letters} - set(filing)
    if gone:
        # A rule was deleted since this process read the rules (less than RULES_TTL ago): file these dead
        # letters as if it had never existed.
        forget_rules()
        filing.update(_assign([letter for letter in letters if letter.fingerprint in gone], [], now=now))
    return filing


def file_ahead(*, letters: Sequence[Letter], now: dt.datetime) -> None:
    """File the fingerprints of `letters` that this process has not met yet, in a transaction of its own that
    commits before the caller stores the letters; assign_patterns, in the caller's transaction, then only reads
    where they are filed. Mining a new fingerprint locks its cluster row until the transaction ends: filed here,
    concurrent batches wait for each other's mining, not for each other's whole transaction.

    Call it outside any transaction. What it files is what assign_patterns would file (a pure function of the
    fingerprints filed, see `store`), so it changes no pattern; a batch that fails afterwards leaves its new
    fingerprints filed, and its patterns without dead letters until it is written again."""
    everywhere = [rule for rule in load_rules() if rule.scope_id is None]
    if any(rule.regex is not None for rule in everywhere):
        # A rule's expression is searched once per dead letter, in assign_patterns: searched here too, it would
        # cost twice and count a search that runs out twice. With such rules, new fingerprints are filed there.
        return
    candidates, _ = _fingerprints(letters, everywhere)
    new = {key: candidate for key, candidate in candidates.items() if not is_known(key)}
    if new:
        with transaction.atomic():
            file_new_fingerprints(candidates=new, now=now)


def _assign(letters: Sequence[Letter], rules: list[CompiledRule], *, now: dt.datetime) -> dict[str, int]:
    candidates, rule_keys = _fingerprints(letters, [rule for rule in rules if rule.scope_id is None])
    _ensure_rules(rules, rule_keys, now=now)
    filing = file_fingerprints(candidates=candidates, extra_keys=rule_keys, now=now)
    splits = [rule for rule in rules if rule.scope_id is not None]
    if splits:
        filing.update(_apply_splits(letters, splits, filing, now=now))
    return filing


def _fingerprints(letters: Sequence[Letter], everywhere: list[CompiledRule]) -> tuple[dict[str, Candidate], set[str]]:
    """Set each letter's fingerprint (the first matching rule's key, else its own); returns the fingerprints met
    that rules did not decide, and the keys of the rules that did."""
    candidates: dict[str, Candidate] = {}
    rule_keys: set[str] = set()
    for letter in letters:
        if everywhere:
            rule = first_match(
                everywhere, error_type=letter.error_type, message=letter.error_message, headers=letter.headers
            )
            if rule is not None:
                letter.fingerprint = rule.key
                rule_keys.add(rule.key)
                continue
        found = fingerprint(
            error_type=letter.error_type,
            message=letter.error_message,
            stack_trace=letter.stack_trace,
            fallback=fallback_name(letter),
        )
        letter.fingerprint = found.key
        if found.key not in candidates:
            candidates[found.key] = Candidate(found=found, reason=letter.failure_reason, transient=letter.transient)
    return candidates, rule_keys


def _apply_splits(
    letters: Sequence[Letter], splits: list[CompiledRule], filing: dict[str, int], *, now: dt.datetime
) -> dict[str, int]:
    """Split rules apply to dead letters that would land in their scope pattern (or where it was merged)."""
    scopes = resolve({rule.scope_id for rule in splits if rule.scope_id is not None})
    by_pattern: dict[int, list[CompiledRule]] = {}
    for rule in splits:
        if rule.scope_id is not None:
            by_pattern.setdefault(scopes[rule.scope_id], []).append(rule)
    taken: set[str] = set()
    for letter in letters:
        rules = by_pattern.get(filing.get(letter.fingerprint, -1))
        if not rules:
            continue
        matched = first_match(
            rules,
            error_type=letter.error_type,
            message=letter.error_message,
            headers=letter.headers,
            scope_id=rules[0].scope_id,
        )
        if matched is not None:
            letter.fingerprint = matched.key
            taken.add(matched.key)
    if not taken:
        return {}
    _ensure_rules(splits, taken, now=now)
    return read_filing(taken)


def _ensure_rules(rules: list[CompiledRule], keys: set[str], *, now: dt.datetime) -> None:
    """Rules saved through the services have their pattern and fingerprint row already; this covers rules
    written some other way (a shell, a fixture)."""
    if not keys:
        return
    missing = keys - set(Fingerprint.objects.filter(key__in=sorted(keys)).values_list("key", flat=True))
    if not missing:
        return
    # Imported here: the rule services import grouping (its rules), so grouping imports them where it uses them.
    from dlqconsole.deadletters.rule_services import ensure_rule_pattern

    for rule in FingerprintRule.objects.filter(pk__in=[rule.id for rule in rules if rule.key in missing]):
        ensure_rule_pattern(rule=rule, now=now)
