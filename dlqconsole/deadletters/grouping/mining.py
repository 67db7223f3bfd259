"""Template mining: find the variable words that masking could not recognise.

Input: the distinct masked templates of one *cluster* (same error type, failure reason and first word, which
mining never makes a variable). Output: for each template, the generalised template it belongs to
(`user <*> not found`). `generalize` mines the templates of one token count; `generalize_all` mines each token
count, then links templates of different lengths that differ by one run of values.

The result is a pure function of the *set* of templates: it does not depend on the order they arrived in, on how
many messages each one had, or on which process saw them, so every consumer process (and `dlq fingerprint`) that
recomputes a cluster from the same set gets the same answer. A slot varies only on enough evidence: two values
after a noun that names a thing (ENTITY_NOUNS), ENUM_VALUES after an enumeration's noun or for words that say
what happened, PLAIN_VALUES elsewhere; across token counts, MAX_VALUE_TOKENS bounds a run of words taken as a
value. docs/grouping.md, "Template mining", explains the rules and why each is there.

The words mining reads a template by are in grouping.vocabulary, the links across token counts in grouping.linking.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from operator import itemgetter

from dlqconsole.deadletters.fingerprint import DEPENDENCY_KEYS
from dlqconsole.deadletters.grouping.linking import Shapes, linked, one_run_apart, same_remainder
from dlqconsole.deadletters.grouping.vocabulary import (
    ENTITY_NOUNS,
    ENUM_NOUNS,
    PARTICIPLE,
    WILDCARD,
    address_label,
    first_word,
    is_data,
    is_wildcard,
    lower_word,
    word_after,
    word_before,
)
from dlqconsole.deadletters.masking import connection_failed

PLAIN_VALUES = 3
ENUM_VALUES = 5
# Literal values a program prints for a flag or an empty field ("ret:false", "ws=null"): data, like a number.
LITERALS = frozenset({"true", "false", "null", "none", "nil", "undefined"})
MAX_ROUNDS = 8


def _no_key(form: tuple[str, ...]) -> tuple[str, ...]:
    return ()


def _count_wildcards(form: tuple[str, ...]) -> int:
    # `is_wildcard` spelled out here and below: these run for every token of every form in every round.
    return sum(1 for token in form if token.endswith(WILDCARD))


def _wildcards(form: tuple[str, ...]) -> frozenset[int]:
    return frozenset(position for position, token in enumerate(form) if token.endswith(WILDCARD))


def _wild(token: str) -> str:
    return " " + WILDCARD if token.startswith(" ") else WILDCARD


def _after_data(form: tuple[str, ...], position: int) -> bool:
    """Whether a token follows masked data ("<NUM> KB", "<NUM> retries"): a word there is the value's unit."""
    previous = form[position - 1] if position > 0 else ""
    return form[position].startswith(" ") and is_data(previous) and not is_wildcard(previous)


def _quoted(token: str) -> bool:
    """A quoted value ("'charge.refunded'", "`pickup_point`"): what the program was given, printed as data."""
    body = token.strip()
    return len(body) >= 2 and body[0] in "'\"`" and body[-1] == body[0] and "://" not in body


def _keyed(form: tuple[str, ...], position: int) -> bool:
    """Whether a token is the value of a "key=value" pair: a field a program printed, data like a number."""
    if position < 2 or form[position - 1] != "=":
        return False
    key = lower_word(form[position - 2])
    return bool(key) and key not in ENUM_NOUNS and key not in DEPENDENCY_KEYS


def _qualifies(values: set[str], form: tuple[str, ...], position: int) -> bool:
    if any(value.endswith(WILDCARD) for value in values):
        return True
    stripped = [value.strip() for value in values]
    if not any(value[:1].isalnum() or value[:1] in "<'\"`" for value in stripped):
        return False
    if any(value.isdecimal() for value in stripped):
        # Masking turns numbers into <NUM> except those that name the cause (an HTTP status, the port of a failed
        # connection): they never vary.
        return False
    if any("://" in value for value in stripped) and connection_failed("".join(form)):
        # A connection that failed keeps the service it names: the host of a URL (masking keeps it) included.
        return False
    data = any(is_data(value) for value in values)
    if not data and position == first_word(form):
        # The first word of a message is its own wording ("boot (command 12)", "halt (command 12)"), never a
        # name: only masked data varies there.
        return False
    before = word_before(form, position)
    if before in DEPENDENCY_KEYS:
        # What a key that names the dependency holds ("host='fraud-check.internal'", "table=orders") is what failed:
        # another one is another cause, however many there are; an address masked as <IP> is one, a named host
        # another.
        return False
    if len(values) >= ENUM_VALUES:
        # As many values as the most demanding slot needs: the tests below cannot ask for more.
        return True
    after = word_after(form, position)
    if not data and all(PARTICIPLE.fullmatch(value) for value in stripped):
        # Words that say what happened are different events even after a noun that names a thing: "Instance
        # spawned" / "Instance destroyed", "job started" / "job failed", "VM Paused" / "VM Resumed" are not one
        # pattern with a name varying: each is a different event, like an enumeration's values.
        needed = ENUM_VALUES
    elif (
        before in ENTITY_NOUNS
        or after in ENTITY_NOUNS
        or data
        or all(lower_word(value) in LITERALS for value in values)
        or _keyed(form, position)
        or (_after_data(form, position) and all(value.isalpha() for value in stripped))
    ):
        needed = 2
    elif (before in ENUM_NOUNS and not all(_quoted(value) and "." in value for value in values)) or all(
        lower_word(value) in ENTITY_NOUNS for value in values
    ):
        # Also when the values are themselves kinds of things ("user", "tenant", "queue"): they are the message's
        # subject, not data.
        needed = ENUM_VALUES
    else:
        needed = PLAIN_VALUES
    return len(values) >= needed


def _acceptable(form: tuple[str, ...]) -> bool:
    wildcards = 0
    fixed_words = 0
    for token in form:
        if token.endswith(WILDCARD):
            wildcards += 1
        elif token.lstrip()[:1].isalpha():
            fixed_words += 1
    return fixed_words >= 1 and wildcards <= fixed_words


def _absorb(forms: list[tuple[str, ...]]) -> dict[tuple[str, ...], tuple[str, ...]]:
    """Map each form to the most general generalised form that matches it (itself when there is none)."""
    general = [form for form in forms if any(token.endswith(WILDCARD) for token in form)]
    if not general:
        return {form: form for form in forms}
    by_mask: dict[tuple[int, ...], dict[tuple[str, ...], tuple[str, ...]]] = {}
    # Most wildcards first, then the smallest form: a deterministic choice when several match.
    for form in sorted(general, key=lambda form: (-_count_wildcards(form), form)):
        mask = tuple(position for position, token in enumerate(form) if token.endswith(WILDCARD))
        fixed = tuple(token for token in form if not token.endswith(WILDCARD))
        by_mask.setdefault(mask, {}).setdefault(fixed, form)
    masks = sorted(by_mask, key=lambda mask: (-len(mask), mask))
    result: dict[tuple[str, ...], tuple[str, ...]] = {}
    for form in forms:
        own = {position for position, token in enumerate(form) if token.endswith(WILDCARD)}
        chosen = form
        for mask in masks:
            if not own <= set(mask) or len(mask) <= len(own):
                continue
            wanted = set(mask)
            fixed = tuple(token for position, token in enumerate(form) if position not in wanted)
            found = by_mask[mask].get(fixed)
            if found is not None:
                chosen = found
                break
        result[form] = chosen
    return result


def _soft_slots(form: tuple[str, ...]) -> tuple[int, ...]:
    """The positions where a form holds data (masked values, wildcards, the value of a "key=value"), the message's
    first word excepted."""
    slots = [position for position, token in enumerate(form) if ">" in token and (is_wildcard(token) or is_data(token))]
    if "=" in form:
        keyed = [position for position in range(2, len(form)) if form[position - 1] == "=" and _keyed(form, position)]
        slots = sorted({*slots, *keyed})
    if len(slots) < 2:
        return ()
    # What a key that names the dependency holds is never data, masked or not (`_qualifies`). Looked for only here:
    # most forms have fewer than two slots.
    slots = [position for position in slots if word_before(form, position) not in DEPENDENCY_KEYS]
    if len(slots) < 2:
        return ()
    first = first_word(form)
    return tuple(position for position in slots if position != first)


def _is_word_value(token: str) -> bool:
    value = token.strip()
    return bool(value) and (value[0].isalnum() or value[0] in "'\"`") and not is_data(token)


def _data_slot_proposals(forms: list[tuple[str, ...]]) -> dict[tuple[str, ...], set[int]]:
    """Pairs of forms that differ only where one of them holds data, in two places or more.

    Mining compares one position at a time, so it misses a value that masking recognised in one message and not in
    another at two places at once ("Registering class <ID> for class <ID>" / "Registering class
    org.acme.EventType for class org.acme.Handler": a digit in the class name decides the mask). A slot where one
    side holds masked data is a value slot, as it is for a single position; here every differing slot must be one.
    """
    slots_of = {form: _soft_slots(form) for form in forms}
    by_slots: dict[tuple[int, ...], dict[tuple[str, ...], list[tuple[str, ...]]]] = {}
    for form, slots in slots_of.items():
        if len(slots) >= 2:
            rest = tuple(token for position, token in enumerate(form) if position not in slots)
            by_slots.setdefault(slots, {}).setdefault(rest, []).append(form)
    result: dict[tuple[str, ...], set[int]] = {}
    if not by_slots:
        return result
    for form in forms:
        own = set(slots_of[form])
        first = first_word(form)
        for slots, index in by_slots.items():
            wanted = set(slots)
            if not own <= wanted or first in wanted:
                continue
            rest = tuple(token for position, token in enumerate(form) if position not in wanted)
            for other in index.get(rest, ()):
                differing = [position for position in slots if form[position] != other[position]]
                if len(differing) < 2 or not all(
                    position in own or _is_word_value(form[position]) for position in differing
                ):
                    continue
                result.setdefault(form, set()).update(differing)
                result.setdefault(other, set()).update(differing)
    return result


def generalize(templates: Iterable[tuple[str, ...]]) -> dict[tuple[str, ...], tuple[str, ...]]:
    """Map every template (all of one length) to its generalised template."""
    originals = sorted(set(templates))
    if len(originals) < 2:
        return {template: template for template in originals}
    current = {template: template for template in originals}
    for _ in range(MAX_ROUNDS):
        forms = sorted(set(current.values()))
        proposals: dict[tuple[str, ...], set[int]] = {form: set() for form in forms}
        masks: dict[tuple[str, ...], frozenset[int]] = {form: _wildcards(form) for form in forms}
        # Positions where every form holds the same token can neither vary nor tell forms apart.
        varying = [position for position in range(len(forms[0])) if len({form[position] for form in forms}) > 1]
        for position in varying:
            for mask in sorted(set(masks.values()), key=sorted):
                if position in mask:
                    continue
                # A form with wildcards is compared with every form that agrees on its fixed words, whatever
                # the others hold where it has wildcards ("Merchant <*> cannot settle in GBP" meets "Merchant
                # acme cannot settle in EUR").
                keep = [index for index in varying if index != position and index not in mask]
                # The tokens at `keep` of each form, as one key (itemgetter: one call in C per form).
                key_of = itemgetter(*keep) if keep else _no_key
                keys = list(map(key_of, forms))
                buckets: dict[object, set[str]] = {}
                for form, key in zip(forms, keys, strict=True):
                    buckets.setdefault(key, set()).add(form[position])
                for form, key in zip(forms, keys, strict=True):
                    if masks[form] != mask or form[position].endswith(WILDCARD):
                        continue
                    values = buckets[key]
                    if len(values) > 1 and _qualifies(values, form, position):
                        proposals[form].add(position)
        for form, positions in _data_slot_proposals(forms).items():
            proposals[form] |= positions
        step: dict[tuple[str, ...], tuple[str, ...]] = {}
        for form in forms:
            wanted = proposals[form]
            generalised = form
            if wanted:
                candidate = tuple(_wild(token) if p in wanted else token for p, token in enumerate(form))
                if _acceptable(candidate):
                    generalised = candidate
            step[form] = generalised
        absorbed = _absorb(sorted(set(step.values())))
        step = {form: absorbed[target] for form, target in step.items()}
        if all(step[form] == form for form in forms):
            break
        current = {template: step[form] for template, form in current.items()}
    return current


# Up to this many templates, a cluster's pairs are compared one by one (`one_run_apart`): cheaper than hashing
# every cut of every template when the cluster is small, as most are.
PAIRWISE_TEMPLATES = 64


def _order(form: tuple[str, ...]) -> tuple[int, int, tuple[str, ...]]:
    """Fewest tokens, then most wildcards, then the smallest: the order a group's template is chosen in."""
    return (len(form), -_count_wildcards(form), form)


def generalize_all(templates: Iterable[tuple[str, ...]]) -> dict[tuple[str, ...], tuple[str, ...]]:
    """Map every template (of any length) to its group's template.

    Each token count is mined on its own (`generalize`). Then templates are linked: those mined into one form, and
    pairs one run of values apart (a property of the two templates alone, or of a slot their mining made a
    variable). Each connected set is a group, and its template is its first form in `_order`. Groups only grow
    as templates arrive and their first form only moves down the order, so a template that stops being a group's
    template never becomes one again: the store can absorb its pattern for good. Putting wildcards where the
    group's forms differ would read better but breaks that (a template can lose and regain a wildcard as the
    forms it is linked through generalise), so a group of "user bob not found" and "user John Smith not found"
    is shown as the first; "user <*> not found" comes from mining once two one-word names are in.
    """
    raw = set(templates)
    # An address the message opens with is a value from the start (vocabulary.address_label).
    if len(raw) == 1:
        # Alone in its cluster (as many templates are), a template is its own group.
        template = raw.pop()
        return {template: _unlabel(template)}
    unlabelled = {template: _unlabel(template) for template in raw}
    if any(template is not plain for template, plain in unlabelled.items()):
        grouped = _generalize_all(set(unlabelled.values()))
        return {template: grouped[plain] for template, plain in unlabelled.items()}
    return _generalize_all(raw)


def _unlabel(template: tuple[str, ...]) -> tuple[str, ...]:
    if address_label(template):
        return (WILDCARD, *template[1:])
    return template


def _generalize_all(templates: set[tuple[str, ...]]) -> dict[tuple[str, ...], tuple[str, ...]]:
    by_length: dict[int, set[tuple[str, ...]]] = defaultdict(set)
    for template in templates:
        by_length[len(template)].add(template)
    forms: dict[tuple[str, ...], tuple[str, ...]] = {}
    for length in sorted(by_length):
        forms.update(generalize(by_length[length]))
    ordered = sorted(forms)
    if len(ordered) < 2:
        return forms
    parent = list(range(len(ordered)))

    def root(index: int) -> int:
        while parent[index] != index:
            parent[index] = parent[parent[index]]
            index = parent[index]
        return index

    first_of_form: dict[tuple[str, ...], int] = {}
    for index, template in enumerate(ordered):
        other = first_of_form.setdefault(forms[template], index)
        parent[root(index)] = root(other)
    if len({root(index) for index in range(len(ordered))}) < 2:
        return forms
    if len(ordered) <= PAIRWISE_TEMPLATES:
        # Groups are the connected sets of linked pairs, so the order pairs are looked at in does not matter.
        shapes = Shapes(ordered)
        for left in range(len(ordered)):
            for right in range(left + 1, len(ordered)):
                if (
                    root(left) != root(right)
                    and one_run_apart(shapes, left, right)
                    and linked(ordered[left], ordered[right], forms)
                ):
                    parent[root(right)] = root(left)
        return _heads(ordered, forms, root)
    checked: set[tuple[int, int]] = set()
    for members in same_remainder(ordered):
        for position, (left, left_data) in enumerate(members):
            for right, right_data in members[position + 1 :]:
                if root(left) == root(right) or (left, right) in checked:
                    continue
                if len(ordered[left]) == len(ordered[right]) and not (left_data and right_data):
                    continue
                checked.add((left, right))
                if linked(ordered[left], ordered[right], forms):
                    parent[root(right)] = root(left)
    return _heads(ordered, forms, root)


def _heads(
    ordered: list[tuple[str, ...]], forms: dict[tuple[str, ...], tuple[str, ...]], root: Callable[[int], int]
) -> dict[tuple[str, ...], tuple[str, ...]]:
    """Each template's group template: the first form of its connected set in `_order`."""
    heads: dict[int, tuple[str, ...]] = {}
    for index, template in enumerate(ordered):
        group = root(index)
        form = forms[template]
        if group not in heads or _order(form) < _order(heads[group]):
            heads[group] = form
    return {template: heads[root(index)] for index, template in enumerate(ordered)}


def anchor(tokens: tuple[str, ...]) -> str:
    """The message's first word, which mining never makes a variable: templates that can group share it."""
    position = first_word(tokens)
    return tokens[position].strip() if position >= 0 else ""
