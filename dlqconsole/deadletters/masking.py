"""Masking: a message cut into tokens, with the parts that vary in any system masked (`<NUM>`, `<IP>`, `<UUID>`,
`<PATH>`, ...). A token keeps the whitespace in front of it, so a template is the tokens joined; a quoted value is
one token whatever it contains. `fingerprint` keys and clusters what this makes; docs/grouping.md, "Masking", has
the details.
"""

from __future__ import annotations

import re

MAX_MESSAGE = 2000
MAX_TOKENS = 160
WILDCARD = "<*>"

# Shapes that span several tokens are masked in the text first. Each pattern starts with a literal where it can
# (the regex engine then jumps from one candidate to the next) and runs only when a cheap test says it can match.
# A URL ends before the punctuation that closes a sentence or a label ("failed to fetch http://host/a/b: timeout").
URL = re.compile(
    r"\b([a-z][a-z0-9+.-]*)://([^\s/'\"<>()\[\]{},;?#]*)([^\s'\"<>()\[\]{},;]*?)(?=[.:!?]*(?:[\s'\"<>()\[\]{},;]|$))",
    re.I,
)
EMAIL = re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b")
UNIX_PATH = re.compile(r"/(?<![\w.~/-]/)[\w.@%+~*-]+(?:/[\w.@%+~*-]+)+/?(?:\?[\w.@%+~*=&-]+)?")
PATH = re.compile(UNIX_PATH.pattern + r"|\b[A-Z]:\\[^\s'\"]+")
# A time (":07:") or a date ("-06-") may be in the text: two patterns, since one that starts with a literal is found
# much faster than an alternation.
TIME_HINT = re.compile(r":\d\d:")
DATE_HINT = re.compile(r"-\d\d-")
# A date written with an English month name, as C's ctime, syslog and HTTP print it ("Fri Jun 17 07:07:00 2005",
# "Jun 17 07:07:00", "Sun, 06 Nov 1994 08:49:37 GMT"): the names are part of the time, not words of the message.
_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\.?"
_CLOCK = r"\d{1,2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?: ?(?:[AP]M|UTC|GMT|Z|[+-]\d{2}:?\d{2}|[A-Z]{3,4}T))?"
DATETIME = re.compile(
    r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?\b"
    rf"|\b(?:(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)[a-z]*,? )?(?:{_MONTH} \d{{1,2}}|\d{{1,2}} {_MONTH})(?:,? \d{{4}})?"
    rf" {_CLOCK}(?: \d{{4}}\b)?"
    r"|\b\d{1,2}:\d{2}:\d{2}(?:[.,]\d+)?\b"
)
IPV6 = re.compile(r"(?<![\w:])\[?(?:[0-9a-f]{0,4}:){2,7}[0-9a-f]{1,4}\]?(?::\d{1,5})?(?![\w:])", re.I)
# What every IPv6 address contains (its last two groups): much cheaper to look for than the address itself.
IPV6_HINT = re.compile(r":[0-9a-f]{0,4}:[0-9a-f]", re.I)
# Colon-separated hex pairs longer than an IPv6 address can be (MD5 key fingerprints, hardware serials): one value.
# Six to eight pairs (a MAC address) already read as an address, <IP>.
HEX_PAIRS = re.compile(r"(?<![\w:])(?:[0-9a-f]{2}:){8,}[0-9a-f]{2}(?![\w:])", re.I)

# One token: a URL that masking kept, a placeholder, a quoted value of up to four words (so a free-text value
# does not change the token count; a longer quotation is a nested message, cut up like the rest), a word, or a
# punctuation mark. Each token carries the space before it. The lookarounds keep "can't" from opening a quote.
_URL_TOKEN = r"""[a-z][a-z0-9+.-]*://(?:[^\s'"`<>()\[\]{},;]*[^\s'"`<>()\[\]{},;.:!?])?|"""
_OTHER_TOKENS = (
    r"""<[A-Z][A-Z_]*>|"""
    r"""(?<!\w)'[^'\s]*(?: [^'\s]+){0,3}'(?!\w)|"[^"\s]*(?: [^"\s]+){0,3}"|`[^`\s]*(?: [^`\s]+){0,3}`|"""
    r"""[^\s=:,;()\[\]{}<>"'`|][^\s=:,;()\[\]{}<>"`|]*|\S"""
)
TOKEN = re.compile(" ?(?:" + _URL_TOKEN + _OTHER_TOKENS + ")", re.I)
# The same without the URL, for text without "://" (most): trying a URL at every word costs a fifth of the time.
TOKEN_WITHOUT_URL = re.compile(" ?(?:" + _OTHER_TOKENS + ")", re.I)
INNER_WORD = re.compile(r"[^\s=:,;()\[\]{}<>'\"`|/]+")
DIGIT = re.compile(r"\d")
IPV4 = re.compile(r"(?:\d{1,3}\.){3}\d{1,3}")
NUMBER = re.compile(
    r"[-+]?\d+(?:[.,_]\d+)*(ms|us|µs|ns|s|sec|secs|m|min|mins|h|d|kb|mb|gb|tb|kib|mib|gib|b|%|x)?", re.I
)
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.I)
HEX = re.compile(r"0x[0-9a-f]+|(?=[0-9a-f]*[a-f])[0-9a-f]{6,}", re.I)
# Ids without a digit: a prefix and random letters ("ord_swFSncWCQpKTMN"), hex letters ("deadbeefcafe"), and
# random letters with two runs of capitals ("swFSncWCQpKTMN"; "HTTPSConnectionPool" has one, so it stays).
LETTER_ID = re.compile(r"[a-z]{2,6}_[A-Za-z0-9]{10,}|[a-f]{8,}|[A-Za-z]*?[A-Z]{2}[a-z][A-Za-z]*?[A-Z]{2}[A-Za-z]*")

# A three-digit number right after one of these words, or right before a reason phrase, is an HTTP status: it
# names the failure ("status 404" and "status 503" are different causes), so it is kept.
STATUS_BEFORE = frozenset({"status", "code", "http", "https", "statuscode", "status_code", "response", "returned"})
STATUS_AFTER = frozenset(
    [
        "not",
        "service",
        "bad",
        "internal",
        "gateway",
        "too",
        "unauthorized",
        "forbidden",
        "conflict",
        "unprocessable",
        "client",
        "server",
        "request",
        "precondition",
        "payload",
        "method",
        "gone",
        "locked",
    ]
)
STATUS_TOKENS = frozenset(prefix + str(code) for code in range(100, 600) for prefix in ("", " "))

# Masked tokens by raw token. Most words recur from message to message, so a dictionary lookup replaces the
# classification; it is emptied when full, which bounds the memory taken by one-off ids.
_TOKEN_CACHE: dict[str, str] = {}
TOKEN_CACHE_SIZE = 50000
# Tokens by premasked text: messages that differ only where premasking hides something (a time, a path, an
# address) are cut into tokens once.
_TEXT_CACHE: dict[str, tuple[tuple[str, ...], str]] = {}
TEXT_CACHE_SIZE = 20000


def clear_cache() -> None:
    """Forget the tokens remembered (benchmarks measure the work, not the caches)."""
    _TOKEN_CACHE.clear()
    _TEXT_CACHE.clear()


def _mask_url(match: re.Match[str]) -> str:
    # The host names the dependency ("payments-api" failing is not "search" failing), so it stays; a host with
    # digits is an instance or a region (10.0.3.7, eu-west-1); the port, path and query are data.
    scheme, host, rest = match.groups()
    name = host.partition(":")[0]
    if not name or DIGIT.search(name):
        return "<URL>"
    return f"{scheme.lower()}://{name.lower()}" + ("/…" if rest.strip("/") else "")


# A certificate that fails to verify fails for every host it is presented for: in a TLS failure the host names are
# values ("hooks.acme.io", "*.cdn.example.net"), not the dependency that failed.
TLS_FAILURE = re.compile(r"(?<![\w.-])(?:SSL|TLS|x509|certificate|cert)(?:Error|Exception)?(?![\w.-])", re.I)
HOST_NAME = re.compile(r"(?<![\w.@/-])(?:\*\.)?(?:[a-z0-9][a-z0-9-]*\.)+[a-z][a-z0-9-]*[a-z0-9]\.?(?![\w-])", re.I)
# Names a TLS failure mentions that are not hosts: its own vocabulary, file names and modules.
NOT_HOSTS = re.compile(r"(?:\w+\.)*(?:py|java|go|rb|js|ts|php|cs|rs|pem|crt|key|html|json|c|h)|[\w.]*[A-Z][\w.]*")


def _mask_host(match: re.Match[str]) -> str:
    name = match.group(0)
    if NOT_HOSTS.fullmatch(name.rstrip(".")):
        return name
    return "<HOST>" + ("." if name.endswith(".") else "")


def _mask_tls_url(match: re.Match[str]) -> str:
    return "<URL>"


# A URL whose query holds a space, as an HTTP client prints a request it did not encode ("?q=Calle de Alcala
# 45&limit=5"): the words up to the next parameter belong to the URL.
QUERY_WITH_SPACES = re.compile(r"(\?[^\s?#]*=[^\s&#]*)((?: [^\s=&?#:/]+){1,6})(?=&[^\s=&]+=)")


def _join_query(match: re.Match[str]) -> str:
    return match.group(1) + match.group(2).replace(" ", "+")


def _mask_word(word: str) -> str:
    if DIGIT.search(word) is None:
        if len(word) >= 8 and LETTER_ID.fullmatch(word):
            return "<ID>"
        return word
    # Cheap tests first (`\d` is `isdecimal`), then the patterns only where they can match.
    if word.isdecimal():
        return "<NUM>"
    if "." in word and IPV4.fullmatch(word):
        return "<IP>"
    number = NUMBER.fullmatch(word)
    if number:
        return "<NUM>" + (number.group(1) or "")
    if len(word) == 36 and UUID.fullmatch(word):
        return "<UUID>"
    if HEX.fullmatch(word):
        return "<HEX>"
    return "<ID>"


def _mask_inner(match: re.Match[str]) -> str:
    word = match.group(0)
    return word if word[0] == "<" else _mask_word(word)


def _mask_token(token: str) -> str:
    body = token.lstrip(" ")
    if body[0] in "'\"`" and len(body) > 1:
        masked = INNER_WORD.sub(_mask_inner, body)
    elif body[0] == "<" or "://" in body or (len(body) == 1 and not body.isdigit()):
        masked = body
    else:
        masked = _mask_word(body)
    masked = token[: len(token) - len(body)] + masked
    if len(_TOKEN_CACHE) >= TOKEN_CACHE_SIZE:
        _TOKEN_CACHE.clear()
    _TOKEN_CACHE[token] = masked
    return masked


def _premask(message: str) -> str:
    text = " ".join(message[:MAX_MESSAGE].split())
    # Only a text with a host name (a dot) or a URL has anything a TLS failure changes.
    tls = (
        ("." in text or "://" in text)
        and ("SSL" in text or "ssl" in text or "TLS" in text or "tls" in text or "x509" in text or "ertif" in text)
        and TLS_FAILURE.search(text) is not None
    )
    if "://" in text:
        if "?" in text:
            text = QUERY_WITH_SPACES.sub(_join_query, text)
        text = URL.sub(_mask_tls_url if tls else _mask_url, text)
    if tls:
        text = HOST_NAME.sub(_mask_host, text)
    if "@" in text:
        text = EMAIL.sub("<EMAIL>", text)
    if "\\" in text:
        text = PATH.sub("<PATH>", text)
    elif "/" in text:
        # Without a backslash only the Unix form can match, and the pattern for it alone starts with a literal.
        text = UNIX_PATH.sub("<PATH>", text)
    if TIME_HINT.search(text) or DATE_HINT.search(text):
        text = DATETIME.sub("<DATETIME>", text)
    colons = text.count(":")
    if colons >= 8:
        text = HEX_PAIRS.sub("<HEX>", text)
        colons = text.count(":")
    if ("::" in text or colons >= 4) and IPV6_HINT.search(text):
        text = IPV6.sub("<IP>", text)
    return text


def tokenize(message: str) -> tuple[str, ...]:
    """The masked tokens of a message, each with the space before it: joined, they are the template."""
    return tokenize_joined(message)[0]


def tokenize_joined(message: str) -> tuple[tuple[str, ...], str]:
    """`tokenize`'s tokens and the template they make, joined once."""
    text = _premask(message)
    found = _TEXT_CACHE.get(text)
    if found is None:
        found = _tokenize_masked(text)
        if len(_TEXT_CACHE) >= TEXT_CACHE_SIZE:
            _TEXT_CACHE.clear()
        _TEXT_CACHE[text] = found
    return found


def _tokenize_masked(text: str) -> tuple[tuple[str, ...], str]:
    raw = (TOKEN if "://" in text else TOKEN_WITHOUT_URL).findall(text)[:MAX_TOKENS]
    get = _TOKEN_CACHE.get
    tokens = [get(token) or _mask_token(token) for token in raw]
    if not STATUS_TOKENS.isdisjoint(raw):
        for position, token in enumerate(raw):
            if token in STATUS_TOKENS and _is_status(raw, position):
                tokens[position] = token
    if "'" in text or '"' in text or "`" in text:
        # A value with a digit is masked where it is quoted, and so never referred to.
        repeated = [value for value in QUOTED_WORD.findall(text) if text.count(value) > 1 and not DIGIT.search(value)]
        if repeated:
            _refer_to_quoted(raw, tokens, repeated)
    if (PORT_AFTER_COLON.search(text) or PORT_AFTER_COMMA.search(text) or "port=" in text) and connection_failed(text):
        _keep_ports(raw, tokens)
    if "," in raw:
        tokens = _join_lists(tokens)
    # Two equal masked values side by side join as "> <": one search in C before the tokens are compared.
    template = "".join(tokens)
    if "> <" in template:
        tokens = _join_runs(tokens)
        template = "".join(tokens)
    return tuple(tokens), template


def _join_runs(tokens: list[str]) -> list[str]:
    """A run of one masked value separated by spaces ("blk_1 blk_2 blk_3" as "<ID> <ID> <ID>") is one value, a list
    whatever its length."""
    result = tokens[:1]
    for token in tokens[1:]:
        if token == result[-1] and token[:2] == " <" and token[-1] == ">":
            continue
        result.append(token)
    return result


QUOTE_MARKS = "'\"`"
# A quoted value without spaces, found by its opening quote ("'home-page'", "`pickup_point`").
QUOTED_WORD = re.compile(r"""['"`]([^\s'"`]{3,})['"`]""")


def _refer_to_quoted(raw: list[str], tokens: list[str], values: list[str]) -> None:
    """A quoted value the message repeats ("Reverse for 'home-page' not found. 'home-page' is not a valid view",
    "property 'sizeChart' ... Path: $.sizeChart") is one value: the repetition becomes <REF>, so that the message
    varies in one place, as it does. `values`: the quoted values the text holds more than once."""
    for value in values:
        positions = [position for position, token in enumerate(raw) if value in token]
        first = positions[0]
        body = raw[first].lstrip(" ")
        if len(positions) < 2 or body[1:-1] != value or body[0] not in QUOTE_MARKS or tokens[first] != raw[first]:
            continue
        for position in positions[1:]:
            token = raw[position]
            tokens[position] = token[: len(token) - len(token.lstrip(" "))] + "<REF>"


# A connection that failed names the service it tried: a port after an address ("ECONNREFUSED 10.0.0.7:5432",
# "Connect call failed ('10.0.0.7', 6379)") says which one (postgres, redis) where the address is only a number.
# A number after a colon or a comma ("10.0.0.7:5432", "('10.0.0.7', 6379)"): where a port can be. Two patterns, since
# one that starts with a literal is found much faster than one that starts with a set of characters.
PORT_AFTER_COLON = re.compile(r": ?\d")
PORT_AFTER_COMMA = re.compile(r", ?\d")


def connection_failed(text: str) -> bool:
    """Whether the text says a connection failed: refused, timed out, reset, unreachable."""
    # One substring test after another: a regular expression of alternatives tries each at every position, and a
    # generator over a tuple costs as much again.
    lowered = text.lower()
    return (
        "refused" in lowered
        or "timed out" in lowered
        or "etimedout" in lowered
        or "unreachable" in lowered
        or "ehostunreach" in lowered
        or "i/o timeout" in lowered
        or "no route to host" in lowered
        or (
            # The phrases below all hold "conn": one search rules them all out for most texts.
            "conn" in lowered
            and (
                "econn" in lowered
                or "connect call failed" in lowered
                or "connection timeout" in lowered
                or "connection reset" in lowered
                or "connection error" in lowered
                or "connection failed" in lowered
                or "connect timeout" in lowered
                or " connect to" in lowered
            )
        )
    )


# Ports from here up are the ones an operating system hands out to a client's side of a connection (Linux from
# 32768, IANA from 49152): they name no service.
EPHEMERAL_PORTS = 32768


def _keep_ports(raw: list[str], tokens: list[str]) -> None:
    """Unmask each port: a number below EPHEMERAL_PORTS after an address and a ":" or "," ("10.0.0.7:5432",
    "('10.0.0.7', 6379)"), or the value of a `port=` ("host='10.0.0.7', port=5432")."""
    for position in range(3, len(raw)):
        # The mark before the number first: most tokens follow no ":", "," or "=".
        mark = raw[position - 1]
        if mark not in PORT_MARKS:
            continue
        port = raw[position].lstrip(" ")
        before = raw[position - 2].strip(" '\"")
        if (
            port.isdecimal()
            and 0 < int(port) < EPHEMERAL_PORTS
            and (before.lower() == "port" if mark == "=" else before[-1:].isalnum())
        ):
            tokens[position] = raw[position]


PORT_MARKS = frozenset({":", ",", "="})


def _join_lists(tokens: list[str]) -> list[str]:
    """A list of masked values joined by bare commas ("<IP>,<IP>,<IP>") is one value whatever its length."""
    # Most commas separate other things ("id=<NUM>, user=bob"): look for one between two equal values first.
    position = 0
    while True:
        try:
            position = tokens.index(",", position + 1)
        except ValueError:
            return tokens
        if position + 1 < len(tokens) and _same_value(tokens[position - 1], tokens[position + 1]):
            break
    result: list[str] = []
    for token in tokens:
        if len(result) >= 2 and result[-1] == "," and _same_value(result[-2], token):
            result.pop()
            continue
        result.append(token)
    return result


def _same_value(before: str, after: str) -> bool:
    return after[:1] == "<" and before.lstrip(" ") == after


def _is_status(tokens: list[str], position: int) -> bool:
    return _neighbour(tokens, position, -1) in STATUS_BEFORE or _neighbour(tokens, position, 1) in STATUS_AFTER


def _neighbour(tokens: list[str], position: int, step: int) -> str:
    index = position + step
    while 0 <= index < len(tokens):
        word = tokens[index].strip()
        if word[:1].isalnum():
            return word.lower().rstrip("/.")
        if word not in {":", "=", "/", "(", '"', "'"}:
            return ""
        index += step
    return ""


def mask(message: str) -> str:
    """The message with its variable parts masked, whitespace collapsed to single spaces."""
    return "".join(tokenize(message))
