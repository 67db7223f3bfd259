"""Sign-in audit and throttling, for every form that signs in with a password (/login/ and /admin/login/).

Each failed sign-in writes an audit row (`accounts.login.failed`: no actor, the user name tried, the client's
address; never the password) and each successful one another (`accounts.login`). After
DLQ_LOGIN_FAILURES_PER_USER failures for one user name, or DLQ_LOGIN_FAILURES_PER_IP from one address, within
DLQ_LOGIN_FAILURE_WINDOW, further attempts for that name or from that address are refused for DLQ_LOGIN_LOCKOUT
without the password being checked (`accounts.login.refused`), whatever the password: guessing stops paying. The
login page says so and when it ends (a 200 with that error in place of the form's usual one).

Counts live in Django's cache (Redis when REDIS_URL is set, so every web process shares them). A cache that
cannot be reached lets sign-ins through, with a warning in the log: on-call people must be able to sign in during
an incident that took Redis down.

The check is an authentication backend listed before ModelBackend: Django's authenticate() asks it first and
stops at its PermissionDenied, then sends user_login_failed, which is where failures are counted and recorded.
The client's address is REMOTE_ADDR: behind a reverse proxy every client has the proxy's address, and the
per-address limit then counts everyone together.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import time
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.utils import timezone

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.accounts.services import record_audit
from dlqconsole.core.durations import format_duration

logger = logging.getLogger(__name__)

KEY_PREFIX = "dlq:signin"


def client_ip(request: HttpRequest | None) -> str:
    return str(request.META.get("REMOTE_ADDR") or "unknown") if request is not None else "unknown"


def _key(kind: str, scope: str, value: str) -> str:
    # Hashed: a user name may hold any character and be long; cache keys should not.
    digest = hashlib.sha256(value.casefold().encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"{KEY_PREFIX}:{kind}:{scope}:{digest}"


def _scopes(username: str, ip: str) -> list[tuple[str, str, int]]:
    return [
        ("user", username, settings.DLQ_LOGIN_FAILURES_PER_USER),
        ("ip", ip, settings.DLQ_LOGIN_FAILURES_PER_IP),
    ]


def locked_until(*, username: str, ip: str) -> float | None:
    """When the lock on this user name or address ends (a Unix time), or None when sign-in may be tried."""
    try:
        ends = cache.get_many([_key("lock", scope, value) for scope, value, _ in _scopes(username, ip)])
    except Exception:
        logger.warning("Sign-in throttle: the cache cannot be read; letting the attempt through", exc_info=True)
        return None
    now = time.time()
    later = [float(end) for end in ends.values() if float(end) > now]
    return max(later, default=None)


def count_failure(*, username: str, ip: str) -> float | None:
    """Count one failed sign-in; lock the user name or address that reached its limit. The lock's end, if any."""
    now = time.time()
    window = settings.DLQ_LOGIN_FAILURE_WINDOW
    lockout = settings.DLQ_LOGIN_LOCKOUT
    until = None
    try:
        for scope, value, limit in _scopes(username, ip):
            key = _key("failures", scope, value)
            # The window starts at the first failure; incr keeps the key's expiry.
            cache.add(key, 0, timeout=window)
            try:
                failures = cache.incr(key)
            except ValueError:  # expired between add and incr
                cache.set(key, 1, timeout=window)
                failures = 1
            if failures >= limit:
                cache.set(_key("lock", scope, value), now + lockout, timeout=lockout)
                cache.delete(key)
                until = now + lockout
    except Exception:
        logger.warning("Sign-in throttle: the cache cannot be written; the failure is not counted", exc_info=True)
    return until


def forget_failures(*, username: str) -> None:
    """A successful sign-in clears its user name's count (not its address's: one good account must not reset
    the count of guesses made from the same place at other accounts)."""
    try:
        cache.delete(_key("failures", "user", username))
    except Exception:
        logger.warning("Sign-in throttle: the cache cannot be written", exc_info=True)


def refusal_message(until: float) -> str:
    seconds = max(1, round(until - time.time()))
    ends = timezone.localtime(dt.datetime.fromtimestamp(until, tz=dt.UTC))
    return (
        f"Too many failed sign-ins for this user name or from this address: sign-in is refused until "
        f"{ends:%H:%M} {ends.tzname()} (in {format_duration(seconds)}), even with the right password. "
        "An admin can see the attempts on the audit page."
    )


class LoginThrottleBackend:
    """Refuses a sign-in while its user name or address is locked; authenticates nobody itself. It has no
    get_user() on purpose: Django's force_login and the session take the first backend that has one."""

    def authenticate(
        self, request: HttpRequest | None, username: str | None = None, password: str | None = None, **kwargs: Any
    ) -> None:
        if request is None or username is None:
            return None
        # Marks a sign-in with a password (force_login and the like are not audited as sign-ins).
        request.password_sign_in = True  # type: ignore[attr-defined]
        until = locked_until(username=username, ip=client_ip(request))
        if until is not None:
            request.login_refused_until = until  # type: ignore[attr-defined]
            request.login_refusal = refusal_message(until)  # type: ignore[attr-defined]
            raise PermissionDenied(request.login_refusal)  # type: ignore[attr-defined]
        return None


def on_login_failed(
    sender: Any, credentials: dict[str, Any], request: HttpRequest | None = None, **kwargs: Any
) -> None:
    """user_login_failed: count the failure and record it (credentials arrive with the password masked, and
    only the user name is read from them)."""
    username = str(credentials.get("username") or "")
    ip = client_ip(request)
    target = f"user:{username}"[:255]
    refused_until = getattr(request, "login_refused_until", None)
    if refused_until is not None:
        _record_anonymous(action="accounts.login.refused", target=target, detail=f"from {ip}; locked, not checked")
        return
    until = count_failure(username=username, ip=ip)
    detail = f"from {ip}"
    if until is not None:
        detail += f"; limit reached, sign-in refused for {format_duration(settings.DLQ_LOGIN_LOCKOUT)}"
        if request is not None:
            request.login_refusal = refusal_message(until)  # type: ignore[attr-defined]
    _record_anonymous(action="accounts.login.failed", target=target, detail=detail)


def on_logged_in(sender: Any, request: HttpRequest | None, user: Any, **kwargs: Any) -> None:
    """user_logged_in: record a sign-in with a password and clear its user name's failures."""
    if request is None or not getattr(request, "password_sign_in", False):
        return
    forget_failures(username=user.get_username())
    record_audit(
        actor=user, action="accounts.login", target=f"user:{user.get_username()}", detail=f"from {client_ip(request)}"
    )


def _record_anonymous(*, action: str, target: str, detail: str) -> None:
    # No actor: nobody is signed in. "anonymous" rather than the log's "system", which means the console itself.
    AuditEntry.objects.create(actor=None, actor_name="anonymous", action=action, target=target, detail=detail)
