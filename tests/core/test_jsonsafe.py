"""Lossless JSON for AMQP tables: decoding is bounded in depth, and reads back everything encode writes."""

from __future__ import annotations

from typing import Any

import pytest

from dlqconsole.core import jsonsafe


def nested(depth: int, *, key: Any) -> dict[Any, Any]:
    table: dict[Any, Any] = {key: "bottom"}
    for _ in range(depth):
        table = {key: table}
    return table


def test_the_deepest_table_encode_writes_decodes_back() -> None:
    # Keys that are not text put every level in the "$map" form, three levels of JSON each.
    table = nested(63, key=b"k")

    assert jsonsafe.decode(jsonsafe.encode(table)) == table


def test_decoding_json_nested_past_the_bound_is_a_clear_error_not_a_recursion_error() -> None:
    deep: Any = 1
    for _ in range(5000):
        deep = [deep]

    with pytest.raises(jsonsafe.TooDeep, match="nested deeper than 400 levels"):
        jsonsafe.decode(deep)
