"""Failed and successful sign-ins are audited (never the password), and guessing is throttled: five failures for
one user name from one address, twenty from one address (an IPv6 /64), or a hundred for one user name from
anywhere, within the window, refuse further attempts there for the lockout, on the console's login page and the
admin's."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client, RequestFactory

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.accounts.signin import LoginThrottleBackend
from tests.conftest import client_for

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]

WRONG = "hunter2-wrong-guess"


def attempt(username: str, password: str, *, ip: str = "10.0.0.7", path: str = "/login/") -> tuple[Client, Any]:
    """One sign-in from `ip`: the client and the login page's answer."""
    client = Client(REMOTE_ADDR=ip)
    return client, client.post(path, {"username": username, "password": password})


def sign_in(username: str, password: str, *, ip: str = "10.0.0.7", path: str = "/login/") -> Client:
    return attempt(username, password, ip=ip, path=path)[0]


def signed_in(client: Client) -> bool:
    return client.get("/").status_code == 200


def test_a_failed_sign_in_is_audited_with_the_name_and_address_but_not_the_password(viewer: User) -> None:
    sign_in(viewer.username, WRONG, ip="10.9.8.7")

    entry = AuditEntry.objects.get(action="accounts.login.failed")
    assert entry.actor is None and entry.actor_name == "anonymous"
    assert entry.target == "user:vera-viewer"
    assert "10.9.8.7" in entry.detail
    row = " ".join(str(value) for value in AuditEntry.objects.values().get().values())
    assert WRONG not in row and "****" not in row


def test_a_failed_sign_in_with_an_unknown_name_is_audited_too(db: None) -> None:
    sign_in("nobody-here", WRONG)

    assert AuditEntry.objects.get(action="accounts.login.failed").target == "user:nobody-here"


def test_a_successful_sign_in_is_audited(viewer: User) -> None:
    client = sign_in(viewer.username, "pw-vera-viewer", ip="10.1.1.1")

    assert signed_in(client)
    entry = AuditEntry.objects.get(action="accounts.login")
    assert entry.actor == viewer and "10.1.1.1" in entry.detail


def test_force_login_writes_no_audit_row(viewer: User) -> None:
    # Other tests sign in with force_login (tests/conftest.py client_for): they must not see extra audit rows.
    assert signed_in(client_for(viewer))
    assert not AuditEntry.objects.exists()


def test_five_failures_for_a_name_from_one_address_refuse_that_pair_even_with_the_right_password(
    viewer: User, operator: User
) -> None:
    for _ in range(4):
        assert "Too many failed" not in attempt(viewer.username, WRONG, ip="10.0.0.99")[1].content.decode()
    fifth = attempt(viewer.username, WRONG, ip="10.0.0.99")[1]
    # The fifth failure already says that the next attempts are refused.
    assert fifth.status_code == 200 and "Too many failed sign-ins" in fifth.content.decode()

    client, response = attempt(viewer.username, "pw-vera-viewer", ip="10.0.0.99")

    page = response.content.decode()
    assert response.status_code == 200
    assert "Too many failed sign-ins for this user name from your address" in page
    assert "even with the right password" in page
    assert "Please enter a correct username" not in page
    assert not signed_in(client)
    assert AuditEntry.objects.filter(action="accounts.login.failed").count() == 5
    refused = AuditEntry.objects.get(action="accounts.login.refused")
    assert refused.target == "user:vera-viewer" and "10.0.0.99" in refused.detail
    # Another user name from the same address is not locked, nor the same name from another address.
    assert signed_in(sign_in(operator.username, "pw-otto-operator", ip="10.0.0.99"))
    assert signed_in(sign_in(viewer.username, "pw-vera-viewer", ip="10.0.0.100"))


def test_failures_from_other_addresses_do_not_lock_the_owner_out(viewer: User) -> None:
    # Someone who knows the user name fails for it from elsewhere: the owner still signs in from their own address.
    for number in range(30):
        sign_in(viewer.username, WRONG, ip=f"198.51.100.{number}")

    assert signed_in(sign_in(viewer.username, "pw-vera-viewer", ip="10.1.2.3"))


def test_many_failures_for_a_name_from_many_addresses_refuse_that_name(viewer: User, settings: Any) -> None:
    settings.DLQ_LOGIN_FAILURES_PER_NAME = 12
    for number in range(12):
        sign_in(viewer.username, WRONG, ip=f"198.51.100.{number}")

    client, response = attempt(viewer.username, "pw-vera-viewer", ip="10.1.2.3")

    assert not signed_in(client)
    assert "Too many failed sign-ins for this user name from many addresses" in response.content.decode()


def test_the_default_limit_for_a_name_from_anywhere_is_far_above_the_pairs() -> None:
    from django.conf import settings

    assert settings.DLQ_LOGIN_FAILURES_PER_NAME_AND_ADDRESS == 5
    assert settings.DLQ_LOGIN_FAILURES_PER_ADDRESS == 20
    assert settings.DLQ_LOGIN_FAILURES_PER_NAME >= 100


def test_the_user_name_lock_ignores_case(viewer: User) -> None:
    for _ in range(5):
        sign_in("Vera-Viewer", WRONG)

    assert not signed_in(sign_in(viewer.username, "pw-vera-viewer"))


def test_twenty_failures_from_one_address_refuse_that_address(viewer: User) -> None:
    for attempt in range(20):
        sign_in(f"guess-{attempt}", WRONG, ip="192.0.2.1")

    assert not signed_in(sign_in(viewer.username, "pw-vera-viewer", ip="192.0.2.1"))
    assert signed_in(sign_in(viewer.username, "pw-vera-viewer", ip="192.0.2.2"))


def test_an_ipv6_client_is_counted_by_its_slash_64(viewer: User) -> None:
    # One host holds a whole /64: a new address for every guess must not reset the count.
    for number in range(20):
        sign_in(f"guess-{number}", WRONG, ip=f"2001:db8:1:1::{number + 1:x}")

    assert not signed_in(sign_in(viewer.username, "pw-vera-viewer", ip="2001:db8:1:1:ffff::1"))
    assert signed_in(sign_in(viewer.username, "pw-vera-viewer", ip="2001:db8:1:2::1"))


def test_an_ipv4_mapped_address_counts_as_its_ipv4_address(viewer: User) -> None:
    for _ in range(5):
        sign_in(viewer.username, WRONG, ip="::ffff:192.0.2.9")

    assert not signed_in(sign_in(viewer.username, "pw-vera-viewer", ip="192.0.2.9"))


def test_attempts_take_their_slot_before_the_password_is_checked(viewer: User) -> None:
    # Five attempts being checked at once (none has failed yet): a sixth is refused without a password check,
    # so parallel guesses cannot all be checked before the first failure is counted.
    backend = LoginThrottleBackend()
    for _ in range(5):
        backend.authenticate(RequestFactory().post("/login/", REMOTE_ADDR="10.0.0.7"), username="vera-viewer")

    client, response = attempt(viewer.username, "pw-vera-viewer", ip="10.0.0.7")

    assert not signed_in(client)
    assert "Too many failed sign-ins for this user name from your address" in response.content.decode()


def test_a_successful_sign_in_gives_its_slot_back(viewer: User, settings: Any) -> None:
    settings.DLQ_LOGIN_FAILURES_PER_ADDRESS = 3
    for _ in range(5):
        assert signed_in(sign_in(viewer.username, "pw-vera-viewer", ip="10.0.0.8"))


def test_the_admin_login_is_throttled_too(admin_user: User) -> None:
    admin_user.is_staff = True
    admin_user.save()
    for _ in range(5):
        sign_in(admin_user.username, WRONG, path="/admin/login/")

    client = sign_in(admin_user.username, "pw-ada-admin", path="/admin/login/")

    assert client.get("/admin/").status_code == 302
    assert AuditEntry.objects.filter(action="accounts.login.refused").count() == 1


def test_a_success_before_the_limit_clears_the_name_count(viewer: User) -> None:
    for _ in range(4):
        sign_in(viewer.username, WRONG)
    assert signed_in(sign_in(viewer.username, "pw-vera-viewer"))
    for _ in range(4):
        sign_in(viewer.username, WRONG)

    assert signed_in(sign_in(viewer.username, "pw-vera-viewer"))


def test_the_lock_ends_after_the_lockout(viewer: User, settings: Any) -> None:
    settings.DLQ_LOGIN_LOCKOUT = 1
    for _ in range(5):
        sign_in(viewer.username, WRONG)
    assert not signed_in(sign_in(viewer.username, "pw-vera-viewer"))

    time.sleep(1.1)

    assert signed_in(sign_in(viewer.username, "pw-vera-viewer"))


def test_an_unreachable_cache_lets_sign_in_through(viewer: User, settings: Any) -> None:
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": "redis://127.0.0.1:9/0",
            "OPTIONS": {"socket_connect_timeout": 0.2, "socket_timeout": 0.2},
        }
    }
    sign_in(viewer.username, WRONG)

    assert signed_in(sign_in(viewer.username, "pw-vera-viewer"))
    assert AuditEntry.objects.filter(action="accounts.login.failed").count() == 1


def test_a_lock_writes_one_refused_row_however_many_attempts_it_refuses(viewer: User) -> None:
    for _ in range(5):
        sign_in(viewer.username, WRONG, ip="10.0.0.50")
    for number in range(10):
        sign_in(viewer.username, "pw-vera-viewer" if number % 2 else WRONG, ip="10.0.0.50")

    refused = AuditEntry.objects.filter(action="accounts.login.refused")
    assert refused.count() == 1
    assert "10.0.0.50" in refused.get().detail and "name-address locked" in refused.get().detail
    assert AuditEntry.objects.count() == 6


def test_the_next_lock_writes_its_own_refused_row(viewer: User, settings: Any) -> None:
    settings.DLQ_LOGIN_LOCKOUT = 1
    for _ in range(2):
        for _ in range(5):
            sign_in(viewer.username, WRONG, ip="10.0.0.51")
        sign_in(viewer.username, WRONG, ip="10.0.0.51")
        sign_in(viewer.username, WRONG, ip="10.0.0.51")
        time.sleep(1.1)

    assert AuditEntry.objects.filter(action="accounts.login.refused").count() == 2


def forwarded(username: str, *, remote: str, forwarded_for: str) -> None:
    Client(REMOTE_ADDR=remote, HTTP_X_FORWARDED_FOR=forwarded_for).post(
        "/login/", {"username": username, "password": WRONG}
    )


def test_x_forwarded_for_is_ignored_without_trusted_proxies(viewer: User) -> None:
    forwarded(viewer.username, remote="10.0.0.7", forwarded_for="203.0.113.9")

    assert AuditEntry.objects.get(action="accounts.login.failed").detail.endswith("from 10.0.0.7")


def test_behind_a_trusted_proxy_the_client_is_the_nearest_untrusted_forwarded_address(
    viewer: User, settings: Any
) -> None:
    settings.DLQ_TRUSTED_PROXIES = ["10.0.0.0/8", "192.168.1.1"]
    # The client wrote a fake address first; the two proxies appended the client's real one and the first proxy's.
    forwarded(viewer.username, remote="10.0.0.7", forwarded_for="198.51.100.1, 203.0.113.9, 192.168.1.1")

    assert AuditEntry.objects.get(action="accounts.login.failed").detail.endswith("from 203.0.113.9")


def test_clients_behind_one_trusted_proxy_are_throttled_apart(viewer: User, settings: Any) -> None:
    settings.DLQ_TRUSTED_PROXIES = ["10.0.0.0/8"]
    for number in range(20):
        forwarded(f"guess-{number}", remote="10.0.0.7", forwarded_for="203.0.113.9")
    refused = Client(REMOTE_ADDR="10.0.0.7", HTTP_X_FORWARDED_FOR="203.0.113.9")
    refused.post("/login/", {"username": viewer.username, "password": "pw-vera-viewer"})
    other = Client(REMOTE_ADDR="10.0.0.7", HTTP_X_FORWARDED_FOR="203.0.113.10")
    other.post("/login/", {"username": viewer.username, "password": "pw-vera-viewer"})

    assert not signed_in(refused)
    assert signed_in(other)


def test_a_malformed_forwarded_hop_counts_the_request_as_from_the_last_trusted_proxy(
    viewer: User, settings: Any
) -> None:
    settings.DLQ_TRUSTED_PROXIES = ["10.0.0.0/8"]
    forwarded(viewer.username, remote="10.0.0.7", forwarded_for="203.0.113.9, not-an-address, 10.0.0.3")

    assert AuditEntry.objects.get(action="accounts.login.failed").detail.endswith("from 10.0.0.3")


def test_a_request_not_from_a_trusted_proxy_keeps_its_own_address(viewer: User, settings: Any) -> None:
    settings.DLQ_TRUSTED_PROXIES = ["10.0.0.0/8"]
    forwarded(viewer.username, remote="198.51.100.77", forwarded_for="203.0.113.9")

    assert AuditEntry.objects.get(action="accounts.login.failed").detail.endswith("from 198.51.100.77")
