"""Parallel sign-in attempts for one user name from one address: at most the limit of them get their password
checked, however many arrive at once (each takes its slot in the count before the check)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client

pytestmark = [pytest.mark.django_db(transaction=True)]


def test_parallel_guesses_get_no_more_password_checks_than_the_limit(monkeypatch: Any) -> None:
    User.objects.create_user(username="paula-parallel", password="pw-right-one")
    checked = []
    authenticate = ModelBackend.authenticate

    def slow_check(self: ModelBackend, *args: Any, **kwargs: Any) -> Any:
        checked.append(1)
        time.sleep(0.3)  # every attempt is being checked while the others arrive
        return authenticate(self, *args, **kwargs)

    monkeypatch.setattr(ModelBackend, "authenticate", slow_check)

    def guess(number: int) -> None:
        try:
            Client(REMOTE_ADDR="10.0.0.7").post(
                "/login/", {"username": "paula-parallel", "password": f"guess-{number}"}
            )
        finally:
            connection.close()

    threads = [threading.Thread(target=guess, args=(number,)) for number in range(15)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(checked) == 5
