from __future__ import annotations

import datetime as dt
from typing import Any

from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from dlqconsole.accounts.models import ApiToken
from dlqconsole.accounts.tokens import TokenError, create_token, describe, revoke_tokens
from dlqconsole.core.durations import parse_duration


class Command(BaseCommand):
    help = (
        "Personal API tokens. `create USER [--name NAME] [--expires-in 90d]` prints a new token once (only its hash "
        "is kept); `revoke USER [NAME]` revokes the user's token of that name, or all of the user's tokens; "
        "`list USER` shows them (never the token)."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("action", choices=["create", "revoke", "list"])
        parser.add_argument("username", metavar="USER")
        parser.add_argument(
            "name", nargs="?", default="", metavar="NAME", help="the token to revoke (revoke), or to create (create)"
        )
        parser.add_argument("--name", dest="new_name", default="", help="the new token's name (create; default: cli)")
        parser.add_argument(
            "--expires-in", default="", metavar="AGE", help="e.g. 90d, 12h (create; default: never expires)"
        )
        parser.add_argument(
            "--read-only", action="store_true", help="the token reads and changes nothing, whatever the role (create)"
        )

    def handle(self, *args: Any, action: str, username: str, name: str, **options: Any) -> None:
        user = User.objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No user named {username!r}.")
        if action == "create":
            self._create(user, options["new_name"] or name or "cli", options["expires_in"], options["read_only"])
        elif action == "revoke":
            tokens = ApiToken.objects.filter(user=user, revoked_at__isnull=True).select_related("user")
            if name:
                tokens = tokens.filter(name=name)
                if not tokens.exists():
                    raise CommandError(f"{username} has no live token named {name!r}.")
            count = revoke_tokens(list(tokens), actor=None)
            self.stdout.write(f"Revoked {count} token{'s' if count != 1 else ''} of {username}.")
        else:
            now = timezone.now()
            for token in ApiToken.objects.filter(user=user):
                used = f"last used {token.last_used_at:%Y-%m-%d %H:%M}" if token.last_used_at else "never used"
                expires = f"expires {token.expires_at:%Y-%m-%d %H:%M}" if token.expires_at else "no expiry"
                access = "read-only" if token.read_only else "role of the user"
                self.stdout.write(f"{describe(token)}  {token.state(now)}  {access}  {used}  {expires}")

    def _create(self, user: User, name: str, expires_in: str, read_only: bool) -> None:
        expires_at = None
        if expires_in:
            try:
                expires_at = timezone.now() + dt.timedelta(seconds=parse_duration(expires_in))
            except ValueError as problem:
                raise CommandError(f"--expires-in: {problem}") from None
        try:
            token, plaintext = create_token(user=user, name=name, expires_at=expires_at, read_only=read_only)
        except TokenError as problem:
            raise CommandError(str(problem)) from None
        self.stderr.write(
            f"{describe(token)} for {user.get_username()}; shown once, keep it now "
            "(send it as `Authorization: Bearer <token>`):"
        )
        self.stdout.write(plaintext)
