"""parse_envelope on the headers RabbitMQ 3.10 to 4.x, Celery and application frameworks write, and the
tolerant AMQP table decoder. (Messages through the real broker: test_bad_input.py, test_broker_deaths.py.)"""

from __future__ import annotations

import base64
import datetime as dt
import json
import struct
from decimal import Decimal
from typing import Any

import pika
from django.test import override_settings

from dlqconsole.core import jsonsafe
from dlqconsole.ingest.amqp_decoding import UNDECODABLE_HEADER, decode_table, install_tolerant_decoding
from dlqconsole.ingest.envelope import parse_envelope

NOW = dt.datetime(2026, 11, 20, 12, 0, tzinfo=dt.UTC)


def death(queue: str, reason: str, count: int, minutes_ago: int, **extra: Any) -> dict[str, Any]:
    return {
        "count": count,
        "reason": reason,
        "queue": queue,
        "time": NOW - dt.timedelta(minutes=minutes_ago),
        "exchange": extra.pop("exchange", "shop"),
        "routing-keys": extra.pop("routing_keys", ["orders.created"]),
        **extra,
    }


def parse(body: bytes = b"{}", **properties: Any) -> Any:
    properties.setdefault("content_type", "application/json")
    return parse_envelope(source_queue="orders.dlq", body=body, properties=pika.BasicProperties(**properties), now=NOW)


def test_every_x_death_entry_is_kept_and_the_newest_names_the_origin() -> None:
    # RabbitMQ puts the newest death first; the message went orders -> (rejected) -> retry (expired) -> orders.
    history = [
        death("orders", "rejected", 2, 1, routing_keys=["orders.created", "audit"]),
        death("orders.retry", "expired", 2, 3, exchange="orders.dlx", **{"original-expiration": "5000"}),
        death("orders", "rejected", 1, 9),
    ]

    letter = parse(headers={"x-death": history})

    assert (letter.original_queue, letter.original_exchange) == ("orders", "shop")
    assert letter.original_routing_keys == ["orders.created", "audit"]
    assert letter.death_reason == "rejected"
    assert letter.attempt_count == 5
    assert (letter.first_failed_at, letter.last_failed_at) == (
        NOW - dt.timedelta(minutes=9),
        NOW - dt.timedelta(minutes=1),
    )
    assert [entry["queue"] for entry in letter.x_death] == ["orders", "orders.retry", "orders"]
    assert letter.x_death[1]["original-expiration"] == "5000"
    assert letter.x_death[0]["time"] == {"$ts": int((NOW - dt.timedelta(minutes=1)).timestamp())}
    assert letter.parse_errors == []


def test_quorum_delivery_count_raises_the_attempt_count() -> None:
    letter = parse(headers={"x-death": [death("orders", "delivery_limit", 1, 1)], "x-delivery-count": 4})

    assert (letter.death_reason, letter.failure_reason, letter.attempt_count) == (
        "delivery_limit",
        "DELIVERY_LIMIT",
        5,
    )


def test_last_death_headers_of_rabbitmq_4_fill_in_without_x_death() -> None:
    letter = parse(
        headers={
            "x-last-death-queue": "payments",
            "x-last-death-reason": "maxlen",
            "x-last-death-exchange": "billing",
            "x-first-death-queue": "payments.delay",
            "x-first-death-reason": "expired",
            "x-first-death-exchange": "billing.delay",
        }
    )

    assert (letter.original_queue, letter.original_exchange, letter.death_reason) == ("payments", "billing", "maxlen")
    assert letter.failure_reason == "MAXLEN"
    assert letter.parse_errors == ["no x-death header"]


def test_first_death_headers_name_the_origin_when_nothing_else_does() -> None:
    letter = parse(
        headers={
            "x-first-death-queue": "emails",
            "x-first-death-reason": "rejected",
            "x-first-death-exchange": "mail",
        }
    )

    assert (letter.original_queue, letter.original_exchange, letter.death_reason) == ("emails", "mail", "rejected")


def test_spring_republished_message_keeps_its_original_exchange_and_routing_key() -> None:
    letter = parse(
        headers={
            "x-original-exchange": "shop",
            "x-original-routingKey": "orders.paid",
            "x-exception-message": "Listener threw exception",
            "x-exception-stacktrace": "org.springframework.amqp.AmqpRejectAndDontRequeueException: boom",
        }
    )

    assert (letter.original_exchange, letter.original_routing_keys) == ("shop", ["orders.paid"])
    assert letter.stack_trace.startswith("org.springframework")


def test_celery_protocol_2_headers_give_task_name_id_retries_and_host() -> None:
    letter = parse(
        body=b'[[42], {}, {"callbacks": null, "errbacks": null, "chain": null, "chord": null}]',
        content_encoding="utf-8",
        headers={
            "lang": "py",
            "task": "shop.tasks.charge_card",
            "id": "5b1d3c1e-8f7a-4c8e-9d7e-1f2a3b4c5d6e",
            "shadow": None,
            "eta": None,
            "expires": None,
            "group": None,
            "group_index": None,
            "retries": 3,
            "timelimit": [None, None],
            "root_id": "5b1d3c1e-8f7a-4c8e-9d7e-1f2a3b4c5d6e",
            "parent_id": None,
            "argsrepr": "(42,)",
            "kwargsrepr": "{}",
            "origin": "gen4242@worker-7.example.com",
            "ignore_result": False,
            "x-death": [death("celery", "rejected", 1, 1, exchange="", routing_keys=["celery"])],
        },
    )

    assert (letter.task_name, letter.task_id, letter.task_retries) == (
        "shop.tasks.charge_card",
        "5b1d3c1e-8f7a-4c8e-9d7e-1f2a3b4c5d6e",
        3,
    )
    assert letter.attempt_count == 4
    assert letter.host == "worker-7.example.com"
    assert letter.headers["argsrepr"] == "(42,)"
    assert letter.parse_errors == []


@override_settings(
    DLQ_ERROR_TYPE_HEADERS=["X-My-Error-Class"],
    DLQ_ERROR_MESSAGE_HEADERS=["x-my-error", "x-exception-message"],
    DLQ_HOST_HEADERS=["x-node"],
    DLQ_VERSION_HEADERS=["x-build"],
)
def test_error_headers_are_read_as_the_settings_name_them() -> None:
    letter = parse(
        headers={
            "x-death": [death("orders", "rejected", 1, 1)],
            "x-exception-message": "the less preferred header",
            "x-my-error": "Card declined for order 7",
            "x-my-error-class": "billing.CardDeclined",
            "x-node": "node-3",
            "x-build": "2026.11.3",
        }
    )

    assert (letter.error_type, letter.error_message) == ("billing.CardDeclined", "Card declined for order 7")
    assert (letter.host, letter.app_version) == ("node-3", "2026.11.3")


def test_an_empty_preferred_header_does_not_hide_a_later_one() -> None:
    letter = parse(headers={"x-exception-message": "", "error": "Connection refused"})

    assert letter.error_message == "Connection refused"


def test_python_style_message_carries_its_error_type() -> None:
    letter = parse(headers={"x-error": "requests.exceptions.ConnectTimeout: timed out after 30s"})

    assert (letter.error_type, letter.error_message) == ("requests.exceptions.ConnectTimeout", "timed out after 30s")
    assert (letter.failure_reason, letter.transient) == ("TIMEOUT", True)


def test_validation_failures_are_permanent() -> None:
    letter = parse(headers={"x-exception-type": "ValidationError", "x-exception-message": "amount must be positive"})

    assert (letter.failure_reason, letter.transient) == ("VALIDATION_FAILED", False)


def test_redelivery_from_a_quorum_dlq_keeps_the_dedupe_key_but_a_new_death_changes_it() -> None:
    history = [death("orders", "rejected", 1, 1)]
    first = parse(message_id="m-1", headers={"x-death": history})
    redelivered = parse(message_id="m-1", headers={"x-death": history, "x-delivery-count": 2})
    died_again = parse(message_id="m-1", headers={"x-death": [death("orders", "rejected", 2, 0)]})

    assert first.dedupe_key == redelivered.dedupe_key
    assert died_again.dedupe_key != first.dedupe_key


def test_replay_headers_are_read() -> None:
    letter = parse(headers={"dlq-replay-count": 2, "dlq-replayed-from": 4711})

    assert (letter.replay_count, letter.replayed_from) == (2, 4711)


def test_headers_with_odd_names_and_values_are_stored_losslessly() -> None:
    table = {
        b"\xff\xfename": "value",
        "nul\x00key": "x",
        "text": "a\x00b",
        "raw": b"\x00\x01\xfe",
        "when": dt.datetime(2026, 1, 2, tzinfo=dt.UTC),
        "beyond": jsonsafe.RawTimestamp(2**63),
        "price": Decimal("12.50"),
        "$bytes": "looks like a tag",
    }

    encoded = jsonsafe.encode(table)

    assert jsonsafe.decode(encoded) == table
    assert "\\u0000" not in json.dumps(encoded)


def test_tables_nested_too_deeply_are_kept_as_text_and_reported() -> None:
    nested: dict[str, Any] = {"leaf": 1}
    for _ in range(100):
        nested = {"child": nested}
    problems: list[str] = []

    encoded = jsonsafe.encode(nested, problems=problems)

    assert problems == ["a header table is nested deeper than 64 levels; the deeper part is stored as text"]
    depth = 0
    while isinstance(encoded, dict) and "child" in encoded:
        encoded, depth = encoded["child"], depth + 1
    assert depth == 64
    assert "leaf" in jsonsafe.decode(encoded)


def amqp_table(*entries: tuple[bytes, bytes]) -> bytes:
    payload = b"".join(struct.pack("B", len(key)) + key + value for key, value in entries)
    return struct.pack(">I", len(payload)) + payload


def test_tolerant_decoder_keeps_what_pika_cannot_decode() -> None:
    encoded = amqp_table(
        (b"beyond", b"T" + struct.pack(">Q", 2**63)),
        (b"double", b"d" + struct.pack(">d", 1.5)),
        (b"float", b"f" + struct.pack(">f", 2.5)),
        (b"\xff\xfe", b"S" + struct.pack(">I", 2) + b"ok"),
        (b"when", b"T" + struct.pack(">Q", 1_763_640_000)),
        (b"list", b"A" + struct.pack(">I", 10) + b"I" + struct.pack(">i", 7) + b"V" + b"t\x01" + b"b\xff"),
        (b"odd", b"Z\x00\x00"),
        (b"after", b"S" + struct.pack(">I", 1) + b"x"),
    )

    table, offset = decode_table(encoded, 0)

    assert offset == len(encoded)
    assert table["beyond"] == 2**63 and isinstance(table["beyond"], jsonsafe.RawTimestamp)
    assert (table["double"], table["float"]) == (1.5, 2.5)
    assert table[b"\xff\xfe"] == "ok"
    assert table["when"] == dt.datetime.fromtimestamp(1_763_640_000, dt.UTC)
    assert table["list"] == [7, None, True, -1]
    # An unknown field type has no known length: the rest of the table is kept as raw bytes.
    (rest,) = [value for key, value in table.items() if str(key).startswith("x-dlqconsole-undecodable-")]
    assert isinstance(rest, jsonsafe.UndecodableField)
    assert rest.startswith(b"\x03oddZ") and rest.endswith(b"x")


def test_properties_pika_cannot_decode_are_kept_raw_and_reported() -> None:
    install_tolerant_decoding()
    flags = struct.pack(">H", pika.spec.BasicProperties.FLAG_HEADERS | pika.spec.BasicProperties.FLAG_MESSAGE_ID)
    # A header table that claims more bytes than the frame holds, followed by a message id.
    frame = flags + struct.pack(">I", 500) + b"\x01a"

    properties = pika.spec.BasicProperties().decode(frame)
    letter = parse_envelope(source_queue="q.dlq", body=b"kept", properties=properties, now=NOW)

    assert bytes(letter.body) == b"kept"
    assert letter.headers[UNDECODABLE_HEADER] == {"$bytes": base64.b64encode(frame).decode()}
    assert any("could not be decoded" in problem for problem in letter.parse_errors)
