"""The one way the console makes outbound HTTP requests (webhook and Slack notifications).

Every request has a connect and a read timeout, never follows redirects and says who is calling, so a slow or
misbehaving receiver costs a bounded amount of time. Failures raise HttpError, which tells whether trying again
later could help (`permanent=False`: network trouble, timeouts, 5xx, 429) or not (`permanent=True`: a bad URL,
a refused address, or a 4xx answer such as 404 or 410).

Addresses in DLQ_WEBHOOK_DENIED_NETWORKS (link-local, where cloud metadata services answer, and the metadata
addresses outside it; 0.0.0.0/8; multicast) are never connected to, nor IPv6 addresses that carry traffic to such
an IPv4 address (IPv4-mapped, NAT64, 6to4, Teredo, IPv4-compatible). The check runs on the addresses the host
name resolves to, inside the connection, and the connection is then made to exactly the address checked: a name
that resolves to something harmless when the channel is saved and to 169.254.169.254 later (DNS rebinding) is
still refused. Loopback and private ranges stay allowed: receivers and Slack proxies inside the network are
legitimate.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import re
import socket
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import requests
import urllib3.exceptions
from django.conf import settings
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import NameResolutionError

USER_AGENT = "dlqconsole-notifier/1"
# Statuses that may succeed when tried again later; every other 4xx means the request itself is wrong.
RETRYABLE_STATUSES = frozenset({408, 409, 425, 429})

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")
# IPv6 addresses whose last 32 bits are an IPv4 address traffic goes to: NAT64's well-known prefix, and the
# deprecated IPv4-compatible form.
NAT64 = ipaddress.ip_network("64:ff9b::/96")
NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")  # RFC 8215
IPV4_COMPATIBLE = ipaddress.ip_network("::/96")


class HttpError(Exception):
    def __init__(self, message: str, *, status: int | None = None, permanent: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.permanent = permanent


class DeniedAddressError(Exception):
    """The target is, or resolves to, an address in DLQ_WEBHOOK_DENIED_NETWORKS. Deliberately not an OSError,
    so urllib3 does not wrap it as a connection failure worth retrying."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@functools.cache
def _parse_networks(networks: tuple[str, ...]) -> tuple[IpNetwork, ...]:
    return tuple(ipaddress.ip_network(network, strict=False) for network in networks)


def denied_networks() -> tuple[IpNetwork, ...]:
    return _parse_networks(tuple(settings.DLQ_WEBHOOK_DENIED_NETWORKS))


def _carried(address: IpAddress) -> list[IpAddress]:
    """The IPv4 addresses an IPv6 address may carry traffic to, else the address itself: 169.254.169.254 is
    reached as ::ffff:169.254.169.254 (IPv4-mapped), 64:ff9b::a9fe:a9fe (NAT64, where the network translates),
    2002:a9fe:a9fe:: (6to4), a Teredo address (its client) and ::a9fe:a9fe (IPv4-compatible, deprecated but still
    routed by some stacks), so each is checked as that IPv4 address. In NAT64's local-use 64:ff9b:1::/48 the
    operator picks the prefix length, and with it where the IPv4 address sits (RFC 6052): every place is checked, so
    a local-use address is refused if any reading of it is."""
    if not isinstance(address, ipaddress.IPv6Address):
        return [address]
    if address.ipv4_mapped is not None:
        return [address.ipv4_mapped]
    if address in NAT64 or (address in IPV4_COMPATIBLE and int(address) > 1):  # not :: nor ::1
        return [ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)]
    if address in NAT64_LOCAL:
        bits = int(address)
        # RFC 6052: after a /48, /56 or /64 prefix the address skips bits 64-71 (the "u" octet); after a /96 it ends
        # the address.
        # A place holding 0.x.x.x is the zeros around an address placed elsewhere (and never translated).
        places = [
            ipaddress.IPv4Address(((bits >> 64) & 0xFFFF) << 16 | (bits >> 40) & 0xFFFF),
            ipaddress.IPv4Address(((bits >> 64) & 0xFF) << 24 | (bits >> 32) & 0xFFFFFF),
            ipaddress.IPv4Address((bits >> 24) & 0xFFFFFFFF),
            ipaddress.IPv4Address(bits & 0xFFFFFFFF),
        ]
        return [place for place in places if place not in THIS_NETWORK] or [address]
    if address.sixtofour is not None:
        return [address.sixtofour]
    if address.teredo is not None:
        return [address.teredo[1]]
    return [address]


def refusal(address: IpAddress, *, host: str | None = None) -> str | None:
    """Why the console will not send to `address` (what `host` resolved to), or None when it may."""
    for plain in _carried(address):
        for network in denied_networks():
            if plain.version == network.version and plain in network:
                if plain.is_link_local:
                    what = "a link-local address (where cloud metadata services answer)"
                elif plain.is_multicast:
                    what = "a multicast address"
                elif plain.is_unspecified or plain in THIS_NETWORK:
                    what = "a 'this network' address, never a receiver"
                else:
                    what = "a denied address"
                shown = f"{address} ({plain})" if plain != address else f"{address}"
                where = f"{host} resolves to {shown}," if host and literal_address(host) is None else f"{shown} is"
                return f"{where} {what}: DLQ_WEBHOOK_DENIED_NETWORKS ({network}) keeps notifications away from it"
    return None


def literal_address(host: str) -> IpAddress | None:
    """The IP address a URL's host names literally (`[fe80::1]` included), or None for a host name."""
    try:
        return ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return None


def _resolve(host: str, port: int) -> list[str]:
    """Every address `host` resolves to, in the resolver's order, without repeats."""
    found = socket.getaddrinfo(host.strip("[]"), port, 0, socket.SOCK_STREAM)
    return list(dict.fromkeys(str(entry[4][0]) for entry in found))


class _GuardedConnectionMixin:
    """Resolves the host itself, refuses when any address is denied, then connects to the checked addresses only
    (urllib3 connects to `_dns_host`; TLS still verifies the certificate against the host name)."""

    host: str
    port: int
    _dns_host: str

    def _new_conn(self) -> socket.socket:
        name = self._dns_host
        try:
            addresses = _resolve(name, self.port)
        except socket.gaierror as error:
            raise NameResolutionError(self.host, self, error) from error  # type: ignore[arg-type]
        for address in addresses:
            reason = refusal(ipaddress.ip_address(address.split("%", 1)[0]), host=self.host)
            if reason is not None:
                raise DeniedAddressError(reason)
        last_error: Exception | None = None
        for address in addresses:
            self._dns_host = address
            try:
                return super()._new_conn()  # type: ignore[misc, no-any-return]
            except urllib3.exceptions.HTTPError as error:
                # The next address may answer (as urllib3 itself tries each); the last error is raised.
                last_error = error
            finally:
                self._dns_host = name
        assert last_error is not None
        raise last_error


class GuardedHTTPConnection(_GuardedConnectionMixin, HTTPConnection):
    pass


class GuardedHTTPSConnection(_GuardedConnectionMixin, HTTPSConnection):
    pass


class GuardedHTTPConnectionPool(HTTPConnectionPool):
    ConnectionCls = GuardedHTTPConnection


class GuardedHTTPSConnectionPool(HTTPSConnectionPool):
    ConnectionCls = GuardedHTTPSConnection


class GuardedAdapter(HTTPAdapter):
    """requests' adapter with connections that refuse denied addresses."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {  # type: ignore[attr-defined]
            "http": GuardedHTTPConnectionPool,
            "https": GuardedHTTPSConnectionPool,
        }


def guarded_session() -> requests.Session:
    """A session whose connections refuse denied addresses (webhooks, brokers' management APIs), with no retries."""
    session = requests.Session()
    adapter = GuardedAdapter(max_retries=0)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


def check_target(url: str) -> None:
    """Refuse a URL whose host is a denied address, before any connection. Behind a proxy the proxy resolves
    the name, so the name is resolved here too (best effort: the proxy may see another answer)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    address = literal_address(host)
    if address is not None:
        addresses = [address]
    elif requests.utils.get_environ_proxies(url):
        try:
            addresses = [ipaddress.ip_address(a.split("%", 1)[0]) for a in _resolve(host, parts.port or 443)]
        except socket.gaierror:
            addresses = []
    else:
        return  # the connection checks what the name resolves to
    for each in addresses:
        reason = refusal(each, host=host)
        if reason is not None:
            raise HttpError(f"Refused: {reason}", permanent=True)


def post_json(
    url: str,
    *,
    payload: Any,
    headers: dict[str, str] | None = None,
    timeout: float | None = None,
    sign: Callable[[bytes], dict[str, str]] | None = None,
) -> requests.Response:
    """POST `payload` as JSON to `url`; return the response when its status is 2xx, raise HttpError otherwise.

    `sign`, when given, is called with the exact bytes of the body just before they are sent and returns headers to
    send with them (a signature over the body and the send time)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise HttpError(f"Not an http(s) URL (scheme {parts.scheme[:20]!r})", permanent=True)
    try:
        body = json.dumps(payload, allow_nan=False).encode()
    except (TypeError, ValueError) as error:
        raise HttpError(f"Not sendable as JSON: {error}", permanent=True) from None
    check_target(url)
    seconds = timeout if timeout is not None else settings.DLQ_HTTP_TIMEOUT_SECONDS
    with guarded_session() as session:
        try:
            response = session.post(
                url,
                data=body,
                headers={
                    "User-Agent": USER_AGENT,
                    "Content-Type": "application/json",
                    **(headers or {}),
                    **(sign(body) if sign is not None else {}),
                },
                # Connecting should be quick; the receiver gets the rest of the budget to answer.
                timeout=(min(3.0, seconds), seconds),
                allow_redirects=False,
            )
        except DeniedAddressError as error:
            raise HttpError(f"Refused: {error.message}", permanent=True) from None
        except requests.Timeout:
            raise HttpError(f"Timed out after {seconds:g} s") from None
        except requests.ConnectionError as error:
            raise HttpError(f"Connection failed: {_reason(error, url)}") from None
        except requests.RequestException as error:
            raise HttpError(f"Request failed: {_reason(error, url)}", permanent=True) from None
    if 200 <= response.status_code < 300:
        return response
    status = response.status_code
    permanent = 300 <= status < 500 and status not in RETRYABLE_STATUSES
    raise HttpError(f"HTTP {status}: {response.text[:200]}", status=status, permanent=permanent)


def _reason(error: Exception, url: str) -> str:
    """The error's text without the URL's secrets: requests and urllib3 quote the URL or its path ("Max retries
    exceeded with url: /path?query"), which may hold the receiver's token, and the error is shown to viewers on
    the alert pages. The host stays (it says which receiver failed)."""
    parts = urlsplit(url)
    text = str(error).replace(url, f"{parts.scheme}://{parts.hostname}/…")
    text = re.sub(r"(with url: )\S+", r"\1/…", text)
    tail = parts.path + (f"?{parts.query}" if parts.query else "")
    for secret in (tail, parts.path, parts.query, parts.password or ""):
        if len(secret) > 1:
            text = text.replace(secret, "/…")
    # requests nests the interesting part (e.g. "Connection refused") several exceptions deep.
    return text[-300:] if len(text) > 300 else text
