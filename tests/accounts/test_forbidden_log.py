"""A refused request (403, or a 400 such as a disallowed Host header) is logged as one WARNING or ERROR line,
without the traceback Django attaches; a server error keeps its traceback. The filter is on the console handler:
a logger's filter would not see records of its children (django.security.DisallowedHost)."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User

from tests.conftest import client_for

pytestmark = [pytest.mark.django_db]


@pytest.fixture
def console() -> Iterator[io.StringIO]:
    """What the console's log handler (settings.LOGGING) writes, captured."""
    (handler,) = [handler for handler in logging.getLogger().handlers if handler.get_name() == "console"]
    assert isinstance(handler, logging.StreamHandler)
    written = io.StringIO()
    previous = handler.setStream(written)
    try:
        yield written
    finally:
        handler.setStream(previous)


def test_a_403_is_one_warning_line_without_a_traceback(viewer: User, console: io.StringIO) -> None:
    response = client_for(viewer).get("/alerts/rules/")

    assert response.status_code == 403
    lines = [line for line in console.getvalue().splitlines() if "django.request" in line]
    assert len(lines) == 1
    assert " WARNING " in lines[0] and lines[0].endswith("Forbidden (Permission denied): /alerts/rules/")
    assert "Traceback" not in console.getvalue()


def test_a_record_of_a_child_logger_loses_its_traceback(console: io.StringIO) -> None:
    # As Django logs a disallowed Host header (django.core.handlers.exception.response_for_exception).
    try:
        raise ValueError("bad host")
    except ValueError as error:
        logging.getLogger("django.security.DisallowedHost").error(
            "Invalid HTTP_HOST header", exc_info=error, extra={"status_code": 400}
        )

    assert "Invalid HTTP_HOST header" in console.getvalue() and "Traceback" not in console.getvalue()


def test_other_handlers_still_get_the_traceback(console: io.StringIO, caplog: pytest.LogCaptureFixture) -> None:
    try:
        raise ValueError("bad host")
    except ValueError as error:
        logging.getLogger("django.security.DisallowedHost").error(
            "Invalid HTTP_HOST header", exc_info=error, extra={"status_code": 400}
        )

    (record,) = caplog.records
    assert record.exc_info is not None
    assert "Traceback" not in console.getvalue()


def test_a_server_error_keeps_its_traceback(console: io.StringIO) -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError as error:
        logging.getLogger("django.request").error(
            "Internal Server Error: /x", exc_info=error, extra={"status_code": 500}
        )

    assert "Traceback" in console.getvalue() and "RuntimeError: boom" in console.getvalue()
