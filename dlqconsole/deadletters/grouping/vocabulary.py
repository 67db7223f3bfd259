"""The words template mining reads a masked template by: wildcards and masked data, a token as a word, the
message's first word (after a leading "qualified.name:" label), the word before or after a slot, and the nouns and
word shapes that decide how much evidence a varying slot needs (grouping.mining, grouping.linking).
"""

from __future__ import annotations

import functools
import re

WILDCARD = "<*>"


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


def is_data(token: str) -> bool:
    """A masked value (`<NUM>`, `'<ID>'`): the slot it sits in carries data."""
    value = token.strip().strip("'\"`")
    return value.startswith("<") and value.endswith(">")


def lower_word(token: str) -> str:
    """The token as a lower-case word, or "" for punctuation, placeholders and wildcards."""
    word = token.strip()
    if not word[:1].isalpha():
        return ""
    return word.lower()


# A qualified name ("com.example.jobs.cleanup", "orders.worker-2") standing before a colon at the start of a message
# is the logger, job or component that printed it, not the message's own wording.
LABEL = re.compile(r"[A-Za-z][\w-]*(?:\.[\w-]+)+")


# A name in UpperCamelCase with two humps or more ("PurgeSessionsJob", "OrderConsumer"): a class, a job, a worker.
CLASS_NAME = re.compile(r"[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]+)+")


def clear_cache() -> None:
    """Forget the first words remembered (benchmarks measure the work, not the cache)."""
    first_word.cache_clear()


# Remembered: mining asks for a form's first word at every slot of it, linking for every pair of templates.
@functools.lru_cache(maxsize=20000)
def first_word(form: tuple[str, ...]) -> int:
    """The position of the message's first word (the first token that starts with a letter, after a leading
    "qualified.name:" label), or -1."""
    first = -1
    for position, token in enumerate(form):
        if token.lstrip()[:1].isalpha():
            first = position
            break
    if first >= 0 and first + 1 < len(form) and form[first + 1] == ":":
        if LABEL.fullmatch(form[first].strip()):
            for position in range(first + 2, len(form)):
                if form[position].lstrip()[:1].isalpha():
                    return position
        elif address_label(form) and first + 3 < len(form):
            return first + 3
    if (
        first >= 0
        and first + 1 < len(form)
        and form[first + 1][1:2].islower()
        and form[first + 1].startswith(" ")
        and form[first].lstrip()[:1].isupper()
        and CLASS_NAME.fullmatch(form[first].strip())
    ):
        # "PurgeSessionsJob failed: ...": a class, job or worker name is the message's subject; its wording starts
        # after it.
        return first + 1
    return first


def address_label(form: tuple[str, ...]) -> bool:
    """Whether the message opens with a "host:port" its first word tells about ("wpad:80 error : ...",
    "ssl.gstatic.com:443 open through proxy ..."): the address is the line's subject, a value, not its wording.
    An address followed by a colon ("redis:6379: connection refused") is a prefix naming the dependency; it stays."""
    return (
        len(form) > 3
        and form[0][:1].isalpha()
        and form[1] == ":"
        and form[2] == "<NUM>"
        and form[3].startswith(" ")
        and form[3][1:2].isalpha()
    )


def word_before(form: tuple[str, ...], position: int) -> str:
    """The word before a position ("user" in "user alice" and in "user=alice"), or ""."""
    index = position - 1
    while index >= 0 and form[index].strip() in {"=", ":", "'", '"'}:
        index -= 1
    return lower_word(form[index]) if index >= 0 and not is_wildcard(form[index]) else ""


def word_after(form: tuple[str, ...], position: int) -> str:
    """The word right after a position ("queue" in "the orders queue"), or ""."""
    index = position + 1
    if index < len(form) and form[index].startswith(" ") and not is_wildcard(form[index]):
        return lower_word(form[index])
    return ""
