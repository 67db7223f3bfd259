from __future__ import annotations

import io
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from dlqconsole.deadletters.models import FailurePattern, Fingerprint, FingerprintRule, PatternStatus
from dlqconsole.deadletters.rule_services import save_fingerprint_rule
from dlqconsole.deadletters.services import set_pattern_status
from tests.deadletters.conftest import Ingest

ROOT = Path(__file__).resolve().parents[2]
LINES = [
    "user alice not found",
    "Inventory reservation failed for SKU-10001: requested 3, available 0",
    "user bob not found",
    "ValueError: invalid literal for int() with base 10: 'abc'",
    "publish rejected: queue orders-eu full",
    "Inventory reservation failed for SKU-20002: requested 1, available 0",
    "publish rejected: queue billing full",
    "ValueError: invalid literal for int() with base 10: 'n/a'",
    "user carol not found",
    "publish rejected: queue orders-eu paused",
    "Request failed with status code 503",
    "Request failed with status code 404",
    "",
]


def fingerprint_in_subprocess(lines: list[str]) -> list[tuple[str, str]]:
    completed = subprocess.run(
        [sys.executable, "manage.py", "dlq", "fingerprint"],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONHASHSEED": str(random.randint(1, 10**6))},
        timeout=120,
        check=True,
    )
    output = completed.stdout.splitlines()
    assert len(output) == len(lines)
    return [(line.split("\t", 1)[0], line.split("\t", 1)[1]) for line in output]


def test_fingerprint_gives_the_same_keys_in_two_processes_whatever_the_line_order() -> None:
    shuffled = LINES[:]
    random.Random(7).shuffle(shuffled)

    first = dict(zip(LINES, fingerprint_in_subprocess(LINES), strict=True))
    second = dict(zip(shuffled, fingerprint_in_subprocess(shuffled), strict=True))

    assert first == second
    assert first["user alice not found"] == first["user carol not found"]
    assert first["user alice not found"][1] == "user <*> not found"
    assert first["publish rejected: queue orders-eu full"][1] == "publish rejected: queue <*> full"
    assert first["publish rejected: queue orders-eu paused"][0] != first["publish rejected: queue billing full"][0]
    assert first["Request failed with status code 503"] != first["Request failed with status code 404"]
    # Two different quoted values are not enough to call the slot variable.
    assert first["ValueError: invalid literal for int() with base 10: 'abc'"][1] == (
        "ValueError: invalid literal for int() with base <NUM>: 'abc'"
    )
    assert len({key for key, _ in first.values()}) == 9


def run_fingerprint(monkeypatch: pytest.MonkeyPatch, lines: list[str] | bytes, *options: str) -> list[str]:
    raw = lines if isinstance(lines, bytes) else ("\n".join(lines) + "\n").encode()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8"))
    out = io.StringIO()
    call_command("dlq", "fingerprint", *options, stdout=out)
    return out.getvalue().splitlines()


@pytest.mark.django_db
def test_fingerprint_does_not_touch_the_database_unless_asked(
    monkeypatch: pytest.MonkeyPatch,
    django_assert_num_queries,  # type: ignore[no-untyped-def]
) -> None:
    with django_assert_num_queries(0):
        output = run_fingerprint(monkeypatch, LINES)

    assert len(output) == len(LINES)


@pytest.mark.django_db
@pytest.mark.sqlite
def test_fingerprint_save_files_lines_as_ingest_would(monkeypatch: pytest.MonkeyPatch) -> None:
    in_memory = run_fingerprint(monkeypatch, LINES)

    saved = run_fingerprint(monkeypatch, LINES, "--save")

    assert [line.split("\t")[0] for line in saved] == [line.split("\t")[0] for line in in_memory]
    assert FailurePattern.objects.active().count() == 8  # every line but the empty one
    assert Fingerprint.objects.exists()


@pytest.mark.django_db
def test_fingerprint_survives_bytes_that_are_not_text(monkeypatch: pytest.MonkeyPatch) -> None:
    output = run_fingerprint(monkeypatch, b"bad \xff\xfe byte 12\r\n\x00 nul 3\n", "--json")

    rows = [json.loads(line) for line in output]
    # Undecodable bytes and NUL (which PostgreSQL refuses in text) become replacement characters.
    assert [row["template"] for row in rows] == ["bad \ufffd\ufffd byte <NUM>", "\ufffd nul <NUM>"]


@pytest.mark.django_db
@pytest.mark.sqlite
def test_report_lists_active_patterns_with_counts_from_the_counters(ingest: Ingest, operator) -> None:  # type: ignore[no-untyped-def]
    rows = ingest("user alice not found", "user bob not found", "disk full")
    set_pattern_status(pattern=rows[2].pattern, status=PatternStatus.ACKNOWLEDGED, actor=operator)
    out = io.StringIO()

    call_command("dlq", "report", "failure-patterns", "--json", stdout=out)
    acknowledged = io.StringIO()
    call_command("dlq", "report", "failure-patterns", "--status", "acknowledged", stdout=acknowledged)

    report = {row["template"]: row for row in map(json.loads, out.getvalue().splitlines())}
    assert set(report) == {"user <*> not found", "disk full"}
    assert (report["user <*> not found"]["total"], report["user <*> not found"]["parked"]) == (2, 2)
    assert report["disk full"]["status"] == "acknowledged"
    assert "disk full" in acknowledged.getvalue() and "user" not in acknowledged.getvalue()


@pytest.mark.django_db
@pytest.mark.sqlite
def test_report_as_text_names_its_columns_above_the_rows(ingest: Ingest) -> None:
    ingest("user alice not found", "user bob not found")
    out = io.StringIO()

    call_command("dlq", "report", "failure-patterns", stdout=out)

    header, row = out.getvalue().splitlines()
    assert header.split() == ["id", "total", "parked", "status", "reason", "template"]
    assert row.split()[1:4] == ["2", "2", "open"] and row.endswith("user <*> not found")
    # The columns line up under their names.
    assert header.index("status") == row.index("open")


JAVA_TRACE = """java.lang.IllegalStateException: order {order} has no lines
\tat com.acme.orders.OrderService.place(OrderService.java:{line})
\tat com.acme.orders.OrderListener.onMessage(OrderListener.java:57)
\tat org.springframework.amqp.rabbit.listener.AbstractMessageListenerContainer.doInvokeListener(Abstract.java:1)"""


@pytest.mark.django_db
@pytest.mark.sqlite
def test_records_are_grouped_as_ingest_groups_dead_letters_with_those_headers(
    monkeypatch: pytest.MonkeyPatch, ingest: Ingest
) -> None:
    records: list[dict[str, Any]] = [
        {"message": "order 7 has no lines", "stack_trace": JAVA_TRACE.format(order=7, line=120)},
        {"message": "order 9 has no lines", "stack_trace": JAVA_TRACE.format(order=9, line=131)},
        # No type given: read from the front of the message, as ingest reads it.
        {"message": "ValueError: bad id 42"},
        {"message": "user alice not found", "error_type": "LookupError", "headers": {"tenant": "acme"}},
        {"message": "user bob not found", "error_type": "LookupError"},
    ]
    lines = [json.dumps(record) for record in records]

    output = run_fingerprint(monkeypatch, lines, "--records", "--json")
    rows = ingest(
        *[
            {
                "message": record["message"],
                "error_type": record.get("error_type", ""),
                "stack_trace": record.get("stack_trace", ""),
                "headers": record.get("headers", {}),
            }
            for record in records
        ]
    )

    keys = [json.loads(line)["key"] for line in output]
    stored = dict(FailurePattern.objects.values_list("pk", "key"))
    assert keys == [stored[row.pattern_id] for row in rows]
    # One trace signature whatever the line numbers; the type read from the message; the user varies.
    assert keys[0] == keys[1] and keys[3] == keys[4] and len(set(keys)) == 3
    assert json.loads(output[2])["error_type"] == "ValueError"
    # As text, a trace's template names its type once.
    text = run_fingerprint(monkeypatch, lines[:1], "--records")
    assert text[0].split("\t")[1].startswith("IllegalStateException at OrderListener.onMessage → OrderService.place")


@pytest.mark.django_db
@pytest.mark.sqlite
def test_records_saved_meet_the_custom_rules_that_match_headers(monkeypatch: pytest.MonkeyPatch, admin_user) -> None:  # type: ignore[no-untyped-def]
    save_fingerprint_rule(
        rule=FingerprintRule(name="Replays from the old console", header="x-replayed-by"), actor=admin_user
    )
    lines = [
        json.dumps({"message": "card declined", "headers": {"x-replayed-by": "old-console"}}),
        json.dumps({"message": "card declined"}),
    ]

    output = run_fingerprint(monkeypatch, lines, "--records", "--save")

    templates = [line.split("\t", 1)[1] for line in output]
    assert templates == ["Replays from the old console", "card declined"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("not json", "line 2: not JSON"),
        ("[1, 2]", "line 2: a JSON object is needed, not list"),
        ('{"error_type": "X"}', 'line 2: no "message"'),
        ('{"message": 5}', 'line 2: "message" must be text'),
        ('{"message": "x", "stack_trace": 5}', 'line 2: "stack_trace" must be text'),
        ('{"message": "x", "headers": [1]}', 'line 2: "headers" must be an object'),
    ],
)
def test_a_record_that_is_no_such_object_stops_the_command_with_its_line_before_anything_is_filed(
    monkeypatch: pytest.MonkeyPatch, line: str, says: str
) -> None:
    with pytest.raises(CommandError, match=re.escape(says)):
        run_fingerprint(monkeypatch, ['{"message": "user alice not found"}', line], "--records", "--save")

    assert not Fingerprint.objects.exists()
