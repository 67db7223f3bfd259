"""The plan form shows its filter one line per field, however many ids were ticked."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User

from tests.conftest import client_for
from tests.factories import many

pytestmark = pytest.mark.django_db


def test_ticked_ids_are_one_line_cut_short_and_all_sent_back(operator: User) -> None:
    letters = many(25)
    ids = sorted(letter.pk for letter in letters)

    query: dict[str, str | list[str]] = {"kind": "archive", "ids": [str(pk) for pk in ids]}
    html = client_for(operator).get("/operations/plan/", query).content.decode()

    assert html.count("<dt>ids</dt>") == 1
    shown = ", ".join(str(pk) for pk in ids[:20]) + " … and 5 more"
    assert f'<dd class="mono">{shown}</dd>' in html
    # The form still carries every id, not the shortened line.
    assert sorted(int(pk) for pk in re.findall(r'<input type="hidden" name="ids" value="(\d+)">', html)) == ids
