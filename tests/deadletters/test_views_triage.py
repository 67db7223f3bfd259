"""Triage from the pages: status changes, owner and note, merge and split, each checked for the role."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.utils.html import escape

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.deadletters.models import DeadLetter, DeadLetterCount, FailurePattern, PatternEvent, PatternStatus
from tests.conftest import client_for
from tests.factories import many

pytestmark = [pytest.mark.django_db]

HX = {"HX-Request": "true"}


def test_viewer_cannot_change_triage(viewer: User) -> None:
    (stored,) = many(1)
    pattern = FailurePattern.objects.get(pk=stored.pattern_id)
    client = client_for(viewer)

    responses = [
        client.post(f"/patterns/{pattern.pk}/status/", {"status": "resolved"}),
        client.post(f"/patterns/{pattern.pk}/assign/", {"take": "1", "note": "mine"}),
        client.post("/patterns/merge/", {"target": pattern.pk, "sources": [pattern.pk]}),
        client.post(f"/patterns/{pattern.pk}/split/", {"name": "x", "regex": "timed", "action": "split"}),
    ]

    assert [response.status_code for response in responses] == [403, 403, 403, 403]
    pattern.refresh_from_db()
    assert (pattern.status, pattern.owner_id, pattern.note) == (PatternStatus.OPEN, None, "")
    assert not PatternEvent.objects.filter(kind__in=["status", "note", "split"]).exists()


def test_operator_acknowledges_from_the_table_and_gets_the_row_back(operator: User) -> None:
    (stored,) = many(1)
    pattern = FailurePattern.objects.get(pk=stored.pattern_id)

    response = client_for(operator).post(
        f"/patterns/{pattern.pk}/status/",
        {"status": "acknowledged", "fragment": "row", "next": "/patterns/"},
        headers=HX,
    )

    html = response.content.decode()
    assert response.status_code == 200
    assert html.strip().startswith(f'<tr id="pattern-{pattern.pk}">')
    assert "Acknowledged" in html
    pattern.refresh_from_db()
    assert pattern.status == PatternStatus.ACKNOWLEDGED
    assert PatternEvent.objects.filter(pattern=pattern, kind="status", to_status="acknowledged").exists()
    assert AuditEntry.objects.filter(action="pattern.status", actor=operator).exists()


def test_sorting_by_total_or_first_seen_shows_that_column_on_a_laptop_and_a_row_sent_back_keeps_it(
    operator: User,
) -> None:
    (stored,) = many(1)
    client = client_for(operator)

    by_waiting = client.get("/patterns/").content.decode()
    by_total = client.get("/patterns/?sort=total").content.decode()
    row = client.post(
        f"/patterns/{stored.pattern_id}/status/",
        {"status": "acknowledged", "fragment": "row", "next": "/patterns/?sort=total"},
        headers=HX,
    ).content.decode()

    assert '<th class="num hide-sm hide-md">Total</th>' in by_waiting
    assert '<th class="num hide-sm">Total</th>' in by_total
    assert '<td class="num hide-sm muted small">' in row and '<td class="num hide-sm hide-md' not in row
    assert '<th class="hide-sm">First seen</th>' in client.get("/patterns/?sort=oldest").content.decode()


def test_status_change_without_javascript_redirects_back(operator: User) -> None:
    (stored,) = many(1)

    response = client_for(operator).post(
        f"/patterns/{stored.pattern_id}/status/", {"status": "ignored", "next": "/patterns/?status=active"}
    )

    assert response.status_code == 302 and response["Location"] == "/patterns/?status=active"
    assert FailurePattern.objects.get(pk=stored.pattern_id).status == PatternStatus.IGNORED


@pytest.mark.parametrize("elsewhere", ["//evil.example/", "/\\evil.example/", "https://evil.example/"])
def test_status_change_refuses_a_redirect_elsewhere(operator: User, elsewhere: str) -> None:
    (stored,) = many(1)

    response = client_for(operator).post(
        f"/patterns/{stored.pattern_id}/status/", {"status": "resolved", "next": elsewhere}
    )

    assert response["Location"] == f"/patterns/{stored.pattern_id}/"


def test_unknown_status_is_explained(operator: User) -> None:
    (stored,) = many(1)

    response = client_for(operator).post(
        f"/patterns/{stored.pattern_id}/status/", {"status": "deleted", "fragment": "row"}, headers=HX
    )

    # The row stays as it was, and the reason arrives with it for the page's flash list (htmx swaps it).
    body = response.content.decode()
    assert response.status_code == 200
    assert f'id="pattern-{stored.pattern_id}"' in body
    assert '<div id="flash" hx-swap-oob="true">' in body and "not a pattern status" in body


def test_operator_takes_a_pattern_and_writes_a_note(operator: User) -> None:
    (stored,) = many(1)

    response = client_for(operator).post(
        f"/patterns/{stored.pattern_id}/assign/", {"take": "1", "note": "<b>inventory</b> is down"}, headers=HX
    )

    html = response.content.decode()
    assert response.status_code == 200 and html.strip().startswith('<section id="pattern-summary"')
    assert "&lt;b&gt;inventory&lt;/b&gt; is down" in html
    pattern = FailurePattern.objects.get(pk=stored.pattern_id)
    assert (pattern.owner_id, pattern.note) == (operator.pk, "<b>inventory</b> is down")
    # The history beside the card follows, out of band, with the change as its newest line.
    history = html[html.index('id="pattern-history"') :]
    assert 'hx-swap-oob="true"' in history[:80] and "Note / owner changed" in history
    assert f"Pattern #{stored.pattern_id} saved." in html  # the flash, out of band too


def test_operator_gives_a_pattern_to_another_operator_but_not_to_a_viewer(
    operator: User, admin_user: User, viewer: User
) -> None:
    (stored,) = many(1)
    client = client_for(operator)
    page = client.get(f"/patterns/{stored.pattern_id}/").content.decode()

    given = client.post(f"/patterns/{stored.pattern_id}/assign/", {"owner": str(admin_user.pk), "note": "db team"})
    owner_after_give = FailurePattern.objects.get(pk=stored.pattern_id).owner_id
    refused = client.post(f"/patterns/{stored.pattern_id}/assign/", {"owner": str(viewer.pk), "note": "db team"})
    refused_page = client.get(refused["Location"]).content.decode()
    cleared = client.post(f"/patterns/{stored.pattern_id}/assign/", {"owner": "", "note": ""}, headers=HX)

    owners = page[page.index('id="p-owner"') : page.index("</select>", page.index('id="p-owner"'))]
    assert f'value="{admin_user.pk}"' in owners and f'value="{operator.pk}"' in owners
    assert f'value="{viewer.pk}"' not in owners
    assert given.status_code == 302 and owner_after_give == admin_user.pk
    assert "cannot own a pattern" in refused_page
    assert cleared.status_code == 200
    pattern = FailurePattern.objects.get(pk=stored.pattern_id)
    assert (pattern.owner_id, pattern.note) == (None, "")
    assert AuditEntry.objects.filter(action="pattern.assign", actor=operator).count() == 2


def test_operator_merges_patterns_after_a_preview_and_the_counters_follow(operator: User) -> None:
    timeouts = many(3)
    declines = many(2, error="card declined", error_type="CardError")
    target = FailurePattern.objects.get(pk=timeouts[0].pattern_id)
    source = FailurePattern.objects.get(pk=declines[0].pattern_id)
    client = client_for(operator)
    form = {"target": target.pk, "sources": [source.pk, target.pk], "next": "/patterns/"}

    preview = client.post("/patterns/merge/", form)
    unchanged = FailurePattern.objects.get(pk=source.pk).merged_into_id
    response = client.post("/patterns/merge/", {**form, "action": "merge"})

    page = preview.content.decode()
    assert preview.status_code == 200 and unchanged is None
    assert "card declined" in page and 'data-testid="merge-warnings"' in page
    assert f"#{source.pk} has error type CardError" in page
    assert response.status_code == 302 and response["Location"] == f"/patterns/{target.pk}/"
    assert f"Merged 1 pattern (2 dead letters) into #{target.pk}." in client.get(response["Location"]).content.decode()
    source.refresh_from_db()
    assert source.merged_into_id == target.pk
    assert DeadLetter.objects.filter(pattern=target).count() == 5
    assert sum(DeadLetterCount.objects.filter(pattern=target).values_list("count", flat=True)) == 5
    listed = client.get("/patterns/").content.decode()
    assert f'id="pattern-{source.pk}"' not in listed and f'id="pattern-{target.pk}"' in listed
    assert AuditEntry.objects.get(action="pattern.merge").count == 2


def test_without_a_chosen_target_the_busiest_ticked_pattern_is_the_target(operator: User) -> None:
    small = FailurePattern.objects.get(pk=many(1, error="user alice not found", error_type="LookupError")[0].pattern_id)
    busy = FailurePattern.objects.get(pk=many(3, error="card declined", error_type="CardError")[0].pattern_id)
    client = client_for(operator)

    page = client.post("/patterns/merge/", {"target": "", "sources": [small.pk, busy.pk]}).content.decode()

    assert f'name="target" value="{busy.pk}" checked' in page
    assert f"Merge into #{busy.pk}" in page
    listing = client.get("/patterns/").content.decode()
    assert '<option value="">the ticked one with the most dead letters</option>' in listing


def test_the_preview_is_made_again_for_another_target_before_anything_merges(operator: User) -> None:
    first = FailurePattern.objects.get(pk=many(2, error="user alice not found", error_type="LookupError")[0].pattern_id)
    second = FailurePattern.objects.get(pk=many(1, error="card declined", error_type="CardError")[0].pattern_id)
    client = client_for(operator)
    both = [first.pk, second.pk]

    again = client.post("/patterns/merge/", {"target": second.pk, "sources": both, "action": "preview"})

    page = again.content.decode()
    assert again.status_code == 200 and f"Merge into #{second.pk}" in page
    assert "(2 in all)" in page  # first's two dead letters would move
    assert FailurePattern.objects.get(pk=first.pk).merged_into_id is None


def test_merge_preview_lets_the_operator_choose_another_target_and_reads_typed_numbers(operator: User) -> None:
    first = FailurePattern.objects.get(pk=many(1, error="disk full on <b>db-1</b>")[0].pattern_id)
    second = FailurePattern.objects.get(pk=many(2, error="no space left on device")[0].pattern_id)
    client = client_for(operator)

    preview = client.post("/patterns/merge/", {"target": first.pk, "sources": [f"#{second.pk}, "]})
    merged = client.post("/patterns/merge/", {"target": second.pk, "sources": [first.pk, second.pk], "action": "merge"})
    unknown = client.post("/patterns/merge/", {"target": second.pk, "sources": ["999999"]})

    page = preview.content.decode()
    assert "disk full on &lt;b&gt;" in page and "<b>" not in page  # the full template, escaped
    assert 'data-testid="merge-warnings"' not in page
    assert merged["Location"] == f"/patterns/{second.pk}/"
    first.refresh_from_db()
    assert first.merged_into_id == second.pk
    assert "No pattern #999999" in client.get(unknown["Location"]).content.decode()


def test_pattern_page_offers_similar_patterns_to_merge(operator: User, viewer: User) -> None:
    target = FailurePattern.objects.get(pk=many(1, error="card declined", error_type="CardError")[0].pattern_id)
    similar = FailurePattern.objects.get(pk=many(1, error="issuer unavailable", error_type="CardError")[0].pattern_id)
    other = FailurePattern.objects.get(pk=many(1, error="disk full")[0].pattern_id)

    page = client_for(operator).get(f"/patterns/{target.pk}/").content.decode()
    seen_by_viewer = client_for(viewer).get(f"/patterns/{target.pk}/").content.decode()

    section = page[page.index('id="merge"') :]
    assert f'value="{similar.pk}"' in section and "issuer unavailable" in section
    assert f'value="{other.pk}"' not in section
    assert 'id="merge"' not in seen_by_viewer


def test_merge_without_a_source_is_explained(operator: User) -> None:
    (stored,) = many(1)

    client = client_for(operator)
    response = client.post("/patterns/merge/", {"target": stored.pattern_id, "sources": [stored.pattern_id]})

    assert response.status_code == 302
    assert "Tick at least one pattern" in client.get(response["Location"]).content.decode()


@pytest.mark.parametrize(
    ("form", "said"),
    [
        ({"sources": ["abc"]}, "“abc” is not a pattern number; nothing was merged."),
        ({"sources": ["12, 9999999999999999999999"]}, "“9999999999999999999999” is not a pattern number"),
        ({"sources": ["12"], "target": "-1"}, "“-1” is not a pattern number"),
        ({"sources": ["12"], "target": "3 4"}, "Merge into one pattern: type a single pattern number as the target."),
        ({"sources": [""]}, "Choose the patterns to merge (pattern numbers) and the one to merge them into."),
    ],
)
def test_a_merge_typed_wrong_says_what_is_wrong(operator: User, form: dict[str, object], said: str) -> None:
    many(1)
    client = client_for(operator)

    response = client.post("/patterns/merge/", form)

    assert response.status_code == 302
    assert escape(said) in client.get(response["Location"]).content.decode()


def test_operator_previews_then_splits_a_pattern(operator: User) -> None:
    many(3, error="Request timed out after 3000ms")
    letters = many(2, error="Request timed out after 1500ms")
    pattern_id = letters[0].pattern_id
    client = client_for(operator)
    form = {"name": "Short timeouts", "regex": r"after 1500ms"}

    page = client.post(f"/patterns/{pattern_id}/split/", {**form, "action": "preview"}).content.decode()
    split = client.post(f"/patterns/{pattern_id}/split/", {**form, "action": "split"})

    preview_box = page[page.index('data-testid="split-preview"') :].split("</div>", 1)[0]
    assert "The rule takes 2</strong> of the 5 dead letters of this pattern" in preview_box
    assert preview_box.count('href="/messages/') == 2 and "after 1500ms" in preview_box
    assert 'value="split"' in page
    part = FailurePattern.objects.get(template="Short timeouts")
    assert split["Location"] == f"/patterns/{part.pk}/"
    assert DeadLetter.objects.filter(pattern=part).count() == 2


def test_split_preview_that_takes_every_dead_letter_offers_no_split(operator: User) -> None:
    letters = many(2, error="Request timed out after 3000ms")
    client = client_for(operator)

    page = client.post(
        f"/patterns/{letters[0].pattern_id}/split/", {"name": "All", "regex": "timed out", "action": "preview"}
    ).content.decode()

    assert "all of them, so there is nothing to split off" in page and 'value="split"' not in page


def test_split_preview_that_matches_nothing_offers_no_split_and_keeps_the_form(operator: User) -> None:
    letters = many(2, error="Request timed out after 3000ms")
    client = client_for(operator)
    form = {"name": "Short timeouts", "regex": r"after 1500ms"}

    page = client.post(f"/patterns/{letters[0].pattern_id}/split/", {**form, "action": "preview"}).content.decode()
    after = client.post(f"/patterns/{letters[0].pattern_id}/split/", {**form, "action": "split"}).content.decode()

    assert "The rule matches none</strong> of the 2 dead letters of this pattern" in page
    assert 'value="split"' not in page
    assert "nothing was split" in after and 'value="after 1500ms"' in after
    assert not FailurePattern.objects.filter(template="Short timeouts").exists()


@pytest.mark.parametrize("action", ["preview", "split"])
def test_a_problem_with_the_typed_rule_shows_in_the_split_card(operator: User, action: str) -> None:
    # The form posts to an address ending in #split, so the answer scrolls to the card: a problem printed at the
    # top of the page was out of sight.
    letters = many(2, error="Request timed out after 3000ms")
    client = client_for(operator)

    form = {"name": "Broken", "regex": "([", "action": action}
    page = client.post(f"/patterns/{letters[0].pattern_id}/split/", form).content.decode()

    card = page[page.index('id="split"') :].split("</section>", 1)[0]
    assert 'split/#split"' in page
    assert 'class="error-box" role="alert"' in card and "expression" in card.lower()
    assert 'value="(["' in card
    assert FailurePattern.objects.count() == 1


def test_an_owner_in_other_digits_is_refused_not_a_server_error(operator: User) -> None:
    # '²' passes str.isdigit() but int() refuses it; '١' (Arabic-Indic one) would name user #1.
    (stored,) = many(1)
    client = client_for(operator)

    responses = [
        client.post(f"/patterns/{stored.pattern_id}/assign/", {"owner": owner, "note": ""}) for owner in ("²", "١")
    ]

    assert [response.status_code for response in responses] == [302, 302]
    assert escape("“²” is not a user's number") in client.get(responses[0]["Location"]).content.decode()
    assert FailurePattern.objects.get(pk=stored.pattern_id).owner_id is None


@pytest.mark.parametrize(
    "form", [{"name": "Short\x00timeouts", "regex": "1500ms"}, {"name": "Short", "regex": "1500\x00"}]
)
def test_a_split_with_a_nul_character_is_refused_not_a_server_error(operator: User, form: dict[str, str]) -> None:
    # PostgreSQL text cannot hold a NUL: the name check and the rule's insert both failed with a 500.
    many(3, error="Request timed out after 3000ms")
    letters = many(2, error="Request timed out after 1500ms")
    client = client_for(operator)

    responses = [
        client.post(f"/patterns/{letters[0].pattern_id}/split/", {**form, "action": action})
        for action in ("preview", "split")
    ]

    assert [response.status_code for response in responses] == [200, 200]
    assert all("NUL character" in response.content.decode() for response in responses)
    assert FailurePattern.objects.count() == 1


def test_a_merged_away_pattern_page_is_read_only_and_points_to_the_target(operator: User) -> None:
    source = FailurePattern.objects.get(pk=many(1, error="disk full")[0].pattern_id)
    target = FailurePattern.objects.get(pk=many(1, error="no space left on device")[0].pattern_id)
    client = client_for(operator)
    client.post("/patterns/merge/", {"target": target.pk, "sources": [source.pk], "action": "merge"})

    page = client.get(f"/patterns/{source.pk}/").content.decode()

    assert 'data-testid="merged-banner"' in page and f'href="/patterns/{target.pk}/"' in page
    for control in ("kind=retry", "kind=purge", "/status/", "/assign/", 'id="split"', 'id="merge"'):
        assert control not in page


def test_messages_of_a_merged_away_pattern_point_to_where_they_went(operator: User) -> None:
    source = FailurePattern.objects.get(pk=many(2, error="disk full")[0].pattern_id)
    target = FailurePattern.objects.get(pk=many(1, error="no space left on device")[0].pattern_id)
    client = client_for(operator)
    client.post("/patterns/merge/", {"target": target.pk, "sources": [source.pk], "action": "merge"})

    page = client.get(f"/messages/?pattern={source.pk}&reason=INTERNAL&before=999").content.decode()
    plain = client.get(f"/messages/?pattern={target.pk}").content.decode()

    assert f"Pattern #{source.pk} was merged into" in page
    assert f'href="?pattern={target.pk}&amp;reason=INTERNAL"' in page
    assert "was merged into" not in plain


def test_a_chain_of_merges_is_followed_to_its_end_whatever_way_the_number_is_written(operator: User) -> None:
    first = FailurePattern.objects.get(pk=many(1, error="disk full")[0].pattern_id)
    second = FailurePattern.objects.get(pk=many(1, error="no space left on device")[0].pattern_id)
    last = FailurePattern.objects.get(pk=many(1, error="quota exceeded on volume")[0].pattern_id)
    client = client_for(operator)
    client.post("/patterns/merge/", {"target": second.pk, "sources": [first.pk], "action": "merge"})
    client.post("/patterns/merge/", {"target": last.pk, "sources": [second.pk], "action": "merge"})

    page = client.get(f"/messages/?pattern=0{first.pk}").content.decode()

    assert f'Pattern #{first.pk} was merged into <a href="/patterns/{last.pk}/">#{last.pk}</a>' in page
    assert f'href="?pattern={last.pk}"' in page


def test_merge_after_choosing_another_target_on_the_preview_previews_that_target_first(operator: User) -> None:
    # The preview's Merge button names the previewed target and its warnings are for it: a target chosen on the
    # page after the preview is previewed first, never merged into unseen.
    first = FailurePattern.objects.get(pk=many(2, error="user alice not found", error_type="LookupError")[0].pattern_id)
    second = FailurePattern.objects.get(pk=many(1, error="card declined", error_type="CardError")[0].pattern_id)
    client = client_for(operator)
    both = [first.pk, second.pk]
    preview = client.post("/patterns/merge/", {"target": first.pk, "sources": both}).content.decode()
    assert f'name="previewed" value="{first.pk}"' in preview

    response = client.post(
        "/patterns/merge/", {"target": second.pk, "sources": both, "previewed": first.pk, "action": "merge"}
    )

    page = response.content.decode()
    assert response.status_code == 200 and f"Merge into #{second.pk}" in page
    assert f'name="previewed" value="{second.pk}"' in page
    assert FailurePattern.objects.get(pk=first.pk).merged_into_id is None
    assert FailurePattern.objects.get(pk=second.pk).merged_into_id is None
