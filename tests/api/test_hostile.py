"""The API against a hostile caller: a viewer's or a read-only token trying to change things by any method, an operator
trying to purge, forged cursors and filters that would reach the database as they are, texts that make a regular
expression backtrack, bodies too deep or too large, forged token headers and the token page's form posted by hand.
Every answer is JSON, every refusal is a 4xx that changes nothing, and nothing takes more than a moment."""

from __future__ import annotations

import base64
import itertools
import json
import re
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import pytest
from django.contrib.auth.models import User
from django.db import DatabaseError
from django.test import Client
from django.utils import timezone
from django.views.debug import ExceptionReporter
from rest_framework.request import Request
from rest_framework.test import APIClient, APIRequestFactory

from dlqconsole.accounts.models import ApiToken, AuditEntry
from dlqconsole.accounts.services import record_audit
from dlqconsole.accounts.tokens import create_token, describe
from dlqconsole.alerts.models import Alert, AlertStatus
from dlqconsole.api.authentication import TokenAuthentication
from dlqconsole.core.durations import DURATION_FORMAT
from dlqconsole.deadletters.filters import MAX_IDS
from dlqconsole.deadletters.models import DeadLetter, FailurePattern, PatternStatus
from dlqconsole.operations.models import Operation, OperationStatus
from dlqconsole.operations.planning import plan_operation
from tests.api.conftest import api_client, token_for
from tests.conftest import client_for
from tests.factories import EnvelopeFactory, parked, rule, store

pytestmark = pytest.mark.django_db

ApiFor = Callable[[User], APIClient]
LISTS = ("/api/v1/dead-letters/", "/api/v1/patterns/", "/api/v1/operations/", "/api/v1/alerts/", "/api/v1/audit/")
# The largest id a bigint column holds: a cursor past every row.
LAST_ID = 2**63 - 1
# Digits, then a unit, then a word after a space: an age to parse_moment that core/durations.py cannot read, and
# that its pattern takes days to give up on (every way of cutting the digits into parts is tried).
BACKTRACKING_AGE = "1" * 40 + "a b"


@contextmanager
def deadline(seconds: int) -> Iterator[None]:
    """Fail the block when it runs longer (SIGALRM: the regular expression engine checks for signals as it runs)."""

    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def quiet(client: Any) -> Any:
    """The client answers a server error with the response (a 500) rather than raising it in the test."""
    client.raise_request_exception = False
    return client


def is_json(response: Any) -> bool:
    """JSON (the schema's own type on the schema's URL), never sniffed as anything else."""
    kinds = ("application/json", "application/vnd.oai.openapi+json")
    return response["Content-Type"] in kinds and response["X-Content-Type-Options"] == "nosniff"


def cursor(query: str) -> str:
    return base64.b64encode(query.encode()).decode()


def firing_alert() -> Alert:
    return Alert.objects.create(
        rule=rule("dlq_not_empty", severity="warning"),
        subject="queue:orders.dlq",
        subject_label="orders.dlq",
        severity="warning",
        status=AlertStatus.FIRING,
        summary="orders.dlq has dead letters",
        started_at=timezone.now(),
        fired_at=timezone.now(),
    )


# Texts that make a regular expression backtrack -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("who", "send"),
    [
        ("viewer", lambda client, ids: client.get("/api/v1/dead-letters/", {"since": BACKTRACKING_AGE})),
        ("viewer", lambda client, ids: client.get("/api/v1/dead-letters/", {"until": BACKTRACKING_AGE})),
        ("viewer", lambda client, ids: client.get("/api/v1/audit/", {"since": BACKTRACKING_AGE})),
        ("viewer", lambda client, ids: client.get("/api/v1/audit/", {"until": BACKTRACKING_AGE})),
        (
            "operator",
            lambda client, ids: client.post(
                "/api/v1/operations/", {"kind": "retry", "filter": {"since": BACKTRACKING_AGE}}, format="json"
            ),
        ),
        (
            "operator",
            lambda client, ids: client.post(
                f"/api/v1/alerts/{ids['alert']}/silence/", {"for": "1" * 37 + "a b"}, format="json"
            ),
        ),
    ],
    ids=["dead-letters-since", "dead-letters-until", "audit-since", "audit-until", "plan-since", "silence-for"],
)
def test_an_age_that_would_backtrack_is_refused_at_once(
    api_for: ApiFor, viewer: User, operator: User, who: str, send: Callable[[APIClient, dict[str, int]], Any]
) -> None:
    client = api_for(viewer if who == "viewer" else operator)
    ids = {"alert": firing_alert().pk}

    with deadline(5):
        response = send(client, ids)

    assert response.status_code == 400 and is_json(response)
    assert "not" in response.json()["detail"]
    assert not Operation.objects.exists()
    assert Alert.objects.get(pk=ids["alert"]).silenced_until is None


def test_the_duration_pattern_reads_every_short_text_as_the_backtracking_one_did() -> None:
    """The possessive pattern of core/durations.py refuses only what the pattern before it refused: every text of up
    to six characters of digits, letters, spaces and punctuation is read alike."""
    before = re.compile(r"(?:\s*\d{1,9}\s*[a-z]*\s*)+")
    differ = [
        text
        for size in range(7)
        for text in map("".join, itertools.product("1 a\t!", repeat=size))
        if bool(before.fullmatch(text)) != bool(DURATION_FORMAT.fullmatch(text))
    ]
    assert differ == []


def test_the_messages_page_refuses_such_an_age_at_once(viewer: User) -> None:
    with deadline(5):
        response = client_for(viewer).get("/messages/", {"since": BACKTRACKING_AGE})
    assert response.status_code == 200
    assert "not" in response.content.decode()


@pytest.mark.parametrize("age", ["2h", "1h30m", "2 days", " 7d ", "2026-01-01", "2026-01-01T08:00:00Z"])
def test_ages_and_moments_still_read(api_for: ApiFor, viewer: User, age: str) -> None:
    client = api_for(viewer)
    assert client.get("/api/v1/dead-letters/", {"since": age}).status_code == 200
    assert client.get("/api/v1/audit/", {"until": age}).status_code == 200


def test_a_silence_for_a_while_still_reads(api_for: ApiFor, operator: User) -> None:
    alert = firing_alert()
    response = api_for(operator).post(f"/api/v1/alerts/{alert.pk}/silence/", {"for": "1h 30m"}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["silenced_until"] is not None


# Forged cursors, filters and ids ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "position", ["abc", "\x00", "1.5", "-", "9" * 5000], ids=["text", "nul", "decimal", "dash", "5000-digits"]
)
@pytest.mark.parametrize("path", LISTS)
def test_a_forged_cursor_is_a_404_not_a_server_error(api_for: ApiFor, viewer: User, path: str, position: str) -> None:
    parked(2)
    response = quiet(api_for(viewer)).get(path, {"cursor": cursor(f"p={position}")})
    assert response.status_code == 404 and is_json(response)
    assert response.json() == {"detail": "Invalid cursor", "code": "not_found"}


@pytest.mark.parametrize("path", LISTS)
def test_a_cursor_past_every_id_is_an_empty_page(api_for: ApiFor, viewer: User, path: str) -> None:
    parked(2)
    response = api_for(viewer).get(path, {"cursor": cursor(f"p={LAST_ID}&r=1")})
    assert response.status_code == 200 and is_json(response)
    assert response.json()["results"] == []


def test_a_broker_filter_with_a_nul_is_refused(api_for: ApiFor, viewer: User) -> None:
    response = quiet(api_for(viewer)).get("/api/v1/queues/", {"broker": "default\x00"})
    assert response.status_code == 400 and is_json(response)
    assert response.json()["code"] == "refused"


@pytest.mark.parametrize(
    "query",
    [
        {"ids": ",".join(str(pk) for pk in range(1, 100_001))},
        {"text": "a\x00b"},
        {"queue": "orders\x00"},
        {"status": "parked\x00"},
        {"priority": "9" * 10_000},
        {"broker": "no such broker"},
        {"limit_": "5"},
    ],
    ids=["100k-ids", "nul-text", "nul-queue", "nul-status", "huge-priority", "bad-broker", "unknown-parameter"],
)
def test_a_filter_the_database_cannot_take_is_refused(api_for: ApiFor, viewer: User, query: dict[str, str]) -> None:
    response = quiet(api_for(viewer)).get("/api/v1/dead-letters/", query)
    assert response.status_code == 400 and is_json(response)


def test_a_nul_in_a_payload_search_is_searched_for(api_for: ApiFor, viewer: User) -> None:
    (letter,) = store(EnvelopeFactory.build(body=b"before\x00after"))
    response = api_for(viewer).get("/api/v1/dead-letters/", {"payload": "e\x00a"})
    assert response.status_code == 200
    assert [row["id"] for row in response.json()["results"]] == [letter.pk]


@pytest.mark.parametrize("limit", ["0", "-1", "abc", "1e3", "\x00", "٣"])
def test_a_limit_that_is_no_whole_number_from_1_is_refused(api_for: ApiFor, viewer: User, limit: str) -> None:
    response = api_for(viewer).get("/api/v1/audit/", {"limit": limit})
    assert response.status_code == 400 and is_json(response)
    assert response.json()["detail"].startswith("limit: A whole number from 1 to 500")


def test_a_limit_past_500_gives_500(api_for: ApiFor, viewer: User) -> None:
    for index in range(3):
        record_audit(actor=viewer, action=f"filler.{index}")
    response = api_for(viewer).get("/api/v1/audit/", {"limit": "99999999999999999999999"})
    assert response.status_code == 200 and len(response.json()["results"]) == AuditEntry.objects.count() >= 3


@pytest.mark.parametrize("text", ["garbage", "", "o=3", "r=1"])
def test_a_cursor_without_a_position_is_a_404(api_for: ApiFor, viewer: User, text: str) -> None:
    cursor = base64.b64encode(text.encode()).decode()
    response = api_for(viewer).get("/api/v1/audit/", {"cursor": cursor or "=="})
    assert response.status_code == 404 and is_json(response)


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/dead-letters/99999999999999999999/",
        "/api/v1/dead-letters/999999999999999999/",
        "/api/v1/patterns/99999999999999999999/",
        "/api/v1/operations/99999999999999999999/",
        "/api/v1/alerts/99999999999999999999/",
        "/api/v1/alerts/-1/",
        "/api/v1/alerts/%00/",
        "/api/v1/operations/1e3/",
    ],
)
def test_an_id_out_of_range_is_a_404(api_for: ApiFor, viewer: User, path: str) -> None:
    response = quiet(api_for(viewer)).get(path)
    assert response.status_code == 404 and is_json(response)


# Bodies ---------------------------------------------------------------------------------------------------------------


def test_json_nested_too_deep_is_a_400(api_for: ApiFor, operator: User) -> None:
    body = "[" * 100_000 + "]" * 100_000
    response = quiet(api_for(operator)).post("/api/v1/patterns/merge/", body, content_type="application/json")
    assert response.status_code == 400 and is_json(response)
    assert response.json()["code"] == "parse_error"


def test_a_body_over_the_upload_limit_is_a_json_400(api_for: ApiFor, operator: User, settings: Any) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10_000
    body = json.dumps({"target": 1, "sources": [2] * 10_000})
    response = quiet(api_for(operator)).post("/api/v1/patterns/merge/", body, content_type="application/json")
    assert response.status_code == 400 and is_json(response)
    assert response.json()["code"] == "too_large"
    assert "10,000 bytes" in response.json()["detail"]


def test_too_many_query_parameters_is_a_json_400(api_for: ApiFor, viewer: User) -> None:
    query = "&".join(f"p{number}=1" for number in range(1_100))
    response = quiet(api_for(viewer)).get(f"/api/v1/dead-letters/?{query}")
    assert response.status_code == 400 and is_json(response)
    assert response.json()["code"] == "bad_request"


@pytest.mark.parametrize(
    ("field", "values"),
    [("queue", [f"q{number}" for number in range(MAX_IDS + 1)]), ("pattern", list(range(1, MAX_IDS + 2)))],
)
def test_a_plan_filter_holds_at_most_max_ids_values_a_list(
    api_for: ApiFor, operator: User, field: str, values: list[Any]
) -> None:
    response = api_for(operator).post(
        "/api/v1/operations/", {"kind": "retry", "filter": {field: values}}, format="json"
    )
    assert response.status_code == 400 and is_json(response)
    assert list(response.json()["errors"]["filter"]) == [field]
    assert not Operation.objects.exists()


@pytest.mark.parametrize(
    "body",
    [
        {"note": "a\x00b"},
        {"owner": "otto\x00"},
        {"status": "resolved\x00"},
        {"note": ["a"]},
        {"owner": {"username": "otto-operator"}},
    ],
)
def test_a_triage_the_database_cannot_take_is_refused_and_changes_nothing(
    api_for: ApiFor, operator: User, body: dict[str, Any]
) -> None:
    (letter,) = parked(1)
    response = api_for(operator).post(f"/api/v1/patterns/{letter.pattern_id}/triage/", body, format="json")
    assert response.status_code == 400 and is_json(response)
    pattern = FailurePattern.objects.get(pk=letter.pattern_id)
    assert (pattern.status, pattern.owner, pattern.note) == (PatternStatus.OPEN, None, "")


@pytest.mark.parametrize(
    "body", [{"for": "2h\x00"}, {"for": "99999999999w"}, {"for": "nan"}, {"until": "+275760-01-01"}]
)
def test_a_silence_the_console_cannot_keep_is_refused(api_for: ApiFor, operator: User, body: dict[str, str]) -> None:
    alert = firing_alert()
    response = api_for(operator).post(f"/api/v1/alerts/{alert.pk}/silence/", body, format="json")
    assert response.status_code == 400 and is_json(response)
    assert Alert.objects.get(pk=alert.pk).silenced_until is None


# Roles, whatever the method -------------------------------------------------------------------------------------------


def test_no_method_variant_lets_a_viewer_or_a_read_only_token_change_anything(viewer: User, admin_user: User) -> None:
    (letter,) = parked(1)
    alert = firing_alert()
    clients = {
        "viewer": api_client(token_for(viewer)),
        "read-only admin": api_client(create_token(user=admin_user, name="ro", read_only=True)[1]),
    }
    changes = [
        f"/api/v1/patterns/{letter.pattern_id}/triage/",
        f"/api/v1/patterns/{letter.pattern_id}/triage",
        f"/api/v1/patterns/{letter.pattern_id}/triage/?_method=GET",
        f"/api/v1/patterns/{letter.pattern_id}/triage.json",
        f"/api/v1/patterns/{letter.pattern_id}/",
        f"/api/v1/alerts/{alert.pk}/acknowledge/",
        f"/api/v1/alerts/{alert.pk}/",
        "/api/v1/operations/",
        "/api/v1/openapi.json",
        "/api/v1/",
    ]
    rows_before = AuditEntry.objects.count()
    answers = []
    for (who, client), path, method in itertools.product(clients.items(), changes, ("post", "put", "patch", "delete")):
        response = getattr(client, method)(
            path,
            {"status": "resolved", "kind": "purge", "filter": {"ids": [letter.pk]}},
            format="json",
            HTTP_X_HTTP_METHOD_OVERRIDE="GET",
            HTTP_X_METHOD_OVERRIDE="GET",
        )
        answers.append((who, method, path, response.status_code, is_json(response)))
    for (who, client), path in itertools.product(clients.items(), changes):
        answers.append((who, "options", path, client.options(path).status_code, True))
        answers.append((who, "head", path, client.head(path).status_code, True))

    assert [answer for answer in answers if answer[3] < 400 and answer[1] not in ("options", "head")] == []
    assert [answer for answer in answers if not answer[4]] == []
    assert FailurePattern.objects.get(pk=letter.pattern_id).status == PatternStatus.OPEN
    assert Alert.objects.get(pk=alert.pk).status == AlertStatus.FIRING
    assert not Operation.objects.exists()
    assert AuditEntry.objects.count() == rows_before


def test_an_operator_neither_plans_nor_starts_nor_steers_a_purge(
    api_for: ApiFor, operator: User, admin_user: User
) -> None:
    letters = parked(2)
    purge = plan_operation(kind="purge", filter={"ids": [row.pk for row in letters]}, actor=admin_user)
    client = api_for(operator)

    planned = client.post("/api/v1/operations/", {"kind": "purge", "filter": {"queue": ["orders.dlq"]}}, format="json")
    started = [
        client.post(f"/api/v1/operations/{purge.pk}/start/", {"confirm_count": count}, format="json")
        for count in (2, None, 0)
    ]
    steered = [
        client.post(f"/api/v1/operations/{purge.pk}/{control}/", {"rate": ""}, format="json")
        for control in ("pause", "resume", "rate", "cancel")
    ]

    assert planned.status_code == 403 and planned.json()["detail"] == "This needs the admin role."
    assert [response.status_code for response in started + steered] == [403] * 7
    assert Operation.objects.get(pk=purge.pk).status == OperationStatus.PLANNED
    assert DeadLetter.objects.filter(pk__in=[row.pk for row in letters]).count() == 2
    assert Operation.objects.count() == 1


def test_a_deactivated_users_session_and_tokens_get_401(operator: User) -> None:
    session, token = client_for(operator), api_client(token_for(operator))
    assert session.get("/api/v1/").status_code == token.get("/api/v1/").status_code == 200
    User.objects.filter(pk=operator.pk).update(is_active=False)
    for client in (session, token):
        response = client.post(
            "/api/v1/patterns/merge/", {"target": 1, "sources": [2]}, content_type="application/json"
        )
        assert response.status_code == 401 and is_json(response)


def test_a_demoted_users_session_loses_the_role_at_once(operator: User) -> None:
    from dlqconsole.accounts.services import set_role

    session = client_for(operator)
    assert session.get("/api/v1/").json()["role"] == "operator"
    set_role(user=operator, role="viewer")
    (letter,) = parked(1)
    response = session.post(f"/api/v1/patterns/{letter.pattern_id}/triage/", {"note": "x"}, "application/json")
    assert response.status_code == 403 and response.json()["detail"] == "This needs the operator role."


# CSRF and cross-site posts ------------------------------------------------------------------------------------------


def test_a_session_change_without_the_csrf_header_is_refused_even_without_a_body(
    operator: User, admin_user: User
) -> None:
    (letter,) = parked(1)
    operation = plan_operation(kind="archive", filter={"ids": [letter.pk]}, actor=admin_user)
    browser = client_for(operator, enforce_csrf_checks=True)
    browser.get("/api/v1/docs/")  # the page sets the CSRF cookie; a form on another site cannot send the header

    answers = [
        browser.post(f"/api/v1/operations/{operation.pk}/cancel/", "", content_type="text/plain"),
        browser.post(f"/api/v1/operations/{operation.pk}/cancel/", {"x": "1"}),
        browser.post(f"/api/v1/operations/{operation.pk}/cancel/", "{}", content_type="application/json"),
    ]

    assert [response.status_code for response in answers] == [403, 403, 403]
    assert all("CSRF" in response.json()["detail"] for response in answers)
    assert Operation.objects.get(pk=operation.pk).status == OperationStatus.PLANNED


def test_a_form_with_a_token_gets_415_for_anything_but_json(api_for: ApiFor, operator: User) -> None:
    (letter,) = parked(1)
    client = api_for(operator)
    path = f"/api/v1/patterns/{letter.pattern_id}/triage/"
    assert client.post(path, "note=x", content_type="application/x-www-form-urlencoded").status_code == 415
    assert client.post(path, '{"note": "x"}', content_type="text/plain").status_code == 415
    assert FailurePattern.objects.get(pk=letter.pattern_id).note == ""


# Tokens -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spoil",
    [
        lambda token: f"Bearer {token}\x00",
        lambda token: f"Bearer {token}\u00e9",
        lambda token: f"Bearer {token[:-1]}\u00ff",
        lambda token: f"Bearer {token.upper()}",
        lambda token: f"Bearer {token}{token}",
        lambda token: f"Bearer {token} {token}",
        lambda token: f"Bearer {token[:-1]}",
        lambda token: f"Bearer {token[:13]}{'A' * 43}",
        lambda token: f"Bearer {token}" + " x" * 50_000,
        lambda token: "Bearer " + "a" * 1_000_000,
        lambda token: "Bearer dlq_" + "\x00" * 8 + "_" + "A" * 43,
    ],
    ids=["nul", "accent", "latin-1", "upper", "twice", "two-words", "short", "wrong-secret", "long", "huge", "nuls"],
)
def test_a_forged_token_header_is_a_401_that_does_not_echo_it(viewer: User, spoil: Callable[[str], str]) -> None:
    _, plaintext = create_token(user=viewer, name="real")
    client = quiet(APIClient())
    client.credentials(HTTP_AUTHORIZATION=spoil(plaintext))
    response = client.get("/api/v1/")
    assert response.status_code == 401 and is_json(response)
    assert plaintext[13:] not in response.content.decode()
    assert response["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize("header", ["bearer  {}", "Token {}", "BEARER\t{}", "  Bearer {}  "])
def test_a_token_reads_whatever_the_spelling_of_the_scheme(viewer: User, header: str) -> None:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header.format(token_for(viewer)))
    assert client.get("/api/v1/").status_code == 200


def test_error_reports_do_not_show_the_token(viewer: User) -> None:
    """A failure while a token is looked up: the report with each frame's variables (the DEBUG page, HTML error
    e-mails) hides it."""
    _, plaintext = create_token(user=viewer, name="ci")
    raw = APIRequestFactory().get("/api/v1/", HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    lookup = mock.patch.object(ApiToken.objects, "select_related", side_effect=DatabaseError("gone"))
    with lookup, pytest.raises(DatabaseError) as failure:
        TokenAuthentication().authenticate(Request(raw))
    # From the authentication's frame on (this test's own frame holds the token, as no frame of the console does).
    report = ExceptionReporter(raw, failure.type, failure.value, failure.tb.tb_next).get_traceback_html()
    assert "dlqconsole/accounts/tokens.py" in report
    secret = plaintext[13:]
    assert [secret[start : start + 12] for start in range(0, 32) if secret[start : start + 12] in report] == []


def test_the_audit_names_the_token_whatever_headers_the_client_sends(api_for: ApiFor, operator: User) -> None:
    (letter,) = parked(1)
    _, plaintext = create_token(user=operator, name="runbook")
    client = api_client(plaintext)
    client.post(
        f"/api/v1/patterns/{letter.pattern_id}/triage/",
        {"note": "looking"},
        format="json",
        HTTP_VIA="API token admin-script (dlq_00000000)",
        HTTP_X_VIA="the pages",
        HTTP_X_FORWARDED_USER="ada-admin",
        HTTP_X_REMOTE_USER="ada-admin",
        REMOTE_USER="ada-admin",
    )
    token = ApiToken.objects.get(user=operator, name="runbook")
    entry = AuditEntry.objects.filter(action__startswith="pattern").get()
    assert (entry.actor, entry.via) == (operator, describe(token))


def test_the_token_page_revokes_only_the_users_own_token_and_refuses_a_forged_id(viewer: User, operator: User) -> None:
    theirs, _ = create_token(user=operator, name="theirs")
    mine, _ = create_token(user=viewer, name="mine")
    page: Client = quiet(client_for(viewer))

    answers = {
        value: page.post("/account/tokens/", {"action": "revoke", "token": value}).status_code
        for value in (str(theirs.pk), "abc", "", "1\x00", "99999999999999999999", "١", f"{mine.pk}.0")
    }

    assert answers == dict.fromkeys(answers, 404)
    assert ApiToken.objects.filter(revoked_at__isnull=False).count() == 0
    assert page.post("/account/tokens/", {"action": "revoke", "token": str(mine.pk)}).status_code == 302
    assert ApiToken.objects.get(pk=mine.pk).revoked_at is not None


# What is read back ------------------------------------------------------------------------------------------------


def test_sign_in_rows_stay_hidden_from_non_admins_whatever_the_filter(
    api_for: ApiFor, viewer: User, operator: User, admin_user: User
) -> None:
    record_audit(actor=None, action="accounts.login.failed", target="user:vera-viewer", detail="typed hunter2")
    record_audit(actor=viewer, action="accounts.login", target="user:vera-viewer", detail="from 10.0.0.1")
    record_audit(actor=None, action="accounts.login.refused", target="user:vera-viewer", detail="locked")
    filters = [
        {},
        {"action": "login"},
        {"action": "ACCOUNTS.LOGIN"},
        {"action": "accounts.login.failed"},
        {"target": "user:vera-viewer"},
        {"actor": "vera-viewer"},
        {"actor": "system"},
        {"since": "1h"},
        {"limit": "500"},
        {"cursor": cursor(f"p={LAST_ID}")},
    ]

    def actions(user: User) -> set[str]:
        client = api_for(user)
        return {row["action"] for query in filters for row in client.get("/api/v1/audit/", query).json()["results"]}

    assert not any(action.startswith("accounts.login") for action in actions(viewer) | actions(operator))
    assert {"accounts.login", "accounts.login.failed", "accounts.login.refused"} <= actions(admin_user)


def test_a_dead_letters_markup_is_json_never_a_page(api_for: ApiFor, viewer: User) -> None:
    markup = "<script>alert(1)</script><img src=x onerror=alert(2)>\x1b[31m\u2028".encode()
    (letter,) = store(
        EnvelopeFactory.build(body=markup, content_type="text/html", headers={"x-html": "<b onmouseover=alert(3)>"})
    )
    client = api_for(viewer)

    answers = [
        client.get(f"/api/v1/dead-letters/{letter.pk}/"),
        client.get(f"/api/v1/dead-letters/{letter.pk}/", HTTP_ACCEPT="text/html"),
        client.get(f"/api/v1/dead-letters/{letter.pk}/", {"format": "api"}),
        client.get(f"/api/v1/dead-letters/{letter.pk}/", {"format": "html"}),
        client.get("/api/v1/dead-letters/", {"format": "api"}),
    ]

    assert all(is_json(response) for response in answers)
    assert [response.status_code for response in answers] == [200, 406, 404, 404, 404]
    body = answers[0].content.decode()
    assert answers[0].json()["body"] == markup.decode()
    assert "\\u001b" in body and "\x1b" not in body and "\u2028" not in body


def test_a_bad_host_under_the_api_is_a_json_400() -> None:
    response = Client(HTTP_HOST="evil.example").get("/api/v1/")
    assert response.status_code == 400 and is_json(response)
    assert response.json()["code"] == "bad_request"


def test_an_audit_target_of_many_spaces_is_read_at_once(api_for: ApiFor, viewer: User) -> None:
    with deadline(2):
        response = api_for(viewer).get("/api/v1/audit/", {"target": "pattern" + " " * 20000 + "x"})
    assert response.status_code == 200


def test_a_misspelt_body_field_is_refused_and_changes_nothing(api_for: ApiFor, admin_user: User) -> None:
    """`"rat": "1/1s"` must not plan a retry at the default rate, nor `"stauts"` change only the note."""
    letters = parked(2)
    pattern = letters[0].pattern
    alert = firing_alert()
    retry = plan_operation(kind="retry", filter={"ids": [row.pk for row in letters]}, actor=admin_user)
    client = api_for(admin_user)
    calls = {
        "plan": ("/api/v1/operations/", {"kind": "retry", "filter": {"pattern": [pattern.pk]}, "rat": "1/1s"}),
        "start": (f"/api/v1/operations/{retry.pk}/start/", {"confirm": 2}),
        "pause": (f"/api/v1/operations/{retry.pk}/pause/", {"reasn": "x"}),
        "resume": (f"/api/v1/operations/{retry.pk}/resume/", {"now": True}),
        "rate": (f"/api/v1/operations/{retry.pk}/rate/", {"rat": "1/1s"}),
        "cancel": (f"/api/v1/operations/{retry.pk}/cancel/", {"force": True}),
        "triage": (f"/api/v1/patterns/{pattern.pk}/triage/", {"stauts": "resolved", "note": "typo"}),
        "merge": ("/api/v1/patterns/merge/", {"target": pattern.pk, "source": [pattern.pk]}),
        "split": (f"/api/v1/patterns/{pattern.pk}/split/", {"name": "x", "regexp": "a"}),
        "acknowledge": (f"/api/v1/alerts/{alert.pk}/acknowledge/", {"silence": "1h"}),
        "silence": (f"/api/v1/alerts/{alert.pk}/silence/", {"for": "1h", "reason": "x"}),
    }
    answers = {name: client.post(path, body, format="json") for name, (path, body) in calls.items()}

    assert {name: answer.status_code for name, answer in answers.items()} == dict.fromkeys(calls, 400)
    assert all("Not a field of this request" in answer.json()["detail"] for answer in answers.values())
    assert Operation.objects.count() == 1 and Operation.objects.get().status == OperationStatus.PLANNED
    pattern.refresh_from_db()
    assert pattern.note == "" and pattern.status == PatternStatus.OPEN
    assert Alert.objects.get(pk=alert.pk).status == AlertStatus.FIRING


def test_every_resource_names_its_links_alike(api_for: ApiFor, admin_user: User) -> None:
    """`url` is the object in the API, `page` its page in the console, both absolute, on every resource."""
    letter = parked(1)[0]
    operation = plan_operation(kind="retry", filter={"ids": [letter.pk]}, actor=admin_user)
    alert = firing_alert()
    client = api_for(admin_user)
    expected = {
        "dead-letters": (letter.pk, "/messages/"),
        "patterns": (letter.pattern_id, "/patterns/"),
        "operations": (operation.pk, "/operations/"),
        "alerts": (alert.pk, "/alerts/"),
    }
    for resource, (pk, page) in expected.items():
        row = client.get(f"/api/v1/{resource}/", {"limit": 1}).json()["results"][0]
        assert row["url"] == f"http://testserver/api/v1/{resource}/{pk}/", resource
        assert row["page"] == f"http://testserver{page}{pk}/", resource
        assert client.get(row["url"]).json()["id"] == pk
