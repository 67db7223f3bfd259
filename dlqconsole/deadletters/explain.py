"""What a pattern holds, for an operator who must know whether it is one cause before "Retry all" or "Purge all" acts
on every dead letter in it: the distinct message templates filed under it, counted over its latest dead letters
(for dead letters grouped by their stack trace or a rule, their own messages, masked);
each position where its template varies (`<*>`), with how many values it took and the commonest of them; and where
in the code its stack traces were thrown from.

Bounded whatever the pattern's size: the latest SAMPLE dead letters (one index range per status), at most
MAX_FINGERPRINTS of its fingerprints read for the values, the messages of at most MESSAGE_SAMPLE of those grouped
otherwise than by their message, the stack traces of the latest TRACE_SAMPLE.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from django.db.models.functions import Substr

from dlqconsole.deadletters import stacktrace
from dlqconsole.deadletters.fingerprint import fingerprint as mask
from dlqconsole.deadletters.fingerprint import trace_message_tokens
from dlqconsole.deadletters.grouping.vocabulary import WILDCARD
from dlqconsole.deadletters.models import DeadLetter, DeadLetterStatus, FailurePattern, Fingerprint, FingerprintKind

SAMPLE = 2_000
MAX_FINGERPRINTS = 2_000
SHOWN_TEMPLATES = 20
SHOWN_VALUES = 6
SHOWN_CALL_SITES = 10
TRACE_SAMPLE = 100
MESSAGE_SAMPLE = 500


@dataclass(frozen=True, slots=True)
class TemplateCount:
    template: str
    count: int


@dataclass(frozen=True, slots=True)
class Slot:
    """A position where the pattern's template varies: the nth `<*>`, how many distinct values it took, the
    commonest few."""

    number: int
    distinct: int
    values: tuple[str, ...]

    @property
    def more(self) -> bool:
        return self.distinct > len(self.values)


@dataclass(frozen=True, slots=True)
class CallSite:
    frames: str
    count: int


@dataclass(frozen=True, slots=True)
class Inside:
    sampled: int
    templates: list[TemplateCount]
    # Distinct templates among the sampled dead letters (more than are shown when over SHOWN_TEMPLATES).
    template_count: int
    slots: list[Slot]
    call_sites: list[CallSite]
    traces_read: int


def explain(pattern: FailurePattern) -> Inside:
    latest = _latest(pattern)
    by_key = Counter(key for _, key in latest)
    fingerprints = list(
        Fingerprint.objects.filter(key__in=list(by_key)[:MAX_FINGERPRINTS]).only("key", "kind", "template", "tokens")
    )
    by_template: Counter[str] = Counter()
    for fingerprint in fingerprints:
        if fingerprint.kind == FingerprintKind.TEXT:
            by_template[fingerprint.template] += by_key[fingerprint.key]
    # A stack trace's signature (or a rule) can hold several causes raised at one place: their messages tell them
    # apart, masked as ingest masks a message without a trace.
    others = {fingerprint.key for fingerprint in fingerprints if fingerprint.kind != FingerprintKind.TEXT}
    masked, messages = _masked_messages([pk for pk, key in latest if key in others][:MESSAGE_SAMPLE])
    by_template.update(masked)
    templates = [TemplateCount(template, count) for template, count in _commonest(by_template)]
    call_sites, traces_read = _call_sites([pk for pk, _ in latest[:TRACE_SAMPLE]])
    return Inside(
        sampled=len(latest),
        templates=templates[:SHOWN_TEMPLATES],
        template_count=len(templates),
        slots=_slots(pattern, fingerprints, by_key, messages),
        call_sites=call_sites,
        traces_read=traces_read,
    )


def _latest(pattern: FailurePattern) -> list[tuple[int, str]]:
    """(id, fingerprint) of the pattern's latest SAMPLE dead letters, newest first: one walk of the (pattern,
    status, -id) index per status, each stopping after SAMPLE rows."""
    rows: list[tuple[int, str]] = []
    for status in DeadLetterStatus.values:
        rows.extend(
            DeadLetter.objects.filter(pattern=pattern, status=status)
            .order_by("-id")
            .values_list("id", "fingerprint")[:SAMPLE]
        )
    rows.sort(reverse=True)
    return rows[:SAMPLE]


def _masked_messages(ids: list[int]) -> tuple[Counter[str], dict[str, list[tuple[str, ...]]]]:
    """The masked templates of these dead letters' messages, counted; and by fingerprint, each message's tokens as a
    stack-trace fingerprint reads them before its quoted values become `<*>` (the values of those slots)."""
    rows = (
        DeadLetter.objects.filter(pk__in=ids)
        .annotate(head=Substr("error_message", 1, 2000))
        .values_list("fingerprint", "error_type", "head")
    )
    templates: Counter[str] = Counter()
    messages: dict[str, list[tuple[str, ...]]] = {}
    for key, error_type, message in rows:
        templates[mask(error_type=error_type, message=message).template] += 1
        messages.setdefault(key, []).append(trace_message_tokens(message))
    return templates, messages


def _slots(
    pattern: FailurePattern,
    fingerprints: list[Fingerprint],
    weight: Counter[str],
    messages: dict[str, list[tuple[str, ...]]],
) -> list[Slot]:
    tokens = pattern.tokens if isinstance(pattern.tokens, list) else []
    positions = [index for index, token in enumerate(tokens) if isinstance(token, str) and token.endswith(WILDCARD)]
    if not positions:
        return []
    seen: list[Counter[str]] = [Counter() for _ in positions]
    for fingerprint in fingerprints:
        # Only templates of the pattern's own length line up with its positions; those linked to it across
        # lengths are listed among the templates.
        if not isinstance(fingerprint.tokens, list) or len(fingerprint.tokens) != len(tokens):
            continue
        for counter, position in zip(seen, positions, strict=True):
            value = str(fingerprint.tokens[position]).strip()
            if value and value != WILDCARD:
                counter[value] += weight[fingerprint.key]
            elif value == WILDCARD and position >= 2 and fingerprint.kind == FingerprintKind.TRACE:
                # A stack trace's message holds its quoted values as <*> from the start: read them off the messages
                # (its tokens follow the type and frames and a ":").
                for message in messages.get(fingerprint.key, ()):
                    if len(message) + 2 == len(tokens) and message[position - 2].strip():
                        counter[message[position - 2].strip()] += 1
    return [
        Slot(
            number=number,
            distinct=len(counter),
            values=tuple(value for value, _ in _commonest(counter)[:SHOWN_VALUES]),
        )
        for number, counter in enumerate(seen, start=1)
        if counter
    ]


def _call_sites(ids: list[int]) -> tuple[list[CallSite], int]:
    """The application frames (innermost first) of the stack traces of these dead letters, counted; and how
    many traces were read."""
    rows = (
        DeadLetter.objects.filter(pk__in=ids)
        .exclude(stack_trace="")
        # As much of each trace as grouping reads of it.
        .annotate(head=Substr("stack_trace", 1, stacktrace.MAX_TRACE))
        .values_list("head", "error_type")
    )
    sites: Counter[str] = Counter()
    read = 0
    for head, error_type in rows:
        read += 1
        found = stacktrace.signature(head, error_type=error_type)
        if found is not None and found.frames:
            sites[" ← ".join(found.frames)] += 1
    return [CallSite(frames, count) for frames, count in _commonest(sites)[:SHOWN_CALL_SITES]], read


def _commonest(counts: Counter[str]) -> list[tuple[str, int]]:
    """Most counted first, then by text: the same order whatever order they were counted in."""
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))
