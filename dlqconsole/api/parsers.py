"""The one body the API takes: JSON. DRF's parser turns malformed JSON into a 400 but lets the RecursionError of
JSON nested deeper than the interpreter recurses (a body of a few kilobytes of `[`) through as a server error;
here that is malformed JSON too."""

from __future__ import annotations

from typing import Any

from rest_framework import parsers
from rest_framework.exceptions import ParseError


class JSONParser(parsers.JSONParser):
    def parse(self, stream: Any, media_type: str | None = None, parser_context: dict[str, Any] | None = None) -> Any:
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - nested too deeply.") from None
