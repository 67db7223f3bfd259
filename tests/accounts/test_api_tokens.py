"""Making and revoking personal API tokens: the user's own page (/account/tokens/: a token shown once, one's own tokens
only, CSRF, never cached) and `manage.py api_token` (the token on stdout once; revoke one or all; list without
tokens). Both write the audit rows, and what they make works against /api/v1/ until revoked."""

from __future__ import annotations

import datetime as dt
import re
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone

from dlqconsole.accounts.models import ApiToken, AuditEntry
from dlqconsole.accounts.tokens import TOKEN, create_token
from tests.api.conftest import api_client
from tests.conftest import client_for

pytestmark = pytest.mark.django_db

SHOWN = re.compile(r"dlq_[0-9a-f]{8}_[A-Za-z0-9_-]{43}")


def works(token: str) -> bool:
    return api_client(token).get("/api/v1/").status_code == 200


# The page -------------------------------------------------------------------------------------------------------


def test_signed_out_visitors_are_sent_to_login(client: Client) -> None:
    response = client.get("/account/tokens/")

    assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_a_new_token_is_shown_once_works_and_is_never_shown_again(viewer: User) -> None:
    client = client_for(viewer)

    created = client.post("/account/tokens/", {"action": "create", "name": "runbook", "lifetime": "30"})
    reloaded = client.get("/account/tokens/")

    assert created.status_code == 200
    (token,) = SHOWN.findall(created.content.decode())
    assert works(token)
    stored = ApiToken.objects.get(user=viewer, name="runbook")
    assert stored.expires_at is not None
    assert dt.timedelta(days=29, hours=23) < stored.expires_at - timezone.now() <= dt.timedelta(days=30)
    page = reloaded.content.decode()
    assert SHOWN.findall(page) == [] and f"dlq_{stored.prefix}" in page and "runbook" in page
    entry = AuditEntry.objects.get(action="accounts.token.create")
    assert (entry.actor, entry.target) == (viewer, f"user:{viewer.pk}")
    assert f"dlq_{stored.prefix}" in entry.detail and token not in entry.detail


def test_the_page_is_never_cached(viewer: User) -> None:
    client = client_for(viewer)

    for response in (
        client.get("/account/tokens/"),
        client.post("/account/tokens/", {"action": "create", "name": "ci", "lifetime": ""}),
    ):
        assert response.status_code == 200
        assert "no-store" in response["Cache-Control"] and "max-age=0" in response["Cache-Control"]
    assert ApiToken.objects.get(user=viewer, name="ci").expires_at is None


@pytest.mark.parametrize(
    ("form", "problem"),
    [
        ({"name": "", "lifetime": "30"}, "A token&#x27;s name is"),
        ({"name": "bad/name", "lifetime": "30"}, "A token&#x27;s name is"),
        ({"name": "ok", "lifetime": "7"}, "Choose one of the expiry choices."),
        ({"name": "ok", "lifetime": "soon"}, "Choose one of the expiry choices."),
        ({"name": "taken", "lifetime": "30"}, "already has a live token named"),
    ],
)
def test_a_token_that_cannot_be_made_is_refused_with_why(viewer: User, form: dict[str, str], problem: str) -> None:
    create_token(user=viewer, name="taken")

    response = client_for(viewer).post("/account/tokens/", {"action": "create", **form})

    assert response.status_code == 400
    html = response.content.decode()
    assert problem in html and SHOWN.findall(html) == []
    assert ApiToken.objects.filter(user=viewer).count() == 1


def test_revoking_ones_own_token_stops_it_and_another_users_is_404(viewer: User, operator: User) -> None:
    mine, my_token = create_token(user=viewer, name="mine")
    theirs, their_token = create_token(user=operator, name="theirs")
    client = client_for(viewer)

    listed = client.get("/account/tokens/").content.decode()
    refused = client.post("/account/tokens/", {"action": "revoke", "token": theirs.pk})
    revoked = client.post("/account/tokens/", {"action": "revoke", "token": mine.pk}, follow=True)

    assert "mine" in listed and "theirs" not in listed
    assert refused.status_code == 404 and works(their_token)
    assert revoked.status_code == 200 and "Revoked API token mine" in revoked.content.decode()
    assert not works(my_token)
    mine.refresh_from_db()
    assert mine.state() == "revoked"
    entry = AuditEntry.objects.get(action="accounts.token.revoke")
    assert (entry.actor, entry.target) == (viewer, f"user:{viewer.pk}")
    assert AuditEntry.objects.filter(action="accounts.token.revoke").count() == 1


def test_the_forms_need_the_csrf_token(viewer: User) -> None:
    token, plaintext = create_token(user=viewer, name="kept")
    client = client_for(viewer, enforce_csrf_checks=True)
    client.get("/account/tokens/")
    csrf = client.cookies["csrftoken"].value

    forged = [
        client.post("/account/tokens/", {"action": "create", "name": "forged", "lifetime": "30"}),
        client.post("/account/tokens/", {"action": "revoke", "token": token.pk}),
    ]
    made = client.post(
        "/account/tokens/", {"action": "create", "name": "real", "lifetime": "30", "csrfmiddlewaretoken": csrf}
    )

    assert [response.status_code for response in forged] == [403, 403]
    assert works(plaintext) and not ApiToken.objects.filter(name="forged").exists()
    assert made.status_code == 200 and len(SHOWN.findall(made.content.decode())) == 1


def test_a_read_only_token_made_on_the_page_reads_and_changes_nothing(admin_user: User) -> None:
    created = client_for(admin_user).post(
        "/account/tokens/", {"action": "create", "name": "dashboard", "lifetime": "30", "read_only": "on"}
    )

    (token,) = SHOWN.findall(created.content.decode())
    assert ApiToken.objects.get(name="dashboard").read_only
    assert works(token)
    assert api_client(token).post("/api/v1/alerts/1/acknowledge/").status_code == 403
    assert "read-only" in client_for(admin_user).get("/account/tokens/").content.decode()


# The command ----------------------------------------------------------------------------------------------------


def run(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("api_token", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_create_prints_the_token_alone_on_stdout_and_it_works(operator: User) -> None:
    out, err = run("create", operator.username, "--name", "x", "--expires-in", "30d")

    token = out.strip()
    assert TOKEN.fullmatch(token) and out == f"{token}\n"
    assert token not in err and "shown once" in err
    assert works(token)
    stored = ApiToken.objects.get(user=operator, name="x")
    assert stored.expires_at is not None
    assert dt.timedelta(days=29, hours=23) < stored.expires_at - timezone.now() <= dt.timedelta(days=30)
    entry = AuditEntry.objects.get(action="accounts.token.create")
    assert (entry.actor, entry.actor_name) == (None, "system") and token not in entry.detail


def test_list_shows_each_token_and_never_the_token(operator: User) -> None:
    first, _ = run("create", operator.username, "--name", "one")
    second, _ = run("create", operator.username, "--name", "two", "--expires-in", "1d", "--read-only")
    run("revoke", operator.username, "one")

    out, _ = run("list", operator.username)

    lines = out.splitlines()
    assert len(lines) == 2
    assert "API token two (dlq_" in lines[0] and "active" in lines[0] and "read-only" in lines[0]
    assert "expires" in lines[0] and ApiToken.objects.get(name="two").read_only
    assert "API token one (dlq_" in lines[1] and "revoked" in lines[1] and "no expiry" in lines[1]
    assert "read-only" not in lines[1]
    assert SHOWN.findall(out) == []
    for token in (first.strip(), second.strip()):
        assert token[len("dlq_00000000_") :] not in out  # the secret: 43 characters that may hold "_"


def test_revoke_one_by_name_or_all(operator: User, viewer: User) -> None:
    tokens = {name: run("create", operator.username, "--name", name)[0].strip() for name in ("a", "b", "c")}
    other = run("create", viewer.username, "--name", "a")[0].strip()

    one, _ = run("revoke", operator.username, "a")
    assert one == f"Revoked 1 token of {operator.username}.\n"
    assert not works(tokens["a"]) and works(tokens["b"]) and works(other)

    rest, _ = run("revoke", operator.username)
    assert rest == f"Revoked 2 tokens of {operator.username}.\n"
    assert not any(works(token) for token in tokens.values()) and works(other)
    revoked = AuditEntry.objects.filter(action="accounts.token.revoke")
    assert revoked.count() == 3 and set(revoked.values_list("actor_name", flat=True)) == {"system"}


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (("create", "nobody"), "No user named 'nobody'."),
        (("list", "nobody"), "No user named 'nobody'."),
        (("revoke", "nobody"), "No user named 'nobody'."),
        (("revoke", "otto-operator", "missing"), "otto-operator has no live token named 'missing'."),
        (("create", "otto-operator", "--expires-in", "soon"), "--expires-in:"),
        (("create", "otto-operator", "--name", "bad/name"), "A token's name is"),
    ],
)
def test_what_cannot_be_done_is_an_error_and_prints_no_token(
    operator: User, args: tuple[str, ...], problem: str
) -> None:
    out = StringIO()
    with pytest.raises(CommandError, match=re.escape(problem)):
        call_command("api_token", *args, stdout=out, stderr=StringIO())

    assert out.getvalue() == "" and not ApiToken.objects.exists()
