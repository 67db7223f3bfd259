"""The triage posts are read by forms: a bad value (an owner who may not own, a missing field, a number that is
not one, an unknown action) is answered with the form's error, never a server error or a silent default."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.utils.html import escape

from dlqconsole.deadletters.models import FailurePattern, PatternStatus
from dlqconsole.deadletters.services import assign_pattern
from tests.conftest import client_for
from tests.factories import many

pytestmark = [pytest.mark.django_db]

HX = {"HX-Request": "true"}


def flash_after(client: object, response: object) -> str:
    """The page a refused post redirects to, where its error is shown."""
    return client.get(response["Location"]).content.decode()  # type: ignore[attr-defined,index]


def owned_pattern(owner: User) -> FailurePattern:
    (stored,) = many(1)
    pattern = FailurePattern.objects.get(pk=stored.pattern_id)
    return assign_pattern(pattern=pattern, owner=owner, note="db team", actor=owner)


def test_an_owner_who_may_not_own_is_refused_and_htmx_gets_the_card_back(operator: User, viewer: User) -> None:
    pattern = owned_pattern(operator)

    response = client_for(operator).post(
        f"/patterns/{pattern.pk}/assign/", {"owner": str(viewer.pk), "note": "handed over"}, headers=HX
    )

    html = response.content.decode()
    assert response.status_code == 200 and html.strip().startswith('<section id="pattern-summary"')
    assert "may only read (viewer) and cannot own a pattern" in html  # the flash, out of band
    pattern.refresh_from_db()
    assert (pattern.owner_id, pattern.note) == (operator.pk, "db team")


def test_an_inactive_owner_is_refused(operator: User, admin_user: User) -> None:
    pattern = owned_pattern(operator)
    admin_user.is_active = False
    admin_user.save()
    client = client_for(operator)

    response = client.post(f"/patterns/{pattern.pk}/assign/", {"owner": str(admin_user.pk), "note": ""})

    assert response.status_code == 302
    assert "is not an active user and cannot own a pattern" in flash_after(client, response)
    pattern.refresh_from_db()
    assert (pattern.owner_id, pattern.note) == (operator.pk, "db team")


@pytest.mark.parametrize("owner", ["abc", "-3", "1.5", "²"])
def test_an_owner_that_is_not_a_number_is_refused_with_the_reason(operator: User, owner: str) -> None:
    pattern = owned_pattern(operator)
    client = client_for(operator)

    response = client.post(f"/patterns/{pattern.pk}/assign/", {"owner": owner, "note": ""})

    assert response.status_code == 302
    assert escape(f"“{owner}” is not a user's number") in flash_after(client, response)
    pattern.refresh_from_db()
    assert (pattern.owner_id, pattern.note) == (operator.pk, "db team")


def test_an_owner_who_does_not_exist_is_refused(operator: User) -> None:
    pattern = owned_pattern(operator)
    client = client_for(operator)

    response = client.post(f"/patterns/{pattern.pk}/assign/", {"owner": "999999", "note": ""})

    assert "That user does not exist." in flash_after(client, response)
    pattern.refresh_from_db()
    assert pattern.owner_id == operator.pk


def test_an_assignment_without_an_owner_is_refused_instead_of_clearing_the_owner(operator: User) -> None:
    pattern = owned_pattern(operator)
    client = client_for(operator)

    response = client.post(f"/patterns/{pattern.pk}/assign/", {"note": "only a note"})

    assert response.status_code == 302
    assert "Choose the owner (or nobody)." in flash_after(client, response)
    pattern.refresh_from_db()
    assert (pattern.owner_id, pattern.note) == (operator.pk, "db team")


def test_an_assignment_without_a_note_keeps_the_note(operator: User, admin_user: User) -> None:
    pattern = owned_pattern(operator)

    response = client_for(operator).post(f"/patterns/{pattern.pk}/assign/", {"owner": str(admin_user.pk)})

    assert response.status_code == 302
    pattern.refresh_from_db()
    assert (pattern.owner_id, pattern.note) == (admin_user.pk, "db team")


def test_a_status_change_without_a_status_is_refused_with_the_choices(operator: User) -> None:
    (stored,) = many(1)

    response = client_for(operator).post(f"/patterns/{stored.pattern_id}/status/", {"fragment": "row"}, headers=HX)

    html = response.content.decode()
    assert response.status_code == 200 and f'id="pattern-{stored.pattern_id}"' in html
    assert "Choose a status: open, acknowledged, resolved or ignored." in html
    assert FailurePattern.objects.get(pk=stored.pattern_id).status == PatternStatus.OPEN


def test_a_status_change_for_an_unknown_part_of_the_page_is_refused(operator: User) -> None:
    (stored,) = many(1)
    client = client_for(operator)

    response = client.post(f"/patterns/{stored.pattern_id}/status/", {"status": "resolved", "fragment": "table"})

    assert response.status_code == 302
    assert escape("“table” is not a part of the page: row or summary.") in flash_after(client, response)
    assert FailurePattern.objects.get(pk=stored.pattern_id).status == PatternStatus.OPEN


def test_a_merge_whose_previewed_target_is_not_a_number_is_refused(operator: User) -> None:
    first = FailurePattern.objects.get(pk=many(2, error="user alice not found", error_type="LookupError")[0].pattern_id)
    second = FailurePattern.objects.get(pk=many(1, error="card declined", error_type="CardError")[0].pattern_id)
    client = client_for(operator)

    response = client.post(
        "/patterns/merge/",
        {"target": first.pk, "sources": [first.pk, second.pk], "previewed": "abc", "action": "merge"},
    )

    assert response.status_code == 302
    assert escape("“abc” is not a pattern number; preview the merge again.") in flash_after(client, response)
    assert FailurePattern.objects.filter(merged_into__isnull=False).count() == 0


def test_a_merge_with_an_unknown_action_is_refused(operator: User) -> None:
    first = FailurePattern.objects.get(pk=many(2, error="user alice not found", error_type="LookupError")[0].pattern_id)
    second = FailurePattern.objects.get(pk=many(1, error="card declined", error_type="CardError")[0].pattern_id)
    client = client_for(operator)

    response = client.post(
        "/patterns/merge/", {"target": first.pk, "sources": [first.pk, second.pk], "action": "delete"}
    )

    assert response.status_code == 302
    assert escape("“delete” is not something a merge does: preview or merge.") in flash_after(client, response)
    assert FailurePattern.objects.filter(merged_into__isnull=False).count() == 0


def test_a_split_with_an_unknown_action_shows_the_error_in_the_split_card(operator: User) -> None:
    many(3, error="Request timed out after 3000ms")
    letters = many(2, error="Request timed out after 1500ms")
    client = client_for(operator)

    page = client.post(
        f"/patterns/{letters[0].pattern_id}/split/", {"name": "Short", "regex": "1500ms", "action": "merge"}
    ).content.decode()

    card = page[page.index('id="split"') :].split("</section>", 1)[0]
    assert 'class="error-box" role="alert"' in card
    assert escape("“merge” is not something a split does: preview or split.") in card
    assert 'value="1500ms"' in card
    assert FailurePattern.objects.count() == 1


def test_a_split_without_a_name_is_refused_in_the_split_card(operator: User) -> None:
    letters = many(2, error="Request timed out after 1500ms")

    page = (
        client_for(operator)
        .post(f"/patterns/{letters[0].pattern_id}/split/", {"regex": "1500ms", "action": "split"})
        .content.decode()
    )

    card = page[page.index('id="split"') :].split("</section>", 1)[0]
    assert "Give the rule a name; it becomes the template of its pattern." in card
    assert FailurePattern.objects.count() == 1
