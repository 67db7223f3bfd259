"""The one way the console makes outbound HTTP requests (webhook and Slack notifications).

Every request has a connect and a read timeout, never follows redirects and says who is calling, so a slow or
misbehaving receiver costs a bounded amount of time. Failures raise HttpError, which tells whether trying again
later could help (`permanent=False`: network trouble, timeouts, 5xx, 429) or not (`permanent=True`: a bad URL
or a 4xx answer such as 404 or 410).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import requests
from django.conf import settings

USER_AGENT = "dlqconsole-notifier/1"
# Statuses that may succeed when tried again later; every other 4xx means the request itself is wrong.
RETRYABLE_STATUSES = frozenset({408, 409, 425, 429})


class HttpError(Exception):
    def __init__(self, message: str, *, status: int | None = None, permanent: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.permanent = permanent


def post_json(
    url: str, *, payload: Any, headers: dict[str, str] | None = None, timeout: float | None = None
) -> requests.Response:
    """POST `payload` as JSON to `url`; return the response when its status is 2xx, raise HttpError otherwise."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise HttpError(f"Not an http(s) URL: {url[:200]!r}", permanent=True)
    seconds = timeout if timeout is not None else settings.DLQ_HTTP_TIMEOUT_SECONDS
    try:
        response = requests.post(
            url,
            json=payload,
            headers={"User-Agent": USER_AGENT, **(headers or {})},
            # Connecting should be quick; the receiver gets the rest of the budget to answer.
            timeout=(min(3.0, seconds), seconds),
            allow_redirects=False,
        )
    except requests.Timeout:
        raise HttpError(f"Timed out after {seconds:g} s") from None
    except requests.ConnectionError as error:
        raise HttpError(f"Connection failed: {_reason(error)}") from None
    except requests.RequestException as error:
        raise HttpError(f"Request failed: {_reason(error)}", permanent=True) from None
    if 200 <= response.status_code < 300:
        return response
    status = response.status_code
    permanent = 300 <= status < 500 and status not in RETRYABLE_STATUSES
    raise HttpError(f"HTTP {status}: {response.text[:200]}", status=status, permanent=permanent)


def _reason(error: Exception) -> str:
    # requests nests the interesting part (e.g. "Connection refused") several exceptions deep.
    text = str(error)
    return text[-300:] if len(text) > 300 else text
