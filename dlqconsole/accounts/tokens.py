"""Personal API tokens: made, found and revoked. The API authenticates with `authenticate`; the user's own page
and `manage.py api_token` make and revoke them through `create_token` and `revoke_tokens`.

A token is `dlq_<prefix>_<secret>`: the prefix (8 hex digits) finds its row, the SHA-256 of the whole token is
compared in constant time. The plaintext exists only in the answer to its creation.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, User
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.views.decorators.debug import sensitive_variables

from dlqconsole.accounts.models import ApiToken
from dlqconsole.accounts.services import record_audit

TOKEN = re.compile(r"^dlq_(?P<prefix>[0-9a-f]{8})_(?P<secret>[A-Za-z0-9_-]{43})$")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._@:-]{0,63}$")
NAME_RULE = "1 to 64 letters, digits, spaces and . _ @ : -, starting with a letter or digit"
# last_used_at is written at most this often per token, so a busy script does not write a row per request.
TOUCH_EVERY = dt.timedelta(seconds=60)
MAX_LIFETIME = dt.timedelta(days=3650)


class TokenError(ValueError):
    pass


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def describe(token: ApiToken) -> str:
    """How audit rows name a change made with the token."""
    return f"API token {token.name} (dlq_{token.prefix})"


@sensitive_variables("plaintext")
def create_token(
    *,
    user: User,
    name: str,
    expires_at: dt.datetime | None = None,
    read_only: bool = False,
    actor: AbstractBaseUser | AnonymousUser | None = None,
    now: dt.datetime | None = None,
) -> tuple[ApiToken, str]:
    """A new token for `user` and its plaintext, which is never shown again. `actor` is who asked (the user on
    their own page; None from the command line, written as system). Error reports hide the plaintext."""
    now = now or timezone.now()
    name = (name or "").strip()
    if not NAME.fullmatch(name):
        raise TokenError(f"A token's name is {NAME_RULE}.")
    if not user.is_active:
        raise TokenError(f"{user.get_username()} is deactivated: a token of theirs would not work.")
    if expires_at is not None and expires_at <= now:
        raise TokenError("The expiry must be in the future.")
    if expires_at is not None and expires_at - now > MAX_LIFETIME:
        raise TokenError("A token expires within ten years, or never.")
    # An expired token keeps its name until revoked; making a new one of that name revokes it (with its audit row),
    # so a token that ran out can be replaced under the name the scripts know.
    expired = ApiToken.objects.filter(user=user, name=name, revoked_at__isnull=True, expires_at__lte=now)
    revoke_tokens(list(expired.select_related("user")), actor=actor, now=now)
    for _ in range(5):
        prefix = secrets.token_hex(4)
        plaintext = f"dlq_{prefix}_{secrets.token_urlsafe(32)}"
        try:
            with transaction.atomic():
                if ApiToken.objects.filter(user=user, name=name, revoked_at__isnull=True).exists():
                    raise TokenError(f"{user.get_username()} already has a live token named {name!r}.")
                token = ApiToken.objects.create(
                    user=user,
                    name=name,
                    prefix=prefix,
                    digest=digest(plaintext),
                    created_at=now,
                    expires_at=expires_at,
                    read_only=read_only,
                )
                record_audit(
                    actor=actor,
                    action="accounts.token.create",
                    target=f"user:{user.pk}",
                    detail=f"API token {name} (dlq_{prefix}) for {user.get_username()}, "
                    + ("read-only, " if read_only else "")
                    + (f"expires {expires_at:%Y-%m-%d %H:%M %Z}" if expires_at else "no expiry"),
                    now=now,
                )
                return token, plaintext
        except IntegrityError:
            # A prefix taken already (one in four billion), or a name taken by a request at the same moment.
            if ApiToken.objects.filter(user=user, name=name, revoked_at__isnull=True).exists():
                raise TokenError(f"{user.get_username()} already has a live token named {name!r}.") from None
    raise TokenError("Could not make a token; try again.")


def revoke_tokens(
    tokens: Iterable[ApiToken], *, actor: AbstractBaseUser | AnonymousUser | None, now: dt.datetime | None = None
) -> int:
    """Revoke the live ones among `tokens`, an audit row each; how many were revoked."""
    now = now or timezone.now()
    revoked = 0
    with transaction.atomic():
        for token in tokens:
            if ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=now) != 1:
                continue
            revoked += 1
            record_audit(
                actor=actor,
                action="accounts.token.revoke",
                target=f"user:{token.user_id}",
                detail=f"{describe(token)} of {token.user.get_username()}",
                now=now,
            )
    return revoked


# Django's error reports that show each frame's variables (the DEBUG page, HTML error e-mails) hide every variable
# here: the token, and the match of it, whose repr quotes most of it.
@sensitive_variables()
def authenticate(plaintext: str, *, now: dt.datetime | None = None) -> tuple[ApiToken | None, str]:
    """The live token this is, with its active user loaded, or (None, why not)."""
    found = TOKEN.fullmatch(plaintext or "")
    if found is None:
        return None, "This is not a dlqconsole API token (dlq_...)."
    token = ApiToken.objects.select_related("user").filter(prefix=found["prefix"]).first()
    if token is None or not hmac.compare_digest(token.digest, digest(plaintext)):
        return None, "Unknown API token."
    now = now or timezone.now()
    state = token.state(now)
    if state != "active":
        return None, f"This API token is {state}."
    if not token.user.is_active:
        return None, "This API token's user is deactivated."
    if token.last_used_at is None or now - token.last_used_at >= TOUCH_EVERY:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return token, ""
