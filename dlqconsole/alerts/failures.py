"""A failed notification's error, said for people: "connection refused by 127.0.0.1:9" rather than requests'
"Max retries exceeded ... NewConnectionError ... [Errno 111]". The raw text stays on the row (and on the pages,
folded away): the summary is made when the page is drawn, so rows stored before it read the same way."""

from __future__ import annotations

import re
from http import HTTPStatus
from urllib.parse import urlsplit

from django.conf import settings

# requests names the host it tried in its message: HTTPConnectionPool(host='127.0.0.1', port=9).
POOL_HOST = re.compile(r"host='(?P<host>[^']+)', port=(?P<port>\d+)")
HTTP_STATUS = re.compile(r"^HTTP (?P<status>\d{3})\b")
TIMED_OUT = re.compile(r"^Timed out after (?P<after>.+)$")
# (what the raw text contains, what it means), first match wins; {host} is where the channel sends to.
MEANINGS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"Connection refused|Errno 111\b|ECONNREFUSED", re.IGNORECASE), "connection refused by {host}"),
    (
        re.compile(
            r"NameResolutionError|Name or service not known|Temporary failure in name resolution|nodename nor "
            r"servname|getaddrinfo failed|Errno -[23]\b|No address associated",
            re.IGNORECASE,
        ),
        "host name of {host} not found (DNS)",
    ),
    (re.compile(r"No route to host|Errno 113\b", re.IGNORECASE), "no route to {host}"),
    (re.compile(r"Network is unreachable|Errno 101\b", re.IGNORECASE), "network unreachable on the way to {host}"),
    (re.compile(r"timed out", re.IGNORECASE), "{host} did not answer in time"),
    (re.compile(r"CERTIFICATE_VERIFY_FAILED", re.IGNORECASE), "{host}'s TLS certificate is not trusted"),
    (re.compile(r"SSLError|SSL:|TLS", re.IGNORECASE), "TLS handshake with {host} failed"),
    (
        re.compile(r"Connection reset|Connection aborted|RemoteDisconnected|Errno 104\b", re.IGNORECASE),
        "{host} closed the connection without answering",
    ),
    (re.compile(r"SMTPAuthenticationError", re.IGNORECASE), "the mail server {host} refused the login"),
    (re.compile(r"^Recipients refused", re.IGNORECASE), "the mail server {host} refused the recipients"),
    (re.compile(r"^Not an http\(s\) URL", re.IGNORECASE), "the target is not an http(s) URL"),
]


def summarise_failure(error: str, *, kind: str, target: str) -> str:
    """A short reason for a failed send of the given channel kind to the given target; the raw error itself
    (trimmed) when it says nothing we recognise."""
    text = error.strip()
    if not text:
        return ""
    host = _host(text, kind=kind, target=target)
    if found := HTTP_STATUS.match(text):
        status = int(found["status"])
        try:
            phrase = f" ({HTTPStatus(status).phrase})"
        except ValueError:
            phrase = ""
        return f"HTTP {status}{phrase} from {host}"
    if found := TIMED_OUT.match(text):
        return f"timed out after {found['after']} waiting for {host}"
    for pattern, meaning in MEANINGS:
        if pattern.search(text):
            return meaning.format(host=host)
    first_line = text.splitlines()[0]
    return first_line if len(first_line) <= 200 else f"{first_line[:199]}…"


def _host(text: str, *, kind: str, target: str) -> str:
    if found := POOL_HOST.search(text):
        return f"{found['host']}:{found['port']}"
    if kind == "email":
        return f"{settings.EMAIL_HOST}:{settings.EMAIL_PORT}"
    parts = urlsplit(target)
    if not parts.hostname:
        return "the receiver"
    # Only where it goes, never the path or query (webhook URLs often carry a token there).
    return f"{parts.hostname}:{parts.port}" if parts.port else parts.hostname
