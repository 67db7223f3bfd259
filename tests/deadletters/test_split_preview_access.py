"""The split preview runs an expression over up to 10,000 dead letters of a pattern (bounded to 10 s): only those
who may split (operators) get it, and only from a form they sent (a CSRF-checked POST). An address, which a link on
another site can make a signed-in operator's browser open, runs nothing."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from dlqconsole.deadletters.models import FailurePattern
from tests.conftest import client_for
from tests.factories import EnvelopeFactory, store

pytestmark = [pytest.mark.django_db]

FORM = {"name": "ones", "regex": "user 1 ", "header": "", "action": "preview"}


def two_users_pattern() -> FailurePattern:
    store(EnvelopeFactory.build(error="user 1 not found"), EnvelopeFactory.build(error="user 2 not found"))
    return FailurePattern.objects.get()


def test_an_operator_posting_the_form_gets_the_page_with_the_preview(operator: User) -> None:
    pattern = two_users_pattern()

    response = client_for(operator).post(f"/patterns/{pattern.pk}/split/", FORM)

    assert response.status_code == 200
    assert response.context["split"]["preview"].matching == 1
    page = response.content.decode()
    assert "<h1>Pattern #" in page and 'data-testid="split-preview"' in page
    assert 'value="user 1 "' in page  # the form keeps what was typed


def test_an_htmx_preview_answers_with_the_split_card_only(operator: User) -> None:
    pattern = two_users_pattern()

    response = client_for(operator).post(f"/patterns/{pattern.pk}/split/", FORM, headers={"HX-Request": "true"})

    fragment = response.content.decode()
    assert response.status_code == 200
    assert fragment.lstrip().startswith('<section class="card" id="split">')
    assert "<h1>" not in fragment
    assert "The rule takes 1</strong>" in fragment and 'value="split"' in fragment


def test_the_preview_form_posts_to_the_split_address_with_and_without_htmx(operator: User) -> None:
    pattern = two_users_pattern()

    page = client_for(operator).get(f"/patterns/{pattern.pk}/").content.decode()

    card = page[page.index('id="split"') :].split("</section>", 1)[0]
    assert f'method="post" action="/patterns/{pattern.pk}/split/#split"' in card
    assert f'hx-post="/patterns/{pattern.pk}/split/"' in card
    assert 'name="csrfmiddlewaretoken"' in card


@pytest.mark.parametrize("role", ["viewer", "operator"])
def test_an_address_runs_no_preview(role: str, viewer: User, operator: User) -> None:
    pattern = two_users_pattern()
    user = viewer if role == "viewer" else operator

    response = client_for(user).get(f"/patterns/{pattern.pk}/", {**FORM, "previewed": "1"})

    assert response.status_code == 200
    assert response.context["split"]["preview"] is None
    assert 'data-testid="split-preview"' not in response.content.decode()


def test_a_get_of_the_split_address_is_refused(operator: User) -> None:
    pattern = two_users_pattern()

    response = client_for(operator).get(f"/patterns/{pattern.pk}/split/", FORM)

    assert response.status_code == 405


def test_a_preview_posted_without_the_csrf_token_is_refused(operator: User) -> None:
    pattern = two_users_pattern()

    response = client_for(operator, enforce_csrf_checks=True).post(f"/patterns/{pattern.pk}/split/", FORM)

    assert response.status_code == 403
    assert "split" not in (response.context or {})


def test_a_viewer_gets_no_preview(viewer: User) -> None:
    pattern = two_users_pattern()

    response = client_for(viewer).post(f"/patterns/{pattern.pk}/split/", FORM)

    assert response.status_code == 403
    assert 'data-testid="split-preview"' not in response.content.decode()
