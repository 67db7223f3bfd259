"""A rule's expression is typed by people; one that backtracks catastrophically used to hold the ingest process
(or the web worker splitting a pattern) for good. Each search is bounded: one that runs out counts as no match."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from dlqconsole.deadletters.models import FingerprintRule
from dlqconsole.deadletters.services import save_fingerprint_rule
from tests.conftest import client_for
from tests.deadletters.conftest import Ingest

pytestmark = [pytest.mark.django_db]

# (a|aa)+$ on 60 a's and a b tries about 10**12 ways before it fails.
CATASTROPHIC = r"(a|aa)+$"
HOSTILE = "a" * 60 + "b"


def test_a_catastrophic_rule_does_not_stall_ingest(ingest: Ingest, admin_user: User) -> None:
    rule = save_fingerprint_rule(rule=FingerprintRule(name="As", regex=CATASTROPHIC), actor=admin_user)

    (hostile, plain) = ingest(HOSTILE, "aaaa")

    rule.refresh_from_db()
    assert hostile.pattern_id != rule.pattern_id
    assert plain.pattern_id == rule.pattern_id  # the rule still works where it can answer


def test_a_catastrophic_split_preview_answers(ingest: Ingest, operator: User) -> None:
    (first, _) = ingest(HOSTILE, "a" * 61 + "c")

    response = client_for(operator).get(
        f"/patterns/{first.pattern_id}/", {"previewed": "1", "name": "As", "regex": CATASTROPHIC}
    )

    assert response.status_code == 200
    assert response.context["split"]["preview"].matching == 0
