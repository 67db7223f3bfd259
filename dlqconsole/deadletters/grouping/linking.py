"""Linking templates of different token counts (or of one, through data printed two ways) that differ by one run
of values: `linked` decides a pair; `same_remainder` (hashing every cut) and `one_run_apart` (one pair at a time)
find the pairs worth asking about. grouping.mining's generalize_all joins the linked templates into groups.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from dlqconsole.deadletters.grouping.vocabulary import (
    ENTITY_NOUNS,
    ENUM_NOUNS,
    first_word,
    is_data,
    is_wildcard,
    lower_word,
    word_before,
)

# Merging across token counts (docs/grouping.md, "Template mining"). The longest run a value may take where the
# other side holds words (a name, a wildcard's value).
MAX_VALUE_TOKENS = 4
# The longest run of data, punctuation or a quoted text that may differ.
MAX_RUN_TOKENS = 12
# Fixed words the two templates must share outside the run.
MIN_SHARED_WORDS = 2
QUOTES = "'\"`"
BRACKETS = frozenset("()[]")


def _is_punctuation(token: str) -> bool:
    """A mark that holds no value: not a wildcard, and not a quoted value ("'<'" and "''" are values)."""
    return not any(character.isalnum() for character in token) and not is_wildcard(token) and not _quoted((token,))


def _loose(form: tuple[str, ...], start: int, end: int) -> bool:
    """Whether form[start:end] holds only data: wildcards, masked values, punctuation and units of a value
    ("(<NUM> KB)")."""
    for position in range(start, end):
        token = form[position]
        if is_wildcard(token) or is_data(token) or _is_punctuation(token):
            continue
        # A word right after masked data is its unit ("<NUM> KB"), unless it names a key ("<IP> user=root").
        following = form[position + 1].strip() if position + 1 < len(form) else ""
        if (
            token.startswith(" ")
            and token.strip().isalpha()
            and is_data(form[position - 1] if position > 0 else "")
            and following not in {"=", ":"}
        ):
            continue
        return False
    return True


def _holds_data(run: tuple[str, ...]) -> bool:
    return any(is_wildcard(token) or is_data(token) for token in run)


def _is_value(run: tuple[str, ...]) -> bool:
    """Words or data, no punctuation but balanced brackets ("LOCAL(<NUM>)"), and no noun that names a kind of
    thing or an enumeration."""
    text = "".join(run)
    if text.count("(") != text.count(")") or text.count("[") != text.count("]"):
        return False
    for token in run:
        word = lower_word(token)
        if is_wildcard(token) or is_data(token) or token in BRACKETS:
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
    short: tuple[str, ...],
    long: tuple[str, ...],
    prefix: int,
    suffix: int,
    forms: dict[tuple[str, ...], tuple[str, ...]],
) -> bool:
    """Whether the runs short[prefix:len-suffix] and long[prefix:len-suffix] are one value printed two ways.
    `forms`: what mining made of each template (a run it made all wildcards is a slot known to vary)."""
    mine = short[prefix : len(short) - suffix]
    theirs = long[prefix : len(long) - suffix]
    if len(mine) > MAX_RUN_TOKENS or len(theirs) > MAX_RUN_TOKENS:
        return False
    for form in (short, long):
        # The message's own first word is never part of a value.
        first = first_word(form)
        if prefix <= first < len(form) - suffix:
            return False
    if not _shares_words(short, prefix, suffix):
        return False
    if _loose(short, prefix, len(short) - suffix) and _loose(long, prefix, len(long) - suffix):
        # Of equal lengths, the runs are data printed two ways ("<NUM>:<NUM>" / "<<NUM> sec"): mining compares
        # one position at a time, so it cannot see a value that differs in several.
        return len(short) != len(long) or (_holds_data(mine) and _holds_data(theirs))
    if len(short) == len(long) or not mine:
        return False
    before = word_before(short, prefix)
    if before in ENUM_NOUNS:
        # An enumeration's values are the failure ("state SHIPPED"), whatever their length.
        return False
    if _quoted(mine) and _quoted(theirs):
        return True
    if len(mine) > MAX_VALUE_TOKENS or len(theirs) > MAX_VALUE_TOKENS:
        return False
    varying = (
        _all_wildcards(forms[short][prefix : len(short) - suffix]),
        _all_wildcards(forms[long][prefix : len(long) - suffix]),
    )
    if (varying[0] and (_is_value(theirs) or _quoted(theirs))) or (varying[1] and (_is_value(mine) or _quoted(mine))):
        # A slot already known to vary takes a value of any length.
        return True
    after = lower_word(short[len(short) - suffix]) if suffix else ""
    return (before in ENTITY_NOUNS or after in ENTITY_NOUNS) and _is_value(mine) and _is_value(theirs)


def linked(first: tuple[str, ...], second: tuple[str, ...], forms: dict[tuple[str, ...], tuple[str, ...]]) -> bool:
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
    return _run_is_value(short, long, prefix, suffix, forms)


def _shares_words(short: tuple[str, ...], prefix: int, suffix: int) -> bool:
    """Whether MIN_SHARED_WORDS words (tokens that start with a letter, as `lower_word` reads them) stand outside
    the run short[prefix:len-suffix]."""
    words = 0
    for token in short[:prefix] + short[len(short) - suffix :]:
        if token.strip()[:1].isalpha():
            words += 1
            if words >= MIN_SHARED_WORDS:
                return True
    return False


def _all_wildcards(run: tuple[str, ...]) -> bool:
    return all(is_wildcard(token) for token in run)


def same_remainder(templates: list[tuple[str, ...]]) -> Iterable[list[tuple[int, bool]]]:
    """Sets of templates that are equal once one run of at most MAX_RUN_TOKENS is cut out of each, with the
    rest holding MIN_SHARED_WORDS words: the only pairs that can be one run apart. Yields [(index, whether the
    cut run holds data)], so comparing pairs costs what the candidates cost, not the square of the cluster.
    Remainders are compared by hash: a collision only adds a pair that `linked` turns down."""
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
        first = first_word(template)
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


# A template with its running counts of words and of data tokens (index i: among the first i tokens) and the
# position of its first word: what `_cut_fits` reads.
Shape = tuple[tuple[str, ...], list[int], list[int], int]


def _shape(template: tuple[str, ...]) -> Shape:
    words = [0]
    data = [0]
    for token in template:
        words.append(words[-1] + (1 if token.lstrip()[:1].isalpha() else 0))
        data.append(data[-1] + (1 if ">" in token else 0))
    return template, words, data, first_word(template)


def _cut_fits(shape: Shape, start: int, suffix: int) -> bool:
    """Whether cutting template[start:len - suffix] out meets `same_remainder`'s conditions: a run of at most
    MAX_RUN_TOKENS without the first word, MIN_SHARED_WORDS words left outside."""
    template, words, _, first = shape
    end = len(template) - suffix
    if end < start or end - start > MAX_RUN_TOKENS or start <= first < end:
        return False
    return words[start] + words[-1] - words[end] >= MIN_SHARED_WORDS


def _holds_data_between(shape: Shape, start: int, end: int) -> bool:
    return shape[2][end] > shape[2][start]


class Shapes:
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


def one_run_apart(shapes: Shapes, first: int, second: int) -> bool:
    """Whether two templates would share a bucket of `same_remainder` (with both runs holding data when they are
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
