"""What a dead letter's pages need from the app that replays dead letters.

The message page shows the operations that took a dead letter and its Retry button, and the edit page sends an
edited copy as a retry: all of that is the operations app's, which sits above this one (it replays what this
app stores), so this app cannot import it. Operations lends it instead, when it loads (OperationsConfig.ready),
through `register`; the pages ask for it with `registered`.
"""

from __future__ import annotations

from typing import Any, Protocol

from django.core.exceptions import ImproperlyConfigured

from dlqconsole.core.views import HtmxHttpRequest
from dlqconsole.deadletters.models import DeadLetter


class Replays(Protocol):
    def page_context(self, request: HtmxHttpRequest, dead_letter: DeadLetter) -> dict[str, Any]:
        """The message page's share, as template context: `history` (the operation items that took the dead
        letter, newest first) and `retry` (the Retry button, or None where it is not shown)."""
        ...

    def send_edited(
        self, *, dead_letter: DeadLetter, body: bytes, headers: dict[str, Any], actor: Any, submission: str
    ) -> str:
        """Retry an edited copy of `dead_letter`; the address of the operation that sends it. ReplayRefused, with
        a message fit for the operator, when it is not sent."""
        ...


class ReplayRefused(Exception):
    """An edited copy was not sent; the message says why, in words fit for the operator."""


_replays: Replays | None = None


def register(replays: Replays) -> None:
    """Lend the pages `replays`: the operations app does, when it loads."""
    global _replays
    _replays = replays


def registered() -> Replays:
    if _replays is None:
        raise ImproperlyConfigured("The dead letters' pages need the operations app (dlqconsole.operations).")
    return _replays
