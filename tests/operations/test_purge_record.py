"""A purge records what it deleted: a row per dead letter (ids, dedupe key, queue, pattern, status, ingested time),
written in the transaction that deletes it, downloadable as CSV from the operation page by operators and admins for
as long as the purge's audit row lives. Before the count is typed, the planned purge's page offers the messages
export of exactly its filter."""

from __future__ import annotations

import csv
import datetime as dt
import io
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.auth.models import User
from django.http import StreamingHttpResponse

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.accounts.services import delete_expired_audit_entries
from dlqconsole.deadletters.models import DeadLetter
from dlqconsole.operations.models import Operation, OperationStatus, PurgedDeadLetter
from dlqconsole.operations.planning import plan_operation
from dlqconsole.operations.services import run_operation
from tests.conftest import client_for
from tests.factories import synthetic_dead_letters

pytestmark = [pytest.mark.django_db]

HX = {"HX-Request": "true"}


def purged_through_the_page(admin: User, ids: list[int], capture: Callable[..., object]) -> Operation:
    """Plan a purge of `ids`, start it from its page with the count typed, and run it as the worker does."""
    operation = plan_operation(kind="purge", filter={"ids": ids}, actor=admin)
    with capture(execute=True):  # type: ignore[attr-defined]
        started = client_for(admin).post(f"/operations/{operation.pk}/start/", {"typed_count": str(len(ids))})
    assert started.status_code == 302
    run_operation(operation_id=operation.pk)
    operation.refresh_from_db()
    assert (operation.status, operation.succeeded) == (OperationStatus.DONE, len(ids))
    return operation


def csv_rows(response: Any) -> list[dict[str, str]]:
    assert isinstance(response, StreamingHttpResponse)
    text = b"".join(response.streaming_content).decode()  # type: ignore[arg-type]
    return list(csv.DictReader(io.StringIO(text)))


def test_a_purge_lists_what_it_deleted_as_csv_from_its_page(
    admin_user: User, operator: User, celery_queue: str, django_capture_on_commit_callbacks
) -> None:
    ids = synthetic_dead_letters(queue="orders", count=3)
    (bystander,) = synthetic_dead_letters(queue="orders", count=1, start=10)
    letters = {letter.pk: letter for letter in DeadLetter.objects.filter(pk__in=ids).select_related("pattern")}

    operation = purged_through_the_page(admin_user, ids, django_capture_on_commit_callbacks)
    client = client_for(operator)
    page = client.get(f"/operations/{operation.pk}/").content.decode()
    link = f'href="/operations/{operation.pk}/purged.csv"'
    download = client.get(f"/operations/{operation.pk}/purged.csv")

    assert link in page
    assert download.status_code == 200 and download["Content-Type"].startswith("text/csv")
    assert f"purge-{operation.pk}-deleted.csv" in download["Content-Disposition"]
    rows = csv_rows(download)
    assert [int(row["dead_letter_id"]) for row in rows] == ids
    for row in rows:
        letter = letters[int(row["dead_letter_id"])]
        assert row["dedupe_key"] == letter.dedupe_key and row["message_id"] == letter.message_id
        assert row["source_queue"] == "orders.dlq" and row["status"] == "parked"
        assert (int(row["pattern_id"]), row["pattern_template"]) == (letter.pattern_id, letter.pattern.template)
        assert dt.datetime.fromisoformat(row["ingested_at"]) == letter.ingested_at
    assert not DeadLetter.objects.filter(pk__in=ids).exists()
    assert DeadLetter.objects.filter(pk=bystander).exists()
    assert AuditEntry.objects.filter(action="export", target=f"operation:{operation.pk}").exists()
    # The records hang on the purge's start row in the audit log, and live as long as it does.
    hung_on = set(PurgedDeadLetter.objects.filter(operation=operation).values_list("audit_entry__action", flat=True))
    assert hung_on == {"operation.purge.start"}


def test_a_viewer_can_neither_download_nor_see_the_list(
    admin_user: User, viewer: User, celery_queue: str, django_capture_on_commit_callbacks
) -> None:
    ids = synthetic_dead_letters(queue="orders", count=3)
    operation = purged_through_the_page(admin_user, ids, django_capture_on_commit_callbacks)
    client = client_for(viewer)

    page = client.get(f"/operations/{operation.pk}/").content.decode()
    download = client.get(f"/operations/{operation.pk}/purged.csv")

    assert download.status_code == 403
    assert "purged.csv" not in page
    assert not AuditEntry.objects.filter(action="export").exists()


def test_an_admin_downloads_it_too_and_other_kinds_have_none(admin_user: User, operator: User) -> None:
    ids = synthetic_dead_letters(queue="orders", count=2)
    archive = plan_operation(kind="archive", filter={"ids": ids}, actor=operator)

    assert client_for(admin_user).get(f"/operations/{archive.pk}/purged.csv").status_code == 404
    assert "purged.csv" not in client_for(admin_user).get(f"/operations/{archive.pk}/").content.decode()


def test_the_list_is_written_in_the_deleting_transaction(
    admin_user: User, settings, refuse_deleting: Callable[[int], None]
) -> None:
    # Chunks of two: the first commits; the second holds a dead letter whose deletion the database refuses, so it
    # rolls back, and neither its deletions nor its records exist.
    settings.DLQ_OPERATION_CHUNK_SIZE = 2
    ids = synthetic_dead_letters(queue="orders", count=4)
    refuse_deleting(ids[3])
    operation = plan_operation(kind="purge", filter={"ids": ids}, actor=admin_user)
    Operation.objects.filter(pk=operation.pk).update(status=OperationStatus.RUNNING)

    run_operation(operation_id=operation.pk)

    recorded = set(PurgedDeadLetter.objects.filter(operation=operation).values_list("dead_letter_id", flat=True))
    left = set(DeadLetter.objects.filter(pk__in=ids).values_list("pk", flat=True))
    assert recorded == set(ids[:2])
    assert left == set(ids[2:])
    # Started without its start row (set running here): the records hang on a row of their own, written once.
    assert AuditEntry.objects.filter(action="operation.purge.records", target=f"operation:{operation.pk}").count() == 1


def test_the_list_lives_as_long_as_the_purge_audit_row(
    admin_user: User, operator: User, settings, celery_queue: str, django_capture_on_commit_callbacks
) -> None:
    settings.DLQ_AUDIT_RETENTION_DAYS = 400
    ids = synthetic_dead_letters(queue="orders", count=3)
    operation = purged_through_the_page(admin_user, ids, django_capture_on_commit_callbacks)
    start = AuditEntry.objects.get(action="operation.purge.start", target=f"operation:{operation.pk}")
    client = client_for(operator)

    delete_expired_audit_entries(now=start.created_at + dt.timedelta(days=399))
    kept = csv_rows(client.get(f"/operations/{operation.pk}/purged.csv"))
    delete_expired_audit_entries(now=start.created_at + dt.timedelta(days=401))
    gone = client.get(f"/operations/{operation.pk}/purged.csv")

    assert [int(row["dead_letter_id"]) for row in kept] == ids
    assert not AuditEntry.objects.filter(pk=start.pk).exists()
    assert not PurgedDeadLetter.objects.filter(operation=operation).exists()
    assert gone.status_code == 404
    page = client.get(f"/operations/{operation.pk}/").content.decode()
    assert "purged.csv" not in page and "no longer kept" in page


def export_links(page: str) -> list[str]:
    """The addresses the planned purge's "download what will be deleted" line links to."""
    box = page[page.index('data-testid="purge-export"') :].split("</div>", 1)[0]
    assert "Download what will be deleted" in box
    return [part.split('"', 1)[0].replace("&amp;", "&") for part in box.split('href="')[1:]]


def test_the_planned_purge_page_offers_the_export_of_exactly_its_filter(admin_user: User, operator: User) -> None:
    synthetic_dead_letters(queue="orders", count=3)
    synthetic_dead_letters(queue="payments", count=2)
    operation = plan_operation(kind="purge", filter={"queue": ["orders.dlq"], "text": "timed out"}, actor=admin_user)

    admin_page = client_for(admin_user).get(f"/operations/{operation.pk}/").content.decode()
    operator_page = client_for(operator).get(f"/operations/{operation.pk}/").content.decode()

    # Before the count is typed: the line comes before the purge's start form.
    assert admin_page.index('data-testid="purge-export"') < admin_page.index('name="typed_count"')
    for links in (export_links(admin_page), export_links(operator_page)):
        addresses = [urlsplit(link) for link in links]
        assert [address.path for address in addresses] == ["/messages/export/", "/messages/export/"]
        queries = [parse_qs(address.query) for address in addresses]
        assert queries == [
            {"format": [export_format], "queue": ["orders.dlq"], "text": ["timed out"]}
            for export_format in ("csv", "jsonl")
        ]
    exported = client_for(operator).get(export_links(operator_page)[0])
    assert exported.status_code == 200
    assert [row["source_queue"] for row in csv_rows(exported)] == ["orders.dlq"] * 3


def test_a_started_purge_page_offers_the_list_instead_of_the_filter_export(
    admin_user: User, celery_queue: str, django_capture_on_commit_callbacks
) -> None:
    ids = synthetic_dead_letters(queue="orders", count=1)
    operation = purged_through_the_page(admin_user, ids, django_capture_on_commit_callbacks)

    page = client_for(admin_user).get(f"/operations/{operation.pk}/").content.decode()

    assert 'data-testid="purge-export"' not in page
    assert f'href="/operations/{operation.pk}/purged.csv"' in page


def test_a_filter_too_long_for_an_address_is_offered_as_a_form_that_posts_it(
    admin_user: User, celery_queue: str, django_capture_on_commit_callbacks
) -> None:
    ids = synthetic_dead_letters(queue="orders", count=300)
    operation = plan_operation(kind="purge", filter={"ids": ids}, actor=admin_user)
    client = client_for(admin_user)

    page = client.get(f"/operations/{operation.pk}/").content.decode()
    box = page[page.index('data-testid="purge-export"') :].split("</div>", 1)[0]
    fields = [part.split('"', 1)[0] for part in box.split('name="ids" value="')[1:]]
    with django_capture_on_commit_callbacks(execute=True):
        posted = client.post("/messages/export/", {"ids": fields, "format": "csv"})

    assert 'method="post" action="/messages/export/"' in box and "href=" not in box
    assert [int(value) for value in fields] == ids
    assert 'name="format" value="csv"' in box and 'name="format" value="jsonl"' in box
    assert posted.status_code == 302 and posted["Location"].startswith("/messages/exports/")
    export = AuditEntry.objects.get(action="export", target__startswith="export:")
    assert export.filter == {"ids": ids}


def test_a_cell_a_spreadsheet_would_run_as_a_formula_is_defused(admin_user: User, operator: User) -> None:
    (letter_id,) = synthetic_dead_letters(queue="orders", count=1)
    DeadLetter.objects.filter(pk=letter_id).update(message_id='=HYPERLINK("http://evil.example","x")')
    operation = plan_operation(kind="purge", filter={"ids": [letter_id]}, actor=admin_user)
    Operation.objects.filter(pk=operation.pk).update(status=OperationStatus.RUNNING)
    run_operation(operation_id=operation.pk)

    (row,) = csv_rows(client_for(operator).get(f"/operations/{operation.pk}/purged.csv"))

    assert row["message_id"] == '\'=HYPERLINK("http://evil.example","x")'


def test_a_further_occurrence_of_identical_content_is_recorded_with_its_longer_key(
    admin_user: User, celery_queue: str, django_capture_on_commit_callbacks
) -> None:
    (first,) = synthetic_dead_letters(queue="orders", count=1)
    (copy,) = synthetic_dead_letters(queue="orders", count=1)  # the same bytes again: a further occurrence
    key = DeadLetter.objects.get(pk=copy).dedupe_key
    assert len(key) == 77 and DeadLetter.objects.get(pk=copy).identical_to_id == first

    operation = purged_through_the_page(admin_user, [first, copy], django_capture_on_commit_callbacks)

    assert sorted(PurgedDeadLetter.objects.filter(operation=operation).values_list("dedupe_key", flat=True)) == sorted(
        [key[:64], key]
    )
