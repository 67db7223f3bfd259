"""/api/v1/patterns/: the patterns page's filters, keyset cursors, one pattern with its counts, and triage, merge and
split through the pages' services, with the roles and audit rows of the pages."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.brokers.models import Broker
from dlqconsole.deadletters.models import DeadLetter, DeadLetterCount, FailurePattern, PatternEvent, PatternStatus
from dlqconsole.deadletters.services import assign_pattern, set_pattern_status
from tests.factories import EnvelopeFactory, UserFactory, many, parked, store

pytestmark = pytest.mark.django_db

LIST = "/api/v1/patterns/"
ApiFor = Callable[[User], APIClient]


def pattern_of(letters: list[DeadLetter]) -> FailurePattern:
    return FailurePattern.objects.get(pk=letters[0].pattern_id)


@pytest.fixture
def timeouts() -> FailurePattern:
    return pattern_of(many(3))


@pytest.fixture
def declines() -> FailurePattern:
    return pattern_of(many(2, queue="billing", error="card declined", error_type="CardError"))


def listed(client: APIClient, **query: str) -> list[int]:
    response = client.get(LIST, query)
    assert response.status_code == 200, response.json()
    return [row["id"] for row in response.json()["results"]]


def test_the_list_gives_each_pattern_with_what_waits(
    api_for: ApiFor, viewer: User, timeouts: FailurePattern, declines: FailurePattern
) -> None:
    rows = api_for(viewer).get(LIST).json()["results"]

    assert [row["id"] for row in rows] == [declines.pk, timeouts.pk]
    row = rows[1]
    assert (row["template"], row["error_type"], row["status"]) == (timeouts.template, "TimeoutError", "open")
    assert (row["waiting"], row["total_count"], row["queues"]) == (3, 3, ["orders.dlq"])
    assert row["url"] == f"http://testserver/api/v1/patterns/{timeouts.pk}/"
    assert row["page"] == f"http://testserver/patterns/{timeouts.pk}/"
    assert row["dead_letters"] == f"http://testserver/api/v1/dead-letters/?pattern={timeouts.pk}"
    assert (row["owner"], row["merged_into"], row["is_new"]) == (None, None, True)


def test_the_list_filters_as_the_patterns_page_does(
    api_for: ApiFor, viewer: User, operator: User, timeouts: FailurePattern, declines: FailurePattern
) -> None:
    client = api_for(operator)
    second = Broker.objects.create(name="second", url="amqp://second/")
    letter = EnvelopeFactory.build(queue="stock", error="disk full", error_type="OSError")
    letter.broker_id = second.pk
    elsewhere = pattern_of(store(letter))
    set_pattern_status(pattern=declines, status="resolved", actor=operator)
    assign_pattern(pattern=timeouts, owner=operator, actor=operator)

    assert listed(client, status="resolved") == [declines.pk]
    assert listed(client, status="active") == [elsewhere.pk, timeouts.pk]
    assert listed(client, reason=timeouts.failure_reason) == [timeouts.pk]
    assert listed(client, queue="billing.dlq") == [declines.pk]
    assert listed(client, broker="second") == [elsewhere.pk]
    assert listed(client, q="CARD") == [declines.pk]
    assert listed(client, owner="me") == [timeouts.pk]
    assert listed(client, owner=operator.username) == [timeouts.pk]
    assert listed(client, owner="none") == [elsewhere.pk, declines.pk]
    assert listed(api_for(viewer), owner="me") == []
    assert listed(client, status="", reason="", q="") == [elsewhere.pk, declines.pk, timeouts.pk]


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"status": "gone"}, "status"),
        ({"reason": "NOPE"}, "reason"),
        ({"broker": "nowhere"}, "broker"),
        ({"owner": "nobody-by-that-name"}, "owner"),
        ({"q": "a\x00b"}, "q"),
        ({"sort": "loudest"}, "sort"),
    ],
)
def test_a_bad_filter_is_400_naming_it(api_for: ApiFor, viewer: User, query: dict[str, str], field: str) -> None:
    response = api_for(viewer).get(LIST, query)

    assert response.status_code == 400
    assert response.json()["code"] == "invalid"
    assert list(response.json()["errors"]) == [field]
    assert response.json()["detail"].startswith(f"{field}: ")


def test_merged_patterns_are_left_out_of_the_list_but_answer_at_their_url(
    api_for: ApiFor, operator: User, timeouts: FailurePattern, declines: FailurePattern
) -> None:
    client = api_for(operator)
    client.post(f"{LIST}merge/", {"target": timeouts.pk, "sources": [declines.pk]}, format="json")

    assert listed(client) == [timeouts.pk]
    assert client.get(f"{LIST}{declines.pk}/").json()["merged_into"] == timeouts.pk


def test_cursors_walk_three_pages_without_repeats(api_for: ApiFor, viewer: User) -> None:
    made = [pattern_of(many(1, error=f"failure number {word}", error_type=f"Error{word}")).pk for word in "ABCDEFG"]
    client = api_for(viewer)
    seen: list[int] = []
    pages = 0
    url: str | None = f"{LIST}?limit=3"
    while url:
        page = client.get(url).json()
        pages += 1
        seen += [row["id"] for row in page["results"]]
        url = page["next"]

    assert pages == 3
    assert seen == sorted(made, reverse=True)


def test_the_detail_counts_per_status_and_broker(
    api_for: ApiFor, viewer: User, operator: User, timeouts: FailurePattern
) -> None:
    letter = DeadLetter.objects.filter(pattern=timeouts).first()
    assert letter is not None
    DeadLetter.objects.filter(pk=letter.pk).update(status="archived")
    DeadLetterCount.objects.filter(pattern=timeouts, status="parked").update(count=2)
    DeadLetterCount.objects.create(
        broker=letter.broker,
        source_queue="orders.dlq",
        pattern=timeouts,
        failure_reason="TIMEOUT",
        status="archived",
        count=1,
    )
    assign_pattern(pattern=timeouts, owner=operator, note="looking into it", actor=operator)

    data = api_for(viewer).get(f"{LIST}{timeouts.pk}/").json()

    assert data["counts"] == {
        "parked": 2,
        "scheduled": 0,
        "replayed": 0,
        "moved": 0,
        "archived": 1,
        "failed": 0,
    }
    assert (data["waiting"], data["waiting_by_broker"]) == (2, {"default": 2})
    assert (data["owner"], data["note"]) == (operator.username, "looking into it")
    assert len(data["trend"]) == 24 and sum(data["trend"]) == 3
    assert data["events"][0]["kind"] == "note" and data["events"][0]["actor"] == operator.username
    assert data["absorbed"] == [] and data["first_seen_at"] and data["last_seen_at"]


def test_a_missing_pattern_is_json_404(api_for: ApiFor, operator: User) -> None:
    client = api_for(operator)

    for response in (
        client.get(f"{LIST}987654321/"),
        client.post(f"{LIST}987654321/triage/", {"status": "resolved"}, format="json"),
        client.post(f"{LIST}987654321/split/", {"name": "x", "regex": "y"}, format="json"),
    ):
        assert response.status_code == 404
        assert response.json() == {"detail": "No pattern #987654321.", "code": "not_found"}


def test_triage_changes_status_owner_and_note_and_the_audit_rows_name_the_token(
    api_for: ApiFor, operator: User, admin_user: User, timeouts: FailurePattern
) -> None:
    client = api_for(operator)

    response = client.post(
        f"{LIST}{timeouts.pk}/triage/",
        {"status": "acknowledged", "owner": admin_user.username, "note": "upstream timeouts"},
        format="json",
    )

    assert response.status_code == 200, response.json()
    data = response.json()
    assert (data["status"], data["owner"], data["note"]) == ("acknowledged", admin_user.username, "upstream timeouts")
    rows = AuditEntry.objects.filter(target=f"pattern #{timeouts.pk}").order_by("id")
    assert [row.action for row in rows] == ["pattern.status", "pattern.assign"]
    assert all(row.actor == operator and "API token tests-1" in row.via for row in rows)
    assert PatternEvent.objects.filter(pattern=timeouts, kind__in=["status", "note"]).count() == 2

    cleared = client.post(f"{LIST}{timeouts.pk}/triage/", {"owner": None}, format="json").json()
    assert (cleared["owner"], cleared["note"], cleared["status"]) == (None, "upstream timeouts", "acknowledged")
    noted = client.post(f"{LIST}{timeouts.pk}/triage/", {"note": ""}, format="json").json()
    assert noted["note"] == ""


def test_triage_is_all_or_nothing(api_for: ApiFor, operator: User, viewer: User, timeouts: FailurePattern) -> None:
    response = api_for(operator).post(
        f"{LIST}{timeouts.pk}/triage/", {"status": "resolved", "owner": viewer.username}, format="json"
    )

    assert response.status_code == 400
    assert response.json()["code"] == "refused" and "cannot own a pattern" in response.json()["detail"]
    timeouts.refresh_from_db()
    assert (timeouts.status, timeouts.owner_id) == (PatternStatus.OPEN, None)
    assert not AuditEntry.objects.filter(action__startswith="pattern.").exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "non_field_errors"),
        ({"status": "done"}, "status"),
        ({"owner": "nobody-by-that-name"}, "owner"),
        ({"note": "a\x00b"}, "note"),
    ],
)
def test_a_bad_triage_is_400(
    api_for: ApiFor, operator: User, timeouts: FailurePattern, body: dict[str, str], field: str
) -> None:
    response = api_for(operator).post(f"{LIST}{timeouts.pk}/triage/", body, format="json")

    assert response.status_code == 400
    assert (response.json()["code"], list(response.json()["errors"])) == ("invalid", [field])


def test_a_viewer_gets_403_on_every_change(
    api_for: ApiFor, viewer: User, timeouts: FailurePattern, declines: FailurePattern
) -> None:
    client = api_for(viewer)

    responses = [
        client.post(f"{LIST}{timeouts.pk}/triage/", {"status": "resolved"}, format="json"),
        client.post(f"{LIST}merge/", {"target": timeouts.pk, "sources": [declines.pk]}, format="json"),
        client.post(f"{LIST}{timeouts.pk}/split/", {"name": "x", "regex": "3000"}, format="json"),
        client.post(f"{LIST}987654321/triage/", {"status": "resolved"}, format="json"),
    ]

    assert [response.status_code for response in responses] == [403, 403, 403, 403]
    assert all("operator" in response.json()["detail"] for response in responses)
    assert FailurePattern.objects.get(pk=timeouts.pk).status == PatternStatus.OPEN
    assert FailurePattern.objects.get(pk=declines.pk).merged_into_id is None
    assert not AuditEntry.objects.filter(action__startswith="pattern.").exists()


def test_merge_previews_then_merges_and_answers_with_the_patterns(
    api_for: ApiFor, operator: User, timeouts: FailurePattern, declines: FailurePattern
) -> None:
    client = api_for(operator)
    body = {"target": timeouts.pk, "sources": [declines.pk, timeouts.pk]}

    preview = client.post(f"{LIST}merge/", {**body, "preview": True}, format="json").json()
    unchanged = FailurePattern.objects.get(pk=declines.pk).merged_into_id
    merged = client.post(f"{LIST}merge/", body, format="json").json()

    assert (preview["merged"], preview["moved"], preview["moving"], unchanged) == (False, None, 2, None)
    assert any(f"#{declines.pk} has error type CardError" in warning for warning in preview["warnings"])
    assert (merged["merged"], merged["moved"]) == (True, 2)
    assert merged["target"]["id"] == timeouts.pk and merged["target"]["counts"]["parked"] == 5
    assert merged["target"]["absorbed"] == [declines.pk]
    assert [(row["id"], row["merged_into"]) for row in merged["sources"]] == [(declines.pk, timeouts.pk)]
    entry = AuditEntry.objects.get(action="pattern.merge")
    assert entry.count == 2 and "API token" in entry.via


# 0 stands for the pattern of the test (the target that exists).
@pytest.mark.parametrize(
    ("target", "sources", "message"),
    [
        (987654321, [1], "No pattern #987654321; nothing was merged."),
        (0, [0], "Name at least one pattern other than the target."),
        (0, [987654321], "No pattern #987654321; nothing was merged."),
    ],
)
def test_a_merge_that_cannot_be_made_is_400(
    api_for: ApiFor, operator: User, timeouts: FailurePattern, target: int, sources: list[int], message: str
) -> None:
    body = {"target": target or timeouts.pk, "sources": [source or timeouts.pk for source in sources]}

    response = api_for(operator).post(f"{LIST}merge/", body, format="json")

    assert response.status_code == 400
    assert response.json() == {"detail": message, "code": "refused"}


def test_a_merge_body_without_sources_is_invalid(api_for: ApiFor, operator: User, timeouts: FailurePattern) -> None:
    response = api_for(operator).post(f"{LIST}merge/", {"target": timeouts.pk, "sources": []}, format="json")

    assert (response.status_code, response.json()["code"], list(response.json()["errors"])) == (
        400,
        "invalid",
        ["sources"],
    )


def test_split_previews_then_splits(api_for: ApiFor, operator: User) -> None:
    many(3, error="Request timed out after 3000ms")
    pattern = pattern_of(many(2, error="Request timed out after 1500ms"))
    client = api_for(operator)
    body = {"name": "Short timeouts", "regex": "after 1500ms"}

    preview = client.post(f"{LIST}{pattern.pk}/split/", {**body, "preview": True}, format="json").json()
    split = client.post(f"{LIST}{pattern.pk}/split/", body, format="json").json()

    assert (preview["split"], preview["part"]) == (False, None)
    assert (preview["preview"]["matching"], preview["preview"]["examined"], preview["preview"]["splits"]) == (
        2,
        5,
        True,
    )
    assert len(preview["preview"]["examples"]) == 2
    part = FailurePattern.objects.get(template="Short timeouts")
    assert (split["split"], split["preview"], split["part"]["id"]) == (True, None, part.pk)
    assert split["part"]["counts"]["parked"] == 2 and split["pattern"]["counts"]["parked"] == 3
    assert "API token" in AuditEntry.objects.get(action="pattern.split").via


@pytest.mark.parametrize(
    ("body", "status", "said"),
    [
        ({"name": "All", "regex": "timed out"}, 400, "matches every dead letter"),
        ({"name": "None", "regex": "nothing like this"}, 400, "matches none of the dead letters"),
        ({"name": "Broken", "regex": "(unclosed"}, 400, ""),
        ({"regex": "3000"}, 400, "name"),
    ],
)
def test_a_split_that_cannot_be_made_is_400(
    api_for: ApiFor, operator: User, timeouts: FailurePattern, body: dict[str, str], status: int, said: str
) -> None:
    response = api_for(operator).post(f"{LIST}{timeouts.pk}/split/", body, format="json")

    assert response.status_code == status
    assert said in response.json()["detail"]
    assert not FailurePattern.objects.filter(template=body.get("name", "")).exists()


def test_a_merged_away_pattern_cannot_be_triaged(
    api_for: ApiFor, operator: User, timeouts: FailurePattern, declines: FailurePattern
) -> None:
    client = api_for(operator)
    client.post(f"{LIST}merge/", {"target": timeouts.pk, "sources": [declines.pk]}, format="json")

    response = client.post(f"{LIST}{declines.pk}/triage/", {"status": "resolved"}, format="json")

    assert response.status_code == 400
    assert f"was merged into #{timeouts.pk}" in response.json()["detail"]


def test_an_owner_must_be_an_active_operator(api_for: ApiFor, operator: User, timeouts: FailurePattern) -> None:
    gone = UserFactory.create(username="gone-operator", role="operator", is_active=False)

    response = api_for(operator).post(f"{LIST}{timeouts.pk}/triage/", {"owner": gone.username}, format="json")

    assert response.status_code == 400
    assert "not an active user" in response.json()["detail"]


def test_the_list_sorts_by_what_waits_and_pages_through_ties(
    api_for: Callable[[User], APIClient], viewer: User
) -> None:
    """The patterns to look at first in an incident: most waiting first, every one once across cursor pages, ties
    included."""
    sizes = [3, 1, 5, 1, 1, 2]
    for name, size in zip(["Alpha", "Bravo", "Charlie", "Delta", "Echo", "Foxtrot"], sizes, strict=True):
        parked(size, error_type=f"{name}Error", message=f"the {name.lower()} service failed")
    client = api_for(viewer)

    seen: list[int] = []
    url: str | None = "/api/v1/patterns/?sort=waiting&limit=2"
    while url:
        page = client.get(url).json()
        seen += [row["waiting"] for row in page["results"]]
        url = page["next"]

    assert seen == sorted(sizes, reverse=True)
    newest = client.get("/api/v1/patterns/", {"sort": "newest"}).json()["results"]
    assert [row["id"] for row in newest] == sorted((row["id"] for row in newest), reverse=True)
    assert client.get("/api/v1/patterns/", {"sort": "loudest"}).status_code == 400
