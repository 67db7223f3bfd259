"""Text from a dead letter set inside the console's own sentences, kept from reordering them.

An error message, a queue name or a pattern template may hold Unicode's explicit direction controls: a
right-to-left override (U+202E) turns `orders.exe.txt` into what reads as `txt.exe.sredro`, and everything after
it in the same line, console text included, until the paragraph ends. Inside a sentence the console composes
("Pattern “…”: 3 dead letters parked."), that lets a sender rewrite what the alert says. Wrapped in a first-strong
isolate (U+2068 … U+2069), the text keeps its own direction and every control inside it ends at the closing
isolate, which is what HTML's <bdi> does: the stored text is unchanged, and browsers, Slack and mail clients all
honour the isolate. Text without such controls is returned as it is.
"""

from __future__ import annotations

import re

# Embeddings, overrides, isolates and their terminators (U+202A-U+202E, U+2066-U+2069).
DIRECTION_CONTROLS = re.compile("[\u202a-\u202e\u2066-\u2069]")
FIRST_STRONG_ISOLATE = "\u2068"
POP_DIRECTIONAL_ISOLATE = "\u2069"


def isolate(text: str) -> str:
    """`text` wrapped in a first-strong isolate when it holds direction controls, else `text` itself."""
    if not DIRECTION_CONTROLS.search(text):
        return text
    return f"{FIRST_STRONG_ISOLATE}{text}{POP_DIRECTIONAL_ISOLATE}"
