from __future__ import annotations

from dlqconsole.core.bidi import isolate


def test_text_with_direction_controls_is_isolated_and_plain_text_is_left_alone() -> None:
    assert isolate("invoice \u202eexe.txt") == "\u2068invoice \u202eexe.txt\u2069"
    assert isolate("\u2066left") == "\u2068\u2066left\u2069"
    assert isolate("orders.dlq") == "orders.dlq"
    assert isolate("שגיאה בתור") == "שגיאה בתור"  # right-to-left text needs no isolate of its own
