"""With REDIS_URL set the sign-in throttle counts in Redis, shared by every web process."""

from __future__ import annotations

import uuid

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.cache import cache
from django.test import Client

from dlqconsole.accounts.signin import _scopes

pytestmark = [pytest.mark.django_db]


@pytest.fixture
def _local_cache() -> None:
    """Overrides tests/accounts/conftest.py: this test uses the configured cache."""


@pytest.mark.skipif(not settings.REDIS_URL, reason="needs REDIS_URL")
def test_failures_are_counted_in_redis() -> None:
    assert settings.CACHES["default"]["BACKEND"] == "django.core.cache.backends.redis.RedisCache"
    # A name and an address of this run only: the counts outlive the test in the shared Redis.
    name = f"redis-{uuid.uuid4().hex[:8]}"
    address = f"10.{uuid.uuid4().int % 250}.{uuid.uuid4().int % 250}.{uuid.uuid4().int % 250}"
    User.objects.create_user(username=name, password="pw-right-one")
    try:
        for _ in range(5):
            Client(REMOTE_ADDR=address).post("/login/", {"username": name, "password": "wrong"})
        pair = _scopes(name, address)[0]
        assert cache.get(pair.key("lock")) is not None
        # Every count and lock expires: none is left in Redis for ever.
        redis = cache._cache.get_client()  # type: ignore[attr-defined]
        for key in (
            pair.key("lock"),
            _scopes(name, address)[1].key("failures"),
            _scopes(name, address)[2].key("failures"),
        ):
            assert 0 < redis.ttl(cache.make_and_validate_key(key)) <= 15 * 60

        client = Client(REMOTE_ADDR=address)
        client.post("/login/", {"username": name, "password": "pw-right-one"})
        assert client.get("/").status_code == 302
    finally:
        cache.delete_many([scope.key(kind) for kind in ("lock", "failures") for scope in _scopes(name, address)])
