"""What a broker's URLs say: the management API to ask, the URL without its password, the virtual host."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote, urlsplit, urlunsplit

DEFAULT_API_PORT = 15672
AMQP_SCHEMES = ("amqp", "amqps")


@dataclass(frozen=True)
class Api:
    base: str  # http(s)://host:port/ without credentials
    auth: tuple[str, str] | None
    vhost: str

    def __str__(self) -> str:
        return self.base.rstrip("/")


def api_from_urls(*, amqp_url: str, configured: str) -> Api | None:
    """The management API to ask: `configured`, or one derived from the AMQP URL (same host and credentials, port
    15672); None when it is "off". The virtual host is the AMQP URL's."""
    configured = (configured or "").strip()
    if configured.lower() == "off":
        return None
    amqp = urlsplit(amqp_url)
    vhost = unquote(amqp.path[1:]) if len(amqp.path) > 1 else "/"
    if configured:
        parts = urlsplit(configured)
    else:
        scheme = "https" if amqp.scheme == "amqps" else "http"
        host = amqp.hostname or "localhost"
        host = f"[{host}]" if ":" in host else host
        netloc = f"{amqp.username or 'guest'}:{amqp.password or 'guest'}@{host}:{DEFAULT_API_PORT}"
        parts = urlsplit(f"{scheme}://{netloc}/")
    auth = (unquote(parts.username or ""), unquote(parts.password or "")) if parts.username is not None else None
    host = parts.hostname or "localhost"
    host = f"[{host}]" if ":" in host else host
    netloc = f"{host}:{parts.port}" if parts.port else host
    path = parts.path.rstrip("/") + "/"
    return Api(base=urlunsplit((parts.scheme, netloc, path, "", "")), auth=auth, vhost=vhost)


def without_password(url: str) -> str:
    """The URL as pages, logs and audit rows may show it: the user name stays, the password and the query go (a
    query can carry key files' passphrases)."""
    try:
        parts = urlsplit(url.strip())
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "(not a URL)"
    if not parts.scheme or not host:
        return "(not a URL)"
    host = f"[{host}]" if ":" in host else host
    user = f"{parts.username}@" if parts.username else ""
    netloc = f"{user}{host}:{port}" if port else f"{user}{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def vhost_name(url: str) -> str:
    parts = urlsplit(url)
    return unquote(parts.path[1:]) if len(parts.path) > 1 else "/"


def check_amqp_url(url: str) -> str:
    """The reason `url` is no AMQP URL a broker can have, or "" when it is one."""
    try:
        parts = urlsplit(url.strip())
        parts.port  # noqa: B018  (raises ValueError on a bad port)
    except ValueError:
        return "its port is not a number from 0 to 65535"
    if parts.scheme not in AMQP_SCHEMES:
        return "it must start with amqp:// or amqps://"
    if not parts.hostname:
        return "it names no host"
    return ""
