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
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable

WILDCARD = "<*>"
PLAIN_VALUES = 3
ENUM_VALUES = 5
MAX_ROUNDS = 8


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Nouns whose following word is a name that varies with the data: which user, which queue, which tenant. Nouns
# that name parts of the code or of the deployment (field, column, table, host, service) are deliberately not
# here: the field that is missing, the table that does not exist and the host that is down are the failure.
ENTITY_NOUNS = _words(
    """
    user users username login account accounts customer customers tenant tenants org organization organisation team
    project projects workspace member owner recipient sender subscriber merchant vendor supplier queue queues topic
    topics stream channel mailbox bucket buckets namespace region zone site city country locale language pod
    container instance worker consumer file filename files directory folder repo repository branch group item items
    product products sku store warehouse shop job jobs campaign list plan device volume
    """
)
ENUM_NOUNS = _words(
    """
    state status code type kind reason mode method phase level action operation result outcome stage verb severity
    category errno
    """
)


# A lower-case dotted name ("payments-api.internal", "orders.events", "users.email") names a host, an exchange
# or a key: part of the deployment, so a different one is a different failure, like an enumeration.
DOTTED_NAME = re.compile(r"[a-z][a-z0-9_-]*(?:\.[a-z0-9_-]+)+")
# A word in the past participle ("started", "Paused", "closed"): what happened, not a name.
PARTICIPLE = re.compile(r"[A-Za-z][a-z]{2,}ed")


def is_wildcard(token: str) -> bool:
    return token.endswith(WILDCARD)


def _count_wildcards(form: tuple[str, ...]) -> int:
    # `is_wildcard` spelled out here and below: these run for every token of every form in every round.
    return sum(1 for token in form if token.endswith(WILDCARD))


def _wildcards(form: tuple[str, ...]) -> frozenset[int]:
    return frozenset(position for position, token in enumerate(form) if token.endswith(WILDCARD))


def _is_data(token: str) -> bool:
    """A masked value (`<NUM>`, `'<ID>'`): the slot it sits in carries data."""
    value = token.strip().strip("'\"`")
    return value.startswith("<") and value.endswith(">")


def _wild(token: str) -> str:
    return " " + WILDCARD if token.startswith(" ") else WILDCARD


def _word(token: str) -> str:
    """The token as a lower-case word, or "" for punctuation, placeholders and wildcards."""
    word = token.strip()
    if not word[:1].isalpha():
        return ""
    return word.lower()


# A qualified name ("com.example.jobs.cleanup", "orders.worker-2") standing before a colon at the start of a message
# is the logger, job or component that printed it, not the message's own wording.
LABEL = re.compile(r"[A-Za-z][\w-]*(?:\.[\w-]+)+")


def _first_word(form: tuple[str, ...]) -> int:
    """The position of the message's first word (the first token that starts with a letter, after a leading
    "qualified.name:" label), or -1."""
    first = -1
    for position, token in enumerate(form):
        if token.lstrip()[:1].isalpha():
            first = position
            break
    if first >= 0 and first + 1 < len(form) and form[first + 1] == ":" and LABEL.fullmatch(form[first].strip()):
        for position in range(first + 2, len(form)):
            if form[position].lstrip()[:1].isalpha():
                return position
    return first


def _after_data(form: tuple[str, ...], position: int) -> bool:
    """Whether a token follows masked data ("<NUM> KB", "<NUM> retries"): a word there is the value's unit."""
    previous = form[position - 1] if position > 0 else ""
    return form[position].startswith(" ") and _is_data(previous) and not is_wildcard(previous)


def _before(form: tuple[str, ...], position: int) -> str:
    """The word before a position ("user" in "user alice" and in "user=alice"), or ""."""
    index = position - 1
    while index >= 0 and form[index].strip() in {"=", ":", "'", '"'}:
        index -= 1
    return _word(form[index]) if index >= 0 and not is_wildcard(form[index]) else ""


def _after(form: tuple[str, ...], position: int) -> str:
    """The word right after a position ("queue" in "the orders queue"), or ""."""
    index = position + 1
    if index < len(form) and form[index].startswith(" ") and not is_wildcard(form[index]):
        return _word(form[index])
    return ""


def _qualifies(values: set[str], form: tuple[str, ...], position: int) -> bool:
    if any(is_wildcard(value) for value in values):
        return True
    if not any(value.strip()[:1].isalnum() or value.strip()[:1] in "<'\"`" for value in values):
        return False
    if position == _first_word(form) and not any(_is_data(value) for value in values):
        # The first word of a message is its own wording ("boot (command 12)", "halt (command 12)"), never a
        # name: only masked data varies there.
        return False
    before = _before(form, position)
    after = _after(form, position)
    if not any(_is_data(value) for value in values) and all(PARTICIPLE.fullmatch(value.strip()) for value in values):
        # Words that say what happened are different events even after a noun that names a thing: "Instance
        # spawned" / "Instance destroyed", "job started" / "job failed" are not one pattern with a name varying.
        needed = ENUM_VALUES
    elif (
        before in ENTITY_NOUNS
        or after in ENTITY_NOUNS
        or any(_is_data(value) for value in values)
        or (_after_data(form, position) and all(value.strip().isalpha() for value in values))
    ):
        needed = 2
    elif (
        before in ENUM_NOUNS
        or all(DOTTED_NAME.fullmatch(value.strip().strip("'\"`")) for value in values)
        or all(_word(value) in ENTITY_NOUNS for value in values)
        or all(PARTICIPLE.fullmatch(value.strip()) for value in values)
    ):
        # Also when the values are themselves kinds of things ("user", "tenant", "queue"): they are the message's
        # subject, not data; and when they say what happened ("VM Paused", "VM Resumed", "order was Refunded"):
        # each is a different event, like an enumeration's values.
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
    """The positions where a form holds data (masked values or wildcards), the message's first word excepted."""
    slots = [
        position for position, token in enumerate(form) if ">" in token and (is_wildcard(token) or _is_data(token))
    ]
    if len(slots) < 2:
        return ()
    first = _first_word(form)
    return tuple(position for position in slots if position != first)


def _is_word_value(token: str) -> bool:
    value = token.strip()
    return bool(value) and (value[0].isalnum() or value[0] in "'\"`") and not _is_data(token)


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
        first = _first_word(form)
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
                buckets: dict[tuple[str, ...], set[str]] = {}
                for form in forms:
                    buckets.setdefault(tuple([form[index] for index in keep]), set()).add(form[position])
                for form in forms:
                    if masks[form] != mask or is_wildcard(form[position]):
                        continue
                    values = buckets[tuple([form[index] for index in keep])]
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


# Merging across token counts (docs/grouping.md, "Template mining"). The longest run a value may take where the
# other side holds words (a name, a wildcard's value).
MAX_VALUE_TOKENS = 4
# The longest run of data, punctuation or a quoted text that may differ.
MAX_RUN_TOKENS = 12
# Fixed words the two templates must share outside the run.
MIN_SHARED_WORDS = 2
QUOTES = "'\"`"


def _is_punctuation(token: str) -> bool:
    """A mark that holds no value: not a wildcard, and not a quoted value ("'<'" and "''" are values)."""
    return not any(character.isalnum() for character in token) and not is_wildcard(token) and not _quoted((token,))


def _loose(form: tuple[str, ...], start: int, end: int) -> bool:
    """Whether form[start:end] holds only data: wildcards, masked values, punctuation and units of a value
    ("(<NUM> KB)")."""
    for position in range(start, end):
        token = form[position]
        if is_wildcard(token) or _is_data(token) or _is_punctuation(token):
            continue
        # A word right after masked data is its unit ("<NUM> KB"), unless it names a key ("<IP> user=root").
        following = form[position + 1].strip() if position + 1 < len(form) else ""
        if (
            token.startswith(" ")
            and token.strip().isalpha()
            and _is_data(form[position - 1] if position > 0 else "")
            and following not in {"=", ":"}
        ):
            continue
        return False
    return True


def _holds_data(run: tuple[str, ...]) -> bool:
    return any(is_wildcard(token) or _is_data(token) for token in run)


def _is_value(run: tuple[str, ...]) -> bool:
    """Words or data, no punctuation and no noun that names a kind of thing or an enumeration."""
    for token in run:
        word = _word(token)
        if is_wildcard(token) or _is_data(token):
            continue
        if not word or not token.strip().replace("-", "").replace("_", "").replace(".", "").isalnum():
            return False
        if word in ENTITY_NOUNS or word in ENUM_NOUNS:
            return False
    return True


def _quoted(run: tuple[str, ...]) -> bool:
    text = "".join(run).strip()
    return len(text) >= 2 and text[0] in QUOTES and text[-1] == text[0]


def _run_is_value(
    short: tuple[str, ...], long: tuple[str, ...], prefix: int, suffix: int, varying: tuple[bool, bool]
) -> bool:
    """Whether the runs short[prefix:len-suffix] and long[prefix:len-suffix] are one value printed two ways.
    `varying` says, for each, whether mining made its whole run wildcards (a slot known to vary)."""
    mine = short[prefix : len(short) - suffix]
    theirs = long[prefix : len(long) - suffix]
    if len(mine) > MAX_RUN_TOKENS or len(theirs) > MAX_RUN_TOKENS:
        return False
    for form in (short, long):
        # The message's own first word is never part of a value.
        first = _first_word(form)
        if prefix <= first < len(form) - suffix:
            return False
    shared = short[:prefix] + short[len(short) - suffix :]
    if sum(1 for token in shared if _word(token)) < MIN_SHARED_WORDS:
        return False
    if _loose(short, prefix, len(short) - suffix) and _loose(long, prefix, len(long) - suffix):
        # Of equal lengths, the runs are data printed two ways ("<NUM>:<NUM>" / "<<NUM> sec"): mining compares
        # one position at a time, so it cannot see a value that differs in several.
        return len(short) != len(long) or (_holds_data(mine) and _holds_data(theirs))
    if len(short) == len(long) or not mine:
        return False
    before = _before(short, prefix)
    if before in ENUM_NOUNS:
        # An enumeration's values are the failure ("state SHIPPED"), whatever their length.
        return False
    if _quoted(mine) and _quoted(theirs):
        return True
    if len(mine) > MAX_VALUE_TOKENS or len(theirs) > MAX_VALUE_TOKENS:
        return False
    if (varying[0] and (_is_value(theirs) or _quoted(theirs))) or (varying[1] and (_is_value(mine) or _quoted(mine))):
        # A slot already known to vary takes a value of any length.
        return True
    after = _word(short[len(short) - suffix]) if suffix else ""
    return (before in ENTITY_NOUNS or after in ENTITY_NOUNS) and _is_value(mine) and _is_value(theirs)


def _linked(first: tuple[str, ...], second: tuple[str, ...], forms: dict[tuple[str, ...], tuple[str, ...]]) -> bool:
    """Whether two templates differ in one run that holds a value on both sides (see the module docstring)."""
    short, long = (first, second) if len(first) <= len(second) else (second, first)
    if len(long) - len(short) > MAX_RUN_TOKENS:
        return False
    limit = len(short)
    prefix = 0
    while prefix < limit and short[prefix] == long[prefix]:
        prefix += 1
    suffix = 0
    while suffix < limit - prefix and short[-1 - suffix] == long[-1 - suffix]:
        suffix += 1
    varying = (
        all(is_wildcard(token) for token in forms[short][prefix : len(short) - suffix]),
        all(is_wildcard(token) for token in forms[long][prefix : len(long) - suffix]),
    )
    return _run_is_value(short, long, prefix, suffix, varying)


def _same_remainder(templates: list[tuple[str, ...]]) -> Iterable[list[tuple[int, bool]]]:
    """Sets of templates that are equal once one run of at most MAX_RUN_TOKENS is cut out of each, with the
    rest holding MIN_SHARED_WORDS words: the only pairs that can be one run apart. Yields [(index, whether the
    cut run holds data)], so comparing pairs costs what the candidates cost, not the square of the cluster.
    Remainders are compared by hash: a collision only adds a pair that `_linked` turns down."""
    buckets: dict[tuple[int, int, int, int], list[tuple[int, bool]]] = defaultdict(list)
    # Templates of one length are linked only through runs that hold data.
    one_length = len({len(template) for template in templates}) == 1
    for index, template in enumerate(templates):
        length = len(template)
        # Chained hashes of every prefix and every suffix, each from the one before.
        heads = [0]
        words = [0]
        data = [0]
        for token in template:
            heads.append(hash((heads[-1], token)))
            words.append(words[-1] + (1 if token.lstrip()[:1].isalpha() else 0))
            data.append(data[-1] + (1 if ">" in token else 0))
        tails = [0]
        for token in reversed(template):
            tails.append(hash((tails[-1], token)))
        tails.reverse()
        if one_length and not data[length]:
            continue
        first = _first_word(template)
        for start in range(length + 1):
            # The run never holds the first word, and the longer it is the fewer words are left outside it.
            last = min(length, start + MAX_RUN_TOKENS, first if start <= first else length)
            most = words[start] + words[length] - MIN_SHARED_WORDS
            head = heads[start]
            for end in range(start, last + 1):
                if words[end] > most:
                    break
                holds_data = data[end] > data[start]
                if holds_data or not one_length:
                    buckets[(head, tails[end], start, length - end)].append((index, holds_data))
    return (members for members in buckets.values() if len(members) > 1)


# Up to this many templates, a cluster's pairs are compared one by one (`_one_run_apart`): cheaper than hashing
# every cut of every template when the cluster is small, as most are.
PAIRWISE_TEMPLATES = 64

# A template with its running counts of words and of data tokens (index i: among the first i tokens) and the
# position of its first word: what `_cut_fits` reads.
Shape = tuple[tuple[str, ...], list[int], list[int], int]


def _shape(template: tuple[str, ...]) -> Shape:
    words = [0]
    data = [0]
    for token in template:
        words.append(words[-1] + (1 if token.lstrip()[:1].isalpha() else 0))
        data.append(data[-1] + (1 if ">" in token else 0))
    return template, words, data, _first_word(template)


def _cut_fits(shape: Shape, start: int, suffix: int) -> bool:
    """Whether cutting template[start:len - suffix] out meets `_same_remainder`'s conditions: a run of at most
    MAX_RUN_TOKENS without the first word, MIN_SHARED_WORDS words left outside."""
    template, words, _, first = shape
    end = len(template) - suffix
    if end < start or end - start > MAX_RUN_TOKENS or start <= first < end:
        return False
    return words[start] + words[-1] - words[end] >= MIN_SHARED_WORDS


def _holds_data_between(shape: Shape, start: int, end: int) -> bool:
    return shape[2][end] > shape[2][start]


class _Shapes:
    """The shape of each of a list of templates, made when first asked for: most pairs are turned down on their
    lengths or their common ends, before any cut is looked at."""

    def __init__(self, templates: list[tuple[str, ...]]) -> None:
        self.templates = templates
        self._made: dict[int, Shape] = {}

    def __getitem__(self, index: int) -> Shape:
        shape = self._made.get(index)
        if shape is None:
            shape = self._made[index] = _shape(self.templates[index])
        return shape


def _one_run_apart(shapes: _Shapes, first: int, second: int) -> bool:
    """Whether two templates would share a bucket of `_same_remainder` (with both runs holding data when they are
    of one length): the same candidates, found by comparing the two directly.

    Every cut keeps a common prefix and a common suffix, so the longest ones (or, where they overlap in the
    shorter template, the cuts that leave nothing of it in the run) meet the conditions whenever any cut does;
    only data, for templates of one length, can call for a longer run."""
    if len(shapes.templates[first]) > len(shapes.templates[second]):
        first, second = second, first
    short_tokens, long_tokens = shapes.templates[first], shapes.templates[second]
    length, long_length = len(short_tokens), len(long_tokens)
    if long_length - length > MAX_RUN_TOKENS:
        return False
    prefix = 0
    while prefix < length and short_tokens[prefix] == long_tokens[prefix]:
        prefix += 1
    suffix = 0
    while suffix < length and short_tokens[-1 - suffix] == long_tokens[-1 - suffix]:
        suffix += 1
    if prefix + suffix < long_length - MAX_RUN_TOKENS:
        return False
    short, long = shapes[first], shapes[second]
    if length != long_length:
        if prefix + suffix <= length:
            return _cut_fits(short, prefix, suffix) and _cut_fits(long, prefix, suffix)
        return any(
            _cut_fits(short, start, length - start) and _cut_fits(long, start, length - start)
            for start in range(length - suffix, prefix + 1)
        )
    if not (_cut_fits(short, prefix, suffix) and _cut_fits(long, prefix, suffix)):
        return False
    for start in range(prefix, max(-1, prefix - MAX_RUN_TOKENS - 1), -1):
        for end in range(length - suffix, min(length, start + MAX_RUN_TOKENS) + 1):
            if (
                _holds_data_between(short, start, end)
                and _holds_data_between(long, start, end)
                and _cut_fits(short, start, length - end)
                and _cut_fits(long, start, length - end)
            ):
                return True
    return False


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
        shapes = _Shapes(ordered)
        for left in range(len(ordered)):
            for right in range(left + 1, len(ordered)):
                if (
                    root(left) != root(right)
                    and _one_run_apart(shapes, left, right)
                    and _linked(ordered[left], ordered[right], forms)
                ):
                    parent[root(right)] = root(left)
        return _heads(ordered, forms, root)
    checked: set[tuple[int, int]] = set()
    for members in _same_remainder(ordered):
        for position, (left, left_data) in enumerate(members):
            for right, right_data in members[position + 1 :]:
                if root(left) == root(right) or (left, right) in checked:
                    continue
                if len(ordered[left]) == len(ordered[right]) and not (left_data and right_data):
                    continue
                checked.add((left, right))
                if _linked(ordered[left], ordered[right], forms):
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
    position = _first_word(tokens)
    return tokens[position].strip() if position >= 0 else ""
