"""The keyword prefilter of classify() must never change an answer of the plain regex rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlqconsole.deadletters.classify import ADDRESS, RULES, STATUS_REASONS, classify, status_codes
from dlqconsole.deadletters.models import FailureReason

CORPUS = Path(__file__).resolve().parents[1] / "data" / "error_corpus.jsonl"
# One phrase per alternative of every message rule, in odd cases, so each keyword list is exercised.
PHRASES = [
    "Rate-Limit hit",
    "TOO MANY REQUESTS",
    "HTTP 429",
    "Throttled by upstream",
    "Quota Exceeded for project",
    "please SLOW DOWN",
    "Request Timed Out",
    "read timeout",
    "time out waiting",
    "Deadline Exceeded",
    "got 504 from gateway",
    "query took too long",
    "Connection Reset by peer",
    "connection refused",
    "connection aborted",
    "connection closed",
    "connection error",
    "Network is down",
    "host unreachable",
    "Broken Pipe",
    "ECONNRESET",
    "connect ECONNREFUSED 10.0.0.1:80",
    "EHOSTUNREACH",
    "getaddrinfo ENOTFOUND api.example.com",
    "Name or service not known",
    "No route to host",
    "502 Bad Gateway",
    "503 Service Unavailable",
    "SSL: CERTIFICATE_VERIFY_FAILED",
    "EOF occurred in violation of protocol",
    "socket closed",
    "Unauthorised",
    "unauthorized",
    "Forbidden",
    "Access Denied",
    "Permission denied: /var/x",
    "401",
    "403",
    "Invalid Token",
    "token expired",
    "Authentication failed",
    "invalid credentials",
    "not authorized to do that",
    "Not Found",
    "does not exist",
    "No such file",
    "404",
    "unknown id 7",
    "Unknown user",
    "unknown order",
    "unknown key",
    "Missing field",
    "Conflict",
    "duplicate key",
    "already exists",
    "violates unique constraint",
    "409",
    "version mismatch",
    "optimistic lock failed",
    "Deadlock detected",
    "Validation failed",
    "invalid amount",
    "field required",
    "must be positive",
    "Malformed input",
    "cannot parse date",
    "could not parse",
    "Unexpected token < in JSON",
    "400",
    "422",
    "Bad Request",
    "schema mismatch",
    "not a valid email",
    "value out of range",
    "name too long",
    "Expected integer",
    "Internal Server Error",
    "500",
    "panic: runtime error",
    "NullPointer",
    "null pointer dereference",
    "Segmentation fault",
    "AssertionError: assert x",
    "nothing anyone would recognise",
    "",
]


def by_regex_only(*, error_type: str, message: str, stack_trace: str = "") -> FailureReason | None:
    """classify() as it was before the prefilter: every rule's regex, in order."""
    if not error_type and not message and not stack_trace:
        return None
    short_type = error_type.rsplit(".", 1)[-1].rsplit("$", 1)[-1]
    head = message[:2000]
    for reason, type_pattern, _ in RULES[:-1]:
        if short_type and type_pattern.search(short_type):
            return reason
    status = next((STATUS_REASONS[code] for code in status_codes(head) if code in STATUS_REASONS), None)
    words = ADDRESS.sub(" ", head)
    for reason, _, message_pattern in RULES:
        if reason == status or message_pattern.search(words):
            return reason
    if short_type or stack_trace:
        return FailureReason.INTERNAL
    return FailureReason.INTERNAL if head else None


@pytest.mark.parametrize("phrase", PHRASES)
def test_prefilter_gives_the_answer_of_the_regex_rules(phrase: str) -> None:
    for error_type in ("", "Exception", "requests.exceptions.HTTPError"):
        assert classify(error_type=error_type, message=phrase) == by_regex_only(error_type=error_type, message=phrase)


def test_prefilter_agrees_with_the_regex_rules_on_the_whole_error_corpus() -> None:
    rows = [json.loads(line) for line in CORPUS.read_text(encoding="utf-8").splitlines()]
    assert len(rows) > 1000
    for row in rows:
        for error_type in (row["error_type"], ""):
            found = classify(error_type=error_type, message=row["message"], stack_trace=row["stack_trace"])
            expected = by_regex_only(error_type=error_type, message=row["message"], stack_trace=row["stack_trace"])
            assert found == expected, row


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ("POST /v1/charges returned 429", FailureReason.RATE_LIMITED),
        ("upstream error: status=503", FailureReason.NETWORK_ERROR),
        ("HTTP/1.1 504 Gateway Timeout", FailureReason.TIMEOUT),
        ("Request failed with status code 404", FailureReason.NOT_FOUND),
        ("(404, \"NOT_FOUND - no exchange 'orders.events' in vhost '/'\")", FailureReason.NOT_FOUND),
        ("webhook failed after 3 attempts: HTTP 410 Gone", FailureReason.NOT_FOUND),
        ("got 401 from the identity service", FailureReason.AUTH),
    ],
)
def test_status_codes_count_where_the_text_says_they_are_status_codes(message: str, reason: FailureReason) -> None:
    assert classify(error_type="", message=message) == reason


@pytest.mark.parametrize("amount", ["120", "404", "429", "500", "503"])
def test_a_number_that_only_looks_like_a_status_code_does_not_change_the_reason(amount: str) -> None:
    # An amount, count or id that happens to equal a status code must not file the same failure under another
    # reason (and so another pattern) than its neighbours with other numbers.
    assert classify(error_type="", message=f"refund of {amount} EUR declined for order 17") == FailureReason.INTERNAL
    assert classify(error_type="", message=f"{amount} bytes sent, lifetime 2 sec") == FailureReason.INTERNAL


@pytest.mark.parametrize(
    "address",
    [
        "https://api.example.com/v1/network-settings",
        "https://api.example.com/v1/orders?timeout=30",
        "/users/missing-avatar/render",
        "ssl-gateway.internal:8443",
    ],
)
def test_words_inside_an_address_do_not_change_the_reason(address: str) -> None:
    assert classify(error_type="", message=f"POST {address} failed: status 500") == FailureReason.INTERNAL
    assert classify(error_type="", message=f"cannot render {address} for tenant 7") == FailureReason.INTERNAL


@pytest.mark.parametrize("field", ["network_id", "timeout_ms", "ssl_mode", "duplicate_of"])
def test_a_quoted_value_does_not_change_the_reason(field: str) -> None:
    for message in ("missing required field '{}'", "unknown column `{}` in field list"):
        assert classify(error_type="", message=message.format(field)) == classify(
            error_type="", message=message.format("email")
        )


def test_quoted_phrases_are_the_errors_own_words() -> None:
    assert (
        classify(error_type="", message="('Connection aborted.', RemoteDisconnected('closed'))")
        == FailureReason.NETWORK_ERROR
    )
    assert classify(error_type="", message="(1213, 'Deadlock found when trying to get lock')") == FailureReason.CONFLICT


def test_words_beside_an_address_still_count() -> None:
    assert classify(error_type="", message="connect ECONNREFUSED 10.0.0.7:6379") == FailureReason.NETWORK_ERROR
    assert (
        classify(error_type="", message="Failed to connect to db.internal:5432: Connection refused")
        == FailureReason.NETWORK_ERROR
    )
    assert classify(error_type="", message="GET https://api.example.com/x timed out") == FailureReason.TIMEOUT


def test_phrases_fall_into_their_rules() -> None:
    assert classify(error_type="", message="getaddrinfo ENOTFOUND api") == FailureReason.NETWORK_ERROR
    assert classify(error_type="", message="Quota Exceeded") == FailureReason.RATE_LIMITED
    assert classify(error_type="", message="nothing anyone would recognise") == FailureReason.INTERNAL
    assert classify(error_type="", message="") is None
