"""The split preview runs an expression typed into the address over up to 10,000 dead letters of a pattern: only
those who may split (operators) get it; a viewer's request runs nothing."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from dlqconsole.deadletters.models import FailurePattern
from tests.conftest import client_for
from tests.deadletters.page_world import ingest, letter

pytestmark = [pytest.mark.django_db]


@pytest.mark.parametrize(("role", "runs"), [("viewer", False), ("operator", True)])
def test_only_operators_get_a_split_preview(role: str, runs: bool, viewer: User, operator: User) -> None:
    ingest(letter(error="user 1 not found"), letter(error="user 2 not found"))
    pattern = FailurePattern.objects.get()
    user = viewer if role == "viewer" else operator

    response = client_for(user).get(
        f"/patterns/{pattern.pk}/", {"previewed": "1", "name": "ones", "regex": "user 1 ", "header": ""}
    )

    assert response.status_code == 200
    preview = response.context["split"]["preview"]
    assert (preview is not None) is runs
    if runs:
        assert preview.matching == 1
