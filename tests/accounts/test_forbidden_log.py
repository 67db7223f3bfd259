"""A refused request (403) is logged as one WARNING line, without the traceback Django attaches; a server error
keeps its traceback."""

from __future__ import annotations

import logging

import pytest
from django.contrib.auth.models import User

from tests.conftest import client_for

pytestmark = [pytest.mark.django_db]


def test_a_403_is_one_warning_line_without_a_traceback(viewer: User, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="django.request"):
        response = client_for(viewer).get("/alerts/rules/")

    assert response.status_code == 403
    (record,) = [record for record in caplog.records if record.name == "django.request"]
    assert record.levelno == logging.WARNING
    assert record.getMessage() == "Forbidden (Permission denied): /alerts/rules/"
    assert record.exc_info is None
    assert "Traceback" not in caplog.text


def test_a_server_error_keeps_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError as error:
        logging.getLogger("django.request").error(
            "Internal Server Error: /x", exc_info=error, extra={"status_code": 500}
        )

    (record,) = caplog.records
    assert record.exc_info is not None and "Traceback" in caplog.text
