from __future__ import annotations

from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from dlqconsole.accounts.tokens import create_token


def token_for(user: User, name: str = "tests") -> str:
    return create_token(user=user, name=name)[1]


def api_client(token: str = "") -> APIClient:
    client = APIClient()
    if token:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


@pytest.fixture
def api_for(db: None) -> Callable[[User], APIClient]:
    """An API client with a new token of `user` (a second call for the same user makes another token)."""
    made: dict[int, int] = {}

    def make(user: User) -> APIClient:
        made[user.pk] = made.get(user.pk, 0) + 1
        return api_client(token_for(user, name=f"tests-{made[user.pk]}"))

    return make
