"""Sign-in audit and throttling, for every form that signs in with a password (/login/ and /admin/login/).

Each failed sign-in writes an audit row (`accounts.login.failed`: no actor, the user name tried, the client's
address; never the password) and each successful one another (`accounts.login`). Only admins see these rows on
the audit page: the name tried is often a password typed into the wrong field.

Failures are counted three ways within DLQ_LOGIN_FAILURE_WINDOW, and reaching a limit refuses further attempts
there for DLQ_LOGIN_LOCKOUT without the password being checked, whatever the password (one
`accounts.login.refused` row a lock, at its first refusal: refusals cost no password, so a row each would let
anyone grow the audit table at request rate):
- a user name from one address (DLQ_LOGIN_FAILURES_PER_NAME_AND_ADDRESS, 5): someone guessing one account;
- one address, whatever the names (DLQ_LOGIN_FAILURES_PER_ADDRESS, 20): someone guessing many accounts;
- a user name from anywhere (DLQ_LOGIN_FAILURES_PER_NAME, 100): a guess spread over many addresses.
A lock on a user name alone lets anyone who can reach the page lock that account out, so its limit is high; the
narrow limits are on the pair and the address, which lock out only the one guessing. An IPv6 client is counted by
its /64 (one host commonly holds a whole /64, so its single addresses cost an attacker nothing).

Each attempt takes its slot in every count before its password is checked (an atomic increment), so parallel
attempts cannot all be checked before the first failure is counted: the attempt whose slot is past a limit is
refused. A successful sign-in gives its slots back (and clears its user name's count from that address). The
login page says when a lock ends (a 200 with that error in place of the form's usual one).

Counts live in Django's cache (Redis when REDIS_URL is set, so every web process shares them). A cache that
cannot be reached lets sign-ins through, with a warning in the log: on-call people must be able to sign in during
an incident that took Redis down.

The check is an authentication backend listed before ModelBackend: Django's authenticate() asks it first and
stops at its PermissionDenied, then sends user_login_failed, which is where failures are recorded.
The client's address is REMOTE_ADDR, unless that is one of DLQ_TRUSTED_PROXIES: then it is the nearest address of
X-Forwarded-For outside those networks, read from the right (what the proxies appended; a client can write
anything to the left of it). Without the setting, behind a reverse proxy every client has the proxy's address, and
the per-address limits count everyone together.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import hashlib
import ipaddress
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.core.cache import cache
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.utils import timezone

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.accounts.services import record_audit
from dlqconsole.core.durations import format_duration

logger = logging.getLogger(__name__)

KEY_PREFIX = "dlq:signin"
# The scopes failures are counted in, most specific first (a refusal names the first one locked).
NAME_AND_ADDRESS = "name-address"
ADDRESS = "address"
NAME = "name"
REFUSAL_REASONS = {
    NAME_AND_ADDRESS: "for this user name from your address",
    ADDRESS: "from your address",
    NAME: "for this user name from many addresses",
}


def client_ip(request: HttpRequest | None) -> str:
    """The address a request came from, through the trusted proxies (DLQ_TRUSTED_PROXIES) in front of the console."""
    if request is None:
        return "unknown"
    address = str(request.META.get("REMOTE_ADDR") or "unknown")
    proxies = _trusted_proxies(tuple(settings.DLQ_TRUSTED_PROXIES))
    if not proxies or not _is_within(address, proxies):
        return address
    hops = [hop.strip() for hop in str(request.META.get("HTTP_X_FORWARDED_FOR", "")).split(",")]
    for hop in reversed(hops):
        try:
            parsed = ipaddress.ip_address(hop)
        except ValueError:
            # Not an address (empty, "unknown", a port added): nothing to its left can be trusted either, so the
            # request counts as coming from the last proxy that was.
            return address
        address = str(parsed)
        if not _is_within(address, proxies):
            return address
    return address


@functools.cache
def _trusted_proxies(networks: tuple[str, ...]) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    return tuple(ipaddress.ip_network(network, strict=False) for network in networks)


def _is_within(address: str, networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]) -> bool:
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return False
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        parsed = parsed.ipv4_mapped
    return any(parsed in network for network in networks)


def client_network(address: str) -> str:
    """What an address is counted as: an IPv4 address itself (also written IPv4-mapped), an IPv6 address its /64."""
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(parsed, ipaddress.IPv6Address):
        if parsed.ipv4_mapped is not None:
            return str(parsed.ipv4_mapped)
        # Built from the integer: a scope id ("fe80::1%eth0") is not part of the network.
        return str(ipaddress.IPv6Network((int(parsed) >> 64 << 64, 64)))
    return str(parsed)


def _key(kind: str, scope: str, value: str) -> str:
    # Hashed: a user name may hold any character and be long; cache keys should not.
    digest = hashlib.sha256(value.casefold().encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"{KEY_PREFIX}:{kind}:{scope}:{digest}"


@dataclass(frozen=True)
class Scope:
    kind: str
    value: str
    limit: int

    def key(self, kind: str) -> str:
        return _key(kind, self.kind, self.value)


@dataclass(frozen=True)
class Lock:
    scope: Scope
    until: float


@dataclass
class Reservation:
    """The slots one attempt took, with its number in each count's window."""

    slots: list[tuple[Scope, int]] = field(default_factory=list)


def _scopes(username: str, ip: str) -> list[Scope]:
    network = client_network(ip)
    name = username.casefold()
    return [
        # Django's form fields refuse a NUL in a user name, so no two pairs join into the same text.
        Scope(NAME_AND_ADDRESS, f"{name}\x00{network}", settings.DLQ_LOGIN_FAILURES_PER_NAME_AND_ADDRESS),
        Scope(ADDRESS, network, settings.DLQ_LOGIN_FAILURES_PER_ADDRESS),
        Scope(NAME, name, settings.DLQ_LOGIN_FAILURES_PER_NAME),
    ]


def _take_slot(key: str) -> int:
    """Count one attempt atomically; the window starts at the first (incr keeps the key's expiry)."""
    window = settings.DLQ_LOGIN_FAILURE_WINDOW
    cache.add(key, 0, timeout=window)
    try:
        number = cache.incr(key)
    except ValueError:  # expired between add and incr
        cache.add(key, 0, timeout=window)
        number = cache.incr(key)
    if number == 1:
        # Django's Redis incr checks that the key exists, then increments: a key that expired in between is made
        # again by Redis without an expiry. The first slot of a window sets the expiry again, to be sure.
        cache.touch(key, window)
    return int(number)


def _give_back_slot(key: str) -> None:
    # A missing key: the window ended meanwhile, or a lock cleared the count.
    with contextlib.suppress(ValueError):
        cache.decr(key)


def _lock(scope: Scope) -> Lock:
    """Lock a scope for the lockout unless it is locked already (then that lock's end holds); a fresh count
    starts when it ends."""
    lockout = settings.DLQ_LOGIN_LOCKOUT
    cache.add(scope.key("lock"), time.time() + lockout, timeout=lockout)
    cache.delete(scope.key("failures"))
    until = cache.get(scope.key("lock"))
    return Lock(scope, float(until) if until is not None else time.time() + lockout)


def reserve_attempt(*, username: str, ip: str) -> Reservation | Lock:
    """Before a password is checked: the lock that refuses this attempt, or the slots it took in every count."""
    scopes = _scopes(username, ip)
    reservation = Reservation()
    try:
        ends = cache.get_many([scope.key("lock") for scope in scopes])
        now = time.time()
        for scope in scopes:
            end = ends.get(scope.key("lock"))
            if end is not None and float(end) > now:
                return Lock(scope, float(end))
        for scope in scopes:
            reservation.slots.append((scope, _take_slot(scope.key("failures"))))
        for scope, number in reservation.slots:
            if number > scope.limit:
                # As many attempts as the limit failed or are being checked right now: this one is refused.
                release(reservation)
                return _lock(scope)
    except Exception:
        logger.warning("Sign-in throttle: the cache cannot be used; letting the attempt through", exc_info=True)
    return reservation


def count_failure(reservation: Reservation) -> Lock | None:
    """After a wrong password: its slots stay counted; a count that reached its limit locks its scope. The
    lock a refusal would name (the most specific), if any."""
    locks = []
    try:
        for scope, number in reservation.slots:
            if number >= scope.limit:
                locks.append(_lock(scope))
    except Exception:
        logger.warning("Sign-in throttle: the cache cannot be written; the limit is not applied", exc_info=True)
    return locks[0] if locks else None


def release(reservation: Reservation) -> None:
    """Give an attempt's slots back: one refused or signed in is not a failure."""
    try:
        for scope, _ in reservation.slots:
            _give_back_slot(scope.key("failures"))
    except Exception:
        logger.warning("Sign-in throttle: the cache cannot be written", exc_info=True)
    reservation.slots = []


def forget_failures(reservation: Reservation) -> None:
    """A successful sign-in gives its slots back and clears its user name's count from its address; not the
    address's (one good account must not reset the count of guesses made from the same place at other accounts)
    nor the name's from everywhere (the owner signing in must not reset a guess spread over many addresses)."""
    pairs = [scope for scope, _ in reservation.slots if scope.kind == NAME_AND_ADDRESS]
    release(reservation)
    try:
        cache.delete_many([scope.key("failures") for scope in pairs])
    except Exception:
        logger.warning("Sign-in throttle: the cache cannot be written", exc_info=True)


def refusal_message(lock: Lock) -> str:
    seconds = max(1, round(lock.until - time.time()))
    ends = timezone.localtime(dt.datetime.fromtimestamp(lock.until, tz=dt.UTC))
    return (
        f"Too many failed sign-ins {REFUSAL_REASONS[lock.scope.kind]}: sign-in is refused until "
        f"{ends:%H:%M} {ends.tzname()} (in {format_duration(seconds)}), even with the right password. "
        "An admin can see the attempts on the audit page."
    )


class LoginThrottleBackend:
    """Refuses a sign-in while its user name, address or both are locked, and otherwise takes the attempt's slots
    before ModelBackend checks the password; authenticates nobody itself. It has no get_user() on purpose:
    Django's force_login and the session take the first backend that has one."""

    def authenticate(
        self, request: HttpRequest | None, username: str | None = None, password: str | None = None, **kwargs: Any
    ) -> None:
        if request is None or username is None:
            return None
        # Marks a sign-in with a password (force_login and the like are not audited as sign-ins).
        request.password_sign_in = True  # type: ignore[attr-defined]
        outcome = reserve_attempt(username=username, ip=client_ip(request))
        if isinstance(outcome, Lock):
            request.login_lock = outcome  # type: ignore[attr-defined]
            request.login_refusal = refusal_message(outcome)  # type: ignore[attr-defined]
            raise PermissionDenied(request.login_refusal)  # type: ignore[attr-defined]
        request.login_reservation = outcome  # type: ignore[attr-defined]
        return None


def on_login_failed(
    sender: Any, credentials: dict[str, Any], request: HttpRequest | None = None, **kwargs: Any
) -> None:
    """user_login_failed: record the failure, locking what reached its limit (credentials arrive with the
    password masked, and only the user name is read from them)."""
    username = str(credentials.get("username") or "")
    ip = client_ip(request)
    target = f"user:{username}"[:255]
    lock = getattr(request, "login_lock", None)
    if lock is not None:
        if _first_refusal(lock):
            _record_anonymous(
                action="accounts.login.refused",
                target=target,
                detail=f"from {ip}; {lock.scope.kind} locked, not checked; later attempts until the lock ends "
                "are refused without a row",
            )
        return
    lock = count_failure(getattr(request, "login_reservation", None) or Reservation())
    detail = f"from {ip}"
    if lock is not None:
        detail += (
            f"; {lock.scope.kind} limit reached, sign-in refused for {format_duration(settings.DLQ_LOGIN_LOCKOUT)}"
        )
        if request is not None:
            request.login_refusal = refusal_message(lock)  # type: ignore[attr-defined]
    _record_anonymous(action="accounts.login.failed", target=target, detail=detail)


def on_logged_out(sender: Any, request: HttpRequest | None, user: Any, **kwargs: Any) -> None:
    """user_logged_out: the login page the browser lands on says so (the message outlives the session, which is
    flushed next, in its cookie)."""
    if request is not None and user is not None:
        messages.info(request, "Signed out.", fail_silently=True)  # a request without the message middleware


def on_logged_in(sender: Any, request: HttpRequest | None, user: Any, **kwargs: Any) -> None:
    """user_logged_in: record a sign-in with a password and give back its slots in the failure counts."""
    if request is None or not getattr(request, "password_sign_in", False):
        return
    forget_failures(getattr(request, "login_reservation", None) or Reservation())
    record_audit(
        actor=user, action="accounts.login", target=f"user:{user.get_username()}", detail=f"from {client_ip(request)}"
    )


def _first_refusal(lock: Lock) -> bool:
    """Whether this is the first attempt a lock refuses: anyone can send refused attempts at request rate without
    knowing a password, so one audit row a lock records them, not one an attempt."""
    remaining = max(1, round(lock.until - time.time()))
    try:
        return bool(cache.add(lock.scope.key(f"refused:{lock.until}"), 1, timeout=remaining))
    except Exception:
        return False


def _record_anonymous(*, action: str, target: str, detail: str) -> None:
    # No actor: nobody is signed in. "anonymous" rather than the log's "system", which means the console itself.
    AuditEntry.objects.create(actor=None, actor_name="anonymous", action=action, target=target, detail=detail)
