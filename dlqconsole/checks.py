"""SECRET_KEY must be a real secret wherever something is signed.

Sessions, CSRF tokens and the channel tags of the alerts are signed with SECRET_KEY, so a key anyone can read (the
development default, docker-compose's old placeholder) lets anyone forge a session. The processes that sign (the
web server under gunicorn or runserver, the Celery workers and beat) therefore refuse to start without a real key
unless DEBUG is on; commands that sign nothing (migrate, check, `dlq fingerprint`, collectstatic) run with the
development default, so a laptop or an image build needs no key. `check --deploy` reports the same as an error.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, register
from django.core.checks.security.base import (
    SECRET_KEY_INSECURE_PREFIX,
    SECRET_KEY_MIN_LENGTH,
    SECRET_KEY_MIN_UNIQUE_CHARACTERS,
)

# What settings.py uses when SECRET_KEY is absent or empty. Public: it is in this file.
DEVELOPMENT_SECRET_KEY = "dev-insecure-dlqconsole-secret-key-change-me-0123456789"
# The value docker-compose.yml once defaulted to, published with it.
COMPOSE_PLACEHOLDER_SECRET_KEY = "change-me-in-production-please-0123456789abcdef"
HOW_TO_SET = (
    "set SECRET_KEY to a random value of at least 50 characters "
    "(python3 -c 'import secrets; print(secrets.token_urlsafe(50))'), or DEBUG=true on a development machine"
)
# gunicorn stops for good when a worker exits with this code (its APP_LOAD_ERROR) instead of starting another worker
# that would refuse again; runserver's reloader and Celery pass it on as the exit status.
REFUSED_EXIT_CODE = 4


def secret_key_problem(secret_key: str) -> str | None:
    """What is wrong with a key for signing, or None for a real one. Weak means what Django's own check
    (security.W009) calls weak."""
    if secret_key in ("", DEVELOPMENT_SECRET_KEY):
        return "SECRET_KEY is not set (the development default is public)"
    if secret_key == COMPOSE_PLACEHOLDER_SECRET_KEY:
        return "SECRET_KEY is docker-compose's public placeholder"
    if (
        len(secret_key) < SECRET_KEY_MIN_LENGTH
        or len(set(secret_key)) < SECRET_KEY_MIN_UNIQUE_CHARACTERS
        or secret_key.startswith(SECRET_KEY_INSECURE_PREFIX)
    ):
        return (
            f"SECRET_KEY is weak (fewer than {SECRET_KEY_MIN_LENGTH} characters or {SECRET_KEY_MIN_UNIQUE_CHARACTERS} "
            f"distinct ones, or starts with {SECRET_KEY_INSECURE_PREFIX!r})"
        )
    return None


def refuse_to_start_without_secret_key(process: str) -> None:
    """Ends this process with one line naming SECRET_KEY when the key is not a real one and DEBUG is off.

    os._exit, not SystemExit: runserver loads the application in a thread of its reloaded child, where SystemExit
    would end only that thread and leave a process that serves nothing (Django's runserver exits the same way on
    a port in use). Nothing is running yet that would need a cleaner exit."""
    if settings.DEBUG:
        return
    problem = secret_key_problem(settings.SECRET_KEY)
    if problem is None:
        return
    sys.stdout.flush()
    sys.stderr.write(f"dlqconsole: refusing to start {process}: {problem}; {HOW_TO_SET}.\n")
    sys.stderr.flush()
    os._exit(REFUSED_EXIT_CODE)


@register(Tags.security, deploy=True)
def check_secret_key(app_configs: Any, **kwargs: Any) -> list[CheckMessage]:
    problem = secret_key_problem(settings.SECRET_KEY)
    if problem is None:
        return []
    return [Error(problem, hint=HOW_TO_SET[0].upper() + HOW_TO_SET[1:] + ".", id="dlqconsole.E001")]
