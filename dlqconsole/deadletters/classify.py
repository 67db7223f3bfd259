"""Classify an error into a failure reason from its type and message.

The rules are ordered: the first that matches wins. Types are matched on their last dotted component
(`requests.exceptions.ReadTimeout` -> `ReadTimeout`), messages on words, so the same rules cover Python, Java,
Go and Node errors. Returns None when nothing is known, and the caller falls back to the broker's reason.
"""

from __future__ import annotations

import functools
import re

from dlqconsole.deadletters.models import FailureReason

RULES: list[tuple[FailureReason, re.Pattern[str], re.Pattern[str]]] = [
    (
        FailureReason.RATE_LIMITED,
        re.compile(r"RateLimit|Throttl|TooManyRequests|QuotaExceeded", re.I),
        re.compile(r"rate.?limit|too many requests|throttl|quota exceeded|slow down", re.I),
    ),
    (
        FailureReason.TIMEOUT,
        re.compile(r"Timeout|TimedOut|DeadlineExceeded|SocketTimeout", re.I),
        re.compile(r"timed? ?out|timeout|deadline exceeded|took too long", re.I),
    ),
    (
        FailureReason.NETWORK_ERROR,
        re.compile(r"Connection|Network|Socket|Unreachable|EOF|BrokenPipe|DNS|Resolve|SSL|ECONN|Unavailable", re.I),
        re.compile(
            r"connection (reset|refused|aborted|closed|error)|network|unreachable|broken pipe|ECONNRESET|"
            r"ECONNREFUSED|EHOSTUNREACH|ENOTFOUND|name or service not known|getaddrinfo|no route to host|"
            r"service unavailable|bad gateway|ssl|eof occurred|socket",
            re.I,
        ),
    ),
    (
        FailureReason.AUTH,
        re.compile(r"Auth|Permission|Forbidden|AccessDenied|Unauthori[sz]ed|Credential|Token", re.I),
        re.compile(
            r"unauthori[sz]ed|forbidden|access denied|permission denied|invalid token|token expired|"
            r"authentication failed|invalid credentials|not authori[sz]ed",
            re.I,
        ),
    ),
    (
        FailureReason.NOT_FOUND,
        re.compile(r"NotFound|DoesNotExist|NoSuch|Missing|KeyError|LookupError|FileNotFound", re.I),
        re.compile(r"not[ _]found|does not exist|no such|unknown (id|user|order|key)|missing", re.I),
    ),
    (
        FailureReason.CONFLICT,
        re.compile(r"Conflict|Duplicate|IntegrityError|UniqueViolation|AlreadyExists|OptimisticLock|Concurren", re.I),
        re.compile(
            r"conflict|duplicate|already exists|unique constraint|version mismatch|optimistic lock|"
            r"deadlock",
            re.I,
        ),
    ),
    (
        FailureReason.VALIDATION_FAILED,
        re.compile(
            r"Validation|Invalid|ValueError|TypeError|Schema|Parse|Decode|Malformed|Format|Constraint|"
            r"IllegalArgument|BadRequest|Unprocessable|JSON",
            re.I,
        ),
        re.compile(
            r"validat|invalid|required|must be|malformed|cannot parse|could not parse|unexpected token|"
            r"unprocessable|bad request|schema|not a valid|out of range|too long|expected",
            re.I,
        ),
    ),
    (
        FailureReason.INTERNAL,
        re.compile(r"Error|Exception|Panic|Fault", re.I),
        re.compile(r"internal server error|panic|null ?pointer|segmentation|assert", re.I),
    ),
]


# Lower-case words of which each rule's message pattern needs at least one (every alternative of the pattern
# contains one of them). Checking them with `in` costs a fraction of a case-insensitive regex search, so the
# search runs only for rules whose words occur: same answers, a few times faster (classification runs for
# every ingested message).
KEYWORDS: dict[FailureReason, tuple[str, ...]] = {
    FailureReason.RATE_LIMITED: ("rate", "too many requests", "throttl", "quota exceeded", "slow down"),
    FailureReason.TIMEOUT: ("time", "deadline exceeded", "took too long"),
    FailureReason.NETWORK_ERROR: (
        "connection ",
        "network",
        "unreachable",
        "broken pipe",
        "econnre",
        "ehostunreach",
        "enotfound",
        "name or service not known",
        "getaddrinfo",
        "no route to host",
        "service unavailable",
        "bad gateway",
        "ssl",
        "eof occurred",
        "socket",
    ),
    FailureReason.AUTH: (
        "unauthori",
        "forbidden",
        "access denied",
        "permission denied",
        "invalid token",
        "token expired",
        "authentication failed",
        "invalid credentials",
        "not authori",
    ),
    FailureReason.NOT_FOUND: ("not found", "not_found", "does not exist", "no such", "unknown ", "missing"),
    FailureReason.CONFLICT: (
        "conflict",
        "duplicate",
        "already exists",
        "unique constraint",
        "version mismatch",
        "optimistic lock",
        "deadlock",
    ),
    FailureReason.VALIDATION_FAILED: (
        "validat",
        "invalid",
        "required",
        "must be",
        "malformed",
        "parse",
        "unexpected token",
        "unprocessable",
        "bad request",
        "schema",
        "not a valid",
        "out of range",
        "too long",
        "expected",
    ),
    FailureReason.INTERNAL: ("internal server error", "panic", "null", "segmentation", "assert"),
}
MESSAGE_RULES = [(reason, message_pattern, KEYWORDS[reason]) for reason, _, message_pattern in RULES]

# An HTTP status code counts only where the text says it is one ("status 503", "HTTP/1.1 429", "returned 404",
# "code=500"): a bare number is as likely an amount, a count or an id ("refund of 500 EUR failed"), and reading it
# as a status would file the same failure under different reasons (and patterns) as the number varies.
# Found in two steps, both cheap: a three-digit number first, then the words just before it.
# Not after a digit or a dot; the lookbehind comes after the first digit so the pattern starts with a character
# set, which the regex engine looks for quickly (a leading lookbehind makes it try every position).
STATUS_NUMBER = re.compile(r"[1-5](?<![\d.][1-5])\d\d(?![\d.])")
STATUS_CONTEXT = re.compile(
    r"(?:\b(?:status|http(?:/[\d.]+)?|code|response|responded|returned|got|failed|error)"
    r"(?:\s+(?:code|status|with|of|was|is))*[\s:=#(\[]{1,3})$",
    re.I,
)
# How far before the number its context is looked for.
STATUS_CONTEXT_CHARS = 40


def status_codes(text: str) -> list[int]:
    """The HTTP status codes the text names as such, in order."""
    found = []
    for number in STATUS_NUMBER.finditer(text):
        start, end = number.span()
        # A reply code as client libraries print it: "(404, 'NOT_FOUND - ...')", "Exception (503)".
        in_parentheses = start > 0 and text[start - 1] == "(" and text[end : end + 1] in (",", ")")
        if in_parentheses or STATUS_CONTEXT.search(text, max(0, start - STATUS_CONTEXT_CHARS), start):
            found.append(int(number.group()))
    return found


STATUS_REASONS = {
    429: FailureReason.RATE_LIMITED,
    408: FailureReason.TIMEOUT,
    504: FailureReason.TIMEOUT,
    502: FailureReason.NETWORK_ERROR,
    503: FailureReason.NETWORK_ERROR,
    401: FailureReason.AUTH,
    403: FailureReason.AUTH,
    404: FailureReason.NOT_FOUND,
    410: FailureReason.NOT_FOUND,
    409: FailureReason.CONFLICT,
    400: FailureReason.VALIDATION_FAILED,
    422: FailureReason.VALIDATION_FAILED,
    500: FailureReason.INTERNAL,
}
# Addresses and quoted values are names, not words: "POST https://api.example/v1/network-settings failed",
# "GET /users/missing-avatar", "ssl.example.com:443 closed" or "missing field 'network_id'" say nothing about the
# failure through the words inside them (and would file the same failure under different reasons as the value
# varies). The words rules read skip them.
ADDRESS = re.compile(
    r"\b[a-z][a-z0-9+.-]*://\S+"  # a URL
    r"|(?<![\w/])/[\w.~%-]+(?:/[\w.~%-]*)+"  # a path of two or more parts
    r"|\b[\w-]+(?:\.[\w-]+)+:\d+\b"  # host:port
    # One word in single quotes or backticks ("missing field 'network_id'"): a value, like an address. (Quoted
    # phrases stay: "('Connection aborted.', ...)", "'503 Service Unavailable'" are the error's own words.)
    r"|(?<!\w)'[^'\s]{1,80}'(?!\w)|`[^`\s]{1,80}`",
    re.I,
)

# The rules' order, for choosing between a status code and a phrase when both are in the text.
RULE_ORDER = {reason: position for position, (reason, _, _) in enumerate(RULES)}


@functools.lru_cache(maxsize=4096)
def _type_reason(short_type: str) -> FailureReason | None:
    """The reason a type names, by the specific rules (INTERNAL is only a catch-all). Remembered: a service
    raises a handful of types, and each is otherwise matched against every rule for every message."""
    for reason, type_pattern, _ in RULES[:-1]:
        if type_pattern.search(short_type):
            return reason
    return None


def classify(*, error_type: str, message: str, stack_trace: str = "") -> FailureReason | None:
    if not error_type and not message and not stack_trace:
        return None
    short_type = error_type.rsplit(".", 1)[-1].rsplit("$", 1)[-1]
    head = message[:2000]
    # The type is the stronger signal ("ValidationError: connection field missing" is a validation error);
    # INTERNAL is only a type-level catch-all, so try the specific rules on the type first, then on the text.
    if short_type:
        by_type = _type_reason(short_type)
        if by_type is not None:
            return by_type
    # The keywords are looked for in the whole text (a cheap over-approximation); the rule's own expression then
    # reads the text without its addresses, blanked once, only when some keyword is there.
    lowered = head.lower()
    words: str | None = None
    by_status = next((STATUS_REASONS[code] for code in status_codes(head) if code in STATUS_REASONS), None)
    for reason, message_pattern, keywords in MESSAGE_RULES:
        if by_status is not None and RULE_ORDER[by_status] <= RULE_ORDER[reason]:
            return by_status
        for keyword in keywords:
            if keyword in lowered:
                if words is None:
                    words = ADDRESS.sub(" ", head) if any(mark in head for mark in "/:'`") else head
                if message_pattern.search(words):
                    return reason
                break
    if by_status is not None:
        return by_status
    if short_type or stack_trace:
        return FailureReason.INTERNAL
    return FailureReason.INTERNAL if head else None


def clear_cache() -> None:
    """Forget the reasons remembered for types (benchmarks measure the work, not the cache)."""
    _type_reason.cache_clear()
