"""Template mining: find the variable words that masking could not recognise.

Input: the distinct masked templates of one *cluster* (same error type, failure reason and token count).
Output: for each template, the generalised template it belongs to (`user <*> not found`).

The result is a pure function of the *set* of templates: it does not depend on the order they arrived in, on
how many messages each one had, or on which process saw them. That is what lets several consumer processes
(and `dlq fingerprint`, which sees all its input at once) reach the same patterns: whoever recomputes a cluster
from the same set gets the same answer.

The rule, in the spirit of Drain but order-free: a position of a template is variable when enough templates
agree with it on every other position and differ there ("user alice not found", "user bob not found").
"Enough" depends on the words around the slot:
- right after (or before) a noun that names a kind of thing (`user`, `queue`, `region`, `table`, `host`), two
  different values suffice: what follows such a noun is that thing's name;
- after a noun that introduces an enumeration (`status`, `state`, `code`, `type`, `reason`), the values are
  fixed words that name different failures ("state SHIPPED" / "state CANCELLED"); it takes ENUM_VALUES;
- elsewhere it takes PLAIN_VALUES different words;
- the first word of a message never varies unless masking found data there (it is the message's wording).
A slot that a sibling template already holds as a wildcard is variable, and a template matching a
generalised one on all its fixed words joins it. Rounds repeat until nothing changes. A generalised template
must keep at least as many fixed words as wildcards, so chains of merges cannot end in `<*> <*> <*>`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

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


def is_wildcard(token: str) -> bool:
    return token.endswith(WILDCARD)


def _wildcards(form: tuple[str, ...]) -> frozenset[int]:
    return frozenset(position for position, token in enumerate(form) if is_wildcard(token))


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


def _first_word(form: tuple[str, ...]) -> int:
    """The position of the message's first word (the first token that starts with a letter), or -1."""
    for position, token in enumerate(form):
        if token.lstrip()[:1].isalpha():
            return position
    return -1


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
    if (
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
    general = [form for form in forms if any(is_wildcard(token) for token in form)]
    if not general:
        return {form: form for form in forms}
    by_mask: dict[tuple[int, ...], dict[tuple[str, ...], tuple[str, ...]]] = {}
    # Most wildcards first, then the smallest form: a deterministic choice when several match.
    for form in sorted(general, key=lambda form: (-sum(map(is_wildcard, form)), form)):
        mask = tuple(position for position, token in enumerate(form) if is_wildcard(token))
        fixed = tuple(token for token in form if not is_wildcard(token))
        by_mask.setdefault(mask, {}).setdefault(fixed, form)
    masks = sorted(by_mask, key=lambda mask: (-len(mask), mask))
    result: dict[tuple[str, ...], tuple[str, ...]] = {}
    for form in forms:
        own = {position for position, token in enumerate(form) if is_wildcard(token)}
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
