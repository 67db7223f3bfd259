from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.deadletters.models import DeadLetter
from dlqconsole.operations.models import Operation, OperationStatus, RetryPolicy
from dlqconsole.operations.services import run_operation
from tests.factories import synthetic_dead_letters
from tests.support import declare_with_dlq, wait_for_depth

pytestmark = pytest.mark.django_db
CHANGELIST = "admin:deadletters_deadletter_changelist"


@pytest.fixture
def superuser_client(client: Client) -> Client:
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw-root"))
    return client


@pytest.fixture
def staff_operator_client(client: Client, operator: User) -> Client:
    operator.is_staff = True
    operator.save()
    operator.user_permissions.add(Permission.objects.get(codename="view_deadletter"))
    client.force_login(operator)
    return client


def act(client: Client, action: str, ids: list[int], **extra: str):  # type: ignore[no-untyped-def]
    data = {"action": action, "_selected_action": [str(pk) for pk in ids], **extra}
    if "step" not in extra:
        data["index"] = "0"
    return client.post(reverse(CHANGELIST), data)


def test_retry_action_shows_the_plan_then_starts_it(
    superuser_client, channel, queue_name, django_capture_on_commit_callbacks
):
    orders = queue_name("orders")
    declare_with_dlq(channel, orders)
    ids = synthetic_dead_letters(queue=orders, count=3)

    page = act(superuser_client, "retry_selected", ids)

    assert page.status_code == 200
    html = page.content.decode()
    assert "Retry <strong>3</strong>" in html
    assert f"queue {orders}" in html
    assert not Operation.objects.exists()  # the plan on the confirmation page was a dry run

    with django_capture_on_commit_callbacks() as callbacks:
        started = act(superuser_client, "retry_selected", ids, step="start", rate="100/1s", canary_size="0")
    operation = Operation.objects.get()
    assert started.status_code == 302
    assert started["Location"] == reverse("admin:operations_operation_change", args=[operation.pk])
    assert (operation.status, operation.total, operation.rate, len(callbacks)) == ("running", 3, "100/1s", 1)
    run_operation(operation_id=operation.pk)
    assert wait_for_depth(channel, orders, 3) == 3
    assert superuser_client.get(started["Location"]).status_code == 200


def test_retry_action_offers_no_start_when_none_of_the_selection_can_be_retried(superuser_client, queue_name):
    ids = synthetic_dead_letters(queue=queue_name("orders"), count=1)
    DeadLetter.objects.filter(pk__in=ids).update(status="replayed")

    page = act(superuser_client, "retry_selected", ids).content.decode()
    started = act(superuser_client, "retry_selected", ids, step="start", rate="", canary_size="0")

    assert "Retry <strong>0</strong> of the 1 selected dead letter to original queues." in page
    assert "<title>Retry 1 selected dead letter |" in page
    assert 'value="start"' not in page
    assert started.status_code == 200
    assert "Nothing was started: the plan holds no dead letter" in started.content.decode()
    assert not Operation.objects.exists()


def test_move_action_asks_for_a_target_and_warns_about_a_missing_queue(superuser_client, queue_name):
    ids = synthetic_dead_letters(queue="orders", count=2)
    missing = queue_name("missing")

    first = act(superuser_client, "move_selected", ids)
    preview = act(superuser_client, "move_selected", ids, step="preview", target_queue=missing)

    assert first.status_code == 200 and "The plan" not in first.content.decode()
    html = preview.content.decode()
    assert "2 cannot be replayed" in html
    assert f"queue &#x27;{missing}&#x27; does not exist" in html
    assert not Operation.objects.exists()
    # Nothing could be replayed: no Start, and a start sent anyway is refused and leaves no plan behind.
    assert 'value="start"' not in html
    forged = act(superuser_client, "move_selected", ids, step="start", target_queue=missing)
    assert "Nothing was started" in forged.content.decode()
    assert not Operation.objects.exists()
    assert set(DeadLetter.objects.values_list("status", flat=True)) == {"parked"}


def test_an_operator_cannot_purge_from_the_admin(staff_operator_client):
    ids = synthetic_dead_letters(queue="orders", count=2)

    response = act(staff_operator_client, "purge_selected", ids)

    assert response.status_code == 302
    assert DeadLetter.objects.count() == 2
    assert not Operation.objects.exists()
    # The action is not offered to an operator, so a forged request names an action Django does not know.
    messages = [str(message) for message in response.wsgi_request._messages]  # type: ignore[attr-defined]
    assert messages == ["No action selected."]


def test_operations_can_be_paused_from_their_admin_and_items_are_listed(superuser_client):
    synthetic_dead_letters(queue="orders", count=2)
    act(superuser_client, "archive_selected", list(DeadLetter.objects.values_list("pk", flat=True)), step="start")
    operation = Operation.objects.get()

    superuser_client.post(
        reverse("admin:operations_operation_changelist"),
        {"action": "pause_selected", "_selected_action": [operation.pk], "index": "0"},
    )

    operation.refresh_from_db()
    assert operation.status == OperationStatus.PAUSED
    items = superuser_client.get(
        reverse("admin:operations_operationitem_changelist"), {"operation__id__exact": operation.pk}
    )
    assert items.status_code == 200 and "pending" in items.content.decode().lower()


def test_admin_pages_of_operations_patterns_and_dead_letters_link_to_the_console(superuser_client):
    synthetic_dead_letters(queue="orders", count=1)
    letter = DeadLetter.objects.get()
    act(superuser_client, "archive_selected", [letter.pk], step="start")
    operation = Operation.objects.get()

    for admin_page, console_page in [
        (reverse("admin:operations_operation_change", args=[operation.pk]), f"/operations/{operation.pk}/"),
        (reverse("admin:deadletters_deadletter_change", args=[letter.pk]), f"/messages/{letter.pk}/"),
        (
            reverse("admin:deadletters_failurepattern_change", args=[letter.pattern_id]),
            f"/patterns/{letter.pattern_id}/",
        ),
    ]:
        html = superuser_client.get(admin_page).content.decode()
        view_on_site = html.split('class="viewsitelink"', 1)[0].rsplit('href="', 1)[1].split('"', 1)[0]
        assert superuser_client.get(view_on_site)["Location"].endswith(console_page)


def test_retry_policies_are_edited_by_admins_and_audited(superuser_client):
    response = superuser_client.post(
        reverse("admin:operations_retrypolicy_add"),
        {
            "name": "orders",
            "enabled": "on",
            "queue": "orders",
            "failure_reason": "",
            "delays": "30, 120",
            "max_attempts": "3",
            "permanent_reasons": ["VALIDATION_FAILED"],
            "rate": "10/1s",
        },
    )
    bad = superuser_client.post(
        reverse("admin:operations_retrypolicy_add"),
        {"name": "x", "delays": "soon", "max_attempts": "0", "rate": "fast"},
    )

    assert response.status_code == 302
    policy = RetryPolicy.objects.get()
    assert (policy.delays, policy.max_attempts, policy.permanent_reasons, policy.rate) == (
        [30, 120],
        3,
        ["VALIDATION_FAILED"],
        "10/1s",
    )
    assert AuditEntry.objects.filter(action="retrypolicy.add", target=f"retrypolicy:{policy.pk}").exists()
    # The admin's own audit row is not written beside the policy's (no double rows).
    assert not AuditEntry.objects.filter(action__startswith="admin.").exists()
    assert bad.status_code == 200 and RetryPolicy.objects.count() == 1
    assert "whole numbers of seconds" in bad.content.decode()
