"""Plan and operation pages: who may do what, the plan, the progress fragment and the controls."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from django.utils.html import escape

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.deadletters.models import DeadLetter, DeadLetterStatus, FailurePattern
from dlqconsole.operations.models import ItemStatus, Operation, OperationItem, OperationStatus
from dlqconsole.operations.planning import plan_operation
from dlqconsole.operations.services import run_operation
from tests.conftest import client_for
from tests.factories import many

pytestmark = [pytest.mark.django_db]

HX = {"HX-Request": "true"}


def shown(html: str) -> str:
    """The page with each run of spaces and line breaks as one space, as a browser reads it: the templates break
    their long lines wherever HTML allows."""
    return re.sub(r"[ \n]+", " ", html)


def test_viewer_cannot_open_a_plan(viewer: User) -> None:
    letters = many(2)

    response = client_for(viewer).get(f"/operations/plan/?kind=retry&pattern={letters[0].pattern_id}")

    assert response.status_code == 403


def test_viewer_post_to_purge_gets_403_and_changes_nothing(viewer: User) -> None:
    letters = many(3)

    response = client_for(viewer).post(
        "/operations/plan/", {"kind": "purge", "pattern": letters[0].pattern_id, "scope": "all"}
    )

    assert response.status_code == 403
    assert Operation.objects.count() == 0
    assert DeadLetter.objects.filter(pk__in=[row.pk for row in letters]).count() == 3
    assert not AuditEntry.objects.filter(action__startswith="operation.purge").exists()


def test_operator_cannot_purge_but_an_admin_can_plan_it(operator: User, admin_user: User) -> None:
    letters = many(2)
    form = {"kind": "purge", "pattern": letters[0].pattern_id, "scope": "all"}

    refused = client_for(operator).post("/operations/plan/", form)
    planned = client_for(admin_user).post("/operations/plan/", form)

    assert refused.status_code == 403
    operation = Operation.objects.get()
    assert planned.status_code == 302 and planned["Location"] == f"/operations/{operation.pk}/"
    assert (operation.kind, operation.total, operation.status) == ("purge", 2, OperationStatus.PLANNED)
    assert AuditEntry.objects.filter(action="operation.purge.plan", count=2).exists()


def test_operator_post_to_start_an_admins_purge_gets_403_and_deletes_nothing(
    operator: User, admin_user: User, celery_queue: str, django_capture_on_commit_callbacks
) -> None:
    letters = many(3)
    ids = [row.pk for row in letters]
    planned = client_for(admin_user).post(
        "/operations/plan/", {"kind": "purge", "pattern": letters[0].pattern_id, "scope": "all"}
    )
    operation = Operation.objects.get()
    assert planned.status_code == 302 and (operation.kind, operation.total) == ("purge", 3)
    audit_before = list(AuditEntry.objects.order_by("pk").values_list("pk", "actor_name", "action", "target"))
    assert [row[1:] for row in audit_before] == [("ada-admin", "operation.purge.plan", f"operation:{operation.pk}")]
    # The operator signs in with CSRF checks on and sends the token the console gave it, with the right count typed:
    # only the role stands in the way.
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(operator)
    page = strict.get(f"/operations/{operation.pk}/")
    assert page.status_code == 200 and f"/operations/{operation.pk}/start/" not in page.content.decode()
    token = strict.cookies["csrftoken"].value  # set by the page (its htmx requests carry it)

    with django_capture_on_commit_callbacks(execute=True) as enqueued:
        plain = strict.post(f"/operations/{operation.pk}/start/", {"csrfmiddlewaretoken": token, "typed_count": "3"})
        htmx = strict.post(
            f"/operations/{operation.pk}/start/",
            {"typed_count": "3"},
            headers={**HX, "X-CSRFToken": token},
        )

    for response in (plain, htmx):
        assert response.status_code == 403
        body = response.content.decode()
        assert "This needs the admin role." in body and "Form expired" not in body  # the role check, not CSRF's
    assert enqueued == []
    operation.refresh_from_db()
    assert (operation.status, operation.started_at, operation.succeeded) == (OperationStatus.PLANNED, None, 0)
    assert DeadLetter.objects.filter(pk__in=ids).count() == 3
    assert set(DeadLetter.objects.filter(pk__in=ids).values_list("status", flat=True)) == {DeadLetterStatus.PARKED}
    # A refused request changes nothing, so nothing is written to the audit log (no start, no start_refused, no row
    # in the operator's name): the log holds the admin's plan and nothing else.
    assert list(AuditEntry.objects.order_by("pk").values_list("pk", "actor_name", "action", "target")) == audit_before
    # The same token is good: the operator's own archive plan goes through with it.
    own = strict.post(
        "/operations/plan/", {"csrfmiddlewaretoken": token, "kind": "archive", "scope": "selected", "ids": ids}
    )
    assert own.status_code == 302 and Operation.objects.filter(kind="archive").count() == 1


def test_viewer_cannot_start_pause_or_cancel_an_operation(viewer: User, operator: User) -> None:
    letters = many(2)
    operation = plan_operation(kind="archive", filter={"ids": [row.pk for row in letters]}, actor=operator)
    client = client_for(viewer)

    for action in ("start", "pause", "resume", "cancel", "rate"):
        assert client.post(f"/operations/{operation.pk}/{action}/", {"rate": "5/1s"}).status_code == 403

    operation.refresh_from_db()
    assert operation.status == OperationStatus.PLANNED
    assert set(DeadLetter.objects.values_list("status", flat=True)) == {DeadLetterStatus.PARKED}


def test_plan_page_shows_the_filter_and_an_estimate_from_the_counters(operator: User) -> None:
    letters = many(4)

    page = client_for(operator).get(f"/operations/plan/?kind=retry&pattern={letters[0].pattern_id}&scope=all")

    html = page.content.decode()
    assert page.status_code == 200
    assert "4 dead letters now" in html
    assert escape(FailurePattern.objects.get(pk=letters[0].pattern_id).template) in html
    assert 'name="rate"' in html and 'name="canary_size"' in html


def test_plan_page_counts_ticked_rows_that_the_operation_would_take(operator: User) -> None:
    letters = many(3)
    DeadLetter.objects.filter(pk=letters[0].pk).update(status=DeadLetterStatus.REPLAYED)
    ids = "&".join(f"ids={letter.pk}" for letter in letters)

    html = client_for(operator).get(f"/operations/plan/?kind=retry&{ids}").content.decode()

    # The replayed one is not retried unless the filter asks for replayed dead letters.
    assert "2 dead letters now" in html and "counted when the plan is made" not in html


def test_plan_page_starts_from_the_default_rate_and_a_cleared_rate_means_no_limit(operator: User) -> None:
    letters = many(4)
    client = client_for(operator)
    query = f"kind=retry&pattern={letters[0].pattern_id}&scope=all"

    page = client.get(f"/operations/plan/?{query}").content.decode()
    client.post("/operations/plan/", {"kind": "retry", "pattern": letters[0].pattern_id, "scope": "all", "rate": ""})

    assert re.search(r'name="rate" value="100/1s"', page)
    assert Operation.objects.get().rate == ""  # cleared on purpose: no limit


def test_plan_refuses_an_empty_filter(operator: User) -> None:
    many(2)

    page = client_for(operator).get("/operations/plan/?kind=retry&scope=all")

    assert "An operation needs a filter" in page.content.decode()
    assert client_for(operator).post("/operations/plan/", {"kind": "retry", "scope": "all"}).status_code == 400
    assert Operation.objects.count() == 0


def test_plan_of_ticked_rows_takes_only_those(operator: User) -> None:
    letters = many(5)
    ticked = sorted([letters[1].pk, letters[3].pk])

    response = client_for(operator).post(
        "/operations/plan/", {"kind": "archive", "scope": "selected", "ids": ticked, "queue": "orders.dlq"}
    )

    operation = Operation.objects.get()
    assert response.status_code == 302
    assert operation.total == 2
    assert sorted(operation.items.values_list("dead_letter_id", flat=True)) == ticked


def test_plan_of_all_matching_ignores_ticked_rows(operator: User) -> None:
    letters = many(5)

    client_for(operator).post(
        "/operations/plan/", {"kind": "archive", "scope": "all", "ids": [letters[0].pk], "queue": "orders.dlq"}
    )

    assert Operation.objects.get().total == 5


def test_plan_with_a_bad_rate_explains_and_plans_nothing(operator: User) -> None:
    letters = many(1)

    response = client_for(operator).post(
        "/operations/plan/", {"kind": "retry", "scope": "all", "pattern": letters[0].pattern_id, "rate": "fast"}
    )

    assert response.status_code == 400
    assert "rate" in response.content.decode().lower()
    assert Operation.objects.count() == 0


def test_operation_page_shows_the_plan_and_a_polling_progress_fragment(operator: User) -> None:
    letters = many(3)
    operation = plan_operation(kind="archive", filter={"pattern": [letters[0].pattern_id]}, actor=operator)
    client = client_for(operator)

    page = client.get(f"/operations/{operation.pk}/")
    fragment = client.get(f"/operations/{operation.pk}/", headers=HX)

    html = page.content.decode()
    assert page.status_code == 200 and "<html" in html
    assert "Start: archive 3 messages" in html
    assert "orders.dlq" in html
    body = fragment.content.decode()
    assert fragment.status_code == 200
    assert body.strip().startswith('<section id="progress"') and "<html" not in body
    assert 'hx-trigger="every 1s"' in body


def test_progress_fragment_stops_polling_when_the_operation_is_finished(operator: User) -> None:
    letters = many(3)
    operation = plan_operation(kind="archive", filter={"pattern": [letters[0].pattern_id]}, actor=operator)
    Operation.objects.filter(pk=operation.pk).update(status=OperationStatus.RUNNING)
    run_operation(operation_id=operation.pk)

    fragment = client_for(operator).get(f"/operations/{operation.pk}/", headers=HX)

    operation.refresh_from_db()
    assert operation.status == OperationStatus.DONE
    assert fragment.status_code == 286
    body = fragment.content.decode()
    assert "every 1s" not in body
    assert "100%" in body


def test_operator_starts_pauses_changes_rate_resumes_and_cancels(
    operator: User, celery_queue: str, django_capture_on_commit_callbacks
) -> None:
    letters = many(3)
    operation = plan_operation(kind="retry", filter={"pattern": [letters[0].pattern_id]}, actor=operator, rate="1/1m")
    # Their exchange is not on this broker; as if it were (a plan that cannot replay any is not started).
    Operation.objects.filter(pk=operation.pk).update(unreplayable=0, unreplayable_reasons={})
    client = client_for(operator)

    with django_capture_on_commit_callbacks(execute=True) as started:
        start = client.post(f"/operations/{operation.pk}/start/", headers=HX)
    assert start.status_code == 200 and len(started) == 1
    assert Operation.objects.get(pk=operation.pk).status == OperationStatus.RUNNING

    pause = client.post(f"/operations/{operation.pk}/pause/")
    assert pause.status_code == 302
    assert Operation.objects.get(pk=operation.pk).status == OperationStatus.PAUSED

    rate = client.post(f"/operations/{operation.pk}/rate/", {"rate": "20/1s"}, headers=HX)
    assert rate.status_code == 200 and "20/1s" in rate.content.decode()
    assert Operation.objects.get(pk=operation.pk).rate == "20/1s"

    with django_capture_on_commit_callbacks(execute=True):
        resume = client.post(f"/operations/{operation.pk}/resume/", headers=HX)
    assert resume.status_code == 200
    assert Operation.objects.get(pk=operation.pk).status == OperationStatus.RUNNING

    cancel = client.post(f"/operations/{operation.pk}/cancel/", headers=HX)
    assert cancel.status_code == 200
    assert Operation.objects.get(pk=operation.pk).status == OperationStatus.CANCELLED
    assert set(AuditEntry.objects.values_list("action", flat=True)) >= {
        "operation.retry.start",
        "operation.pause",
        "operation.rate",
        "operation.resume",
        "operation.cancel",
    }


def test_a_control_that_does_not_apply_says_why(operator: User) -> None:
    letters = many(1)
    operation = plan_operation(kind="archive", filter={"ids": [letters[0].pk]}, actor=operator)

    response = client_for(operator).post(f"/operations/{operation.pk}/resume/", headers=HX)

    assert response.status_code == 409
    assert "only a paused one can resume" in response.content.decode()


def test_operations_list_shows_history_as_page_and_fragment(operator: User) -> None:
    letters = many(2)
    first = plan_operation(kind="archive", filter={"ids": [letters[0].pk]}, actor=operator)
    second = plan_operation(kind="retry", filter={"ids": [letters[1].pk]}, actor=operator)
    client = client_for(operator)

    page = client.get("/operations/")
    fragment = client.get("/operations/?kind=retry", headers=HX)

    html = page.content.decode()
    assert f"Archive #{first.pk}" in html and f"Retry #{second.pk}" in html
    body = fragment.content.decode()
    assert body.strip().startswith('<section id="operations"')
    assert f"Retry #{second.pk}" in body and f"Archive #{first.pk}" not in body


def test_viewer_sees_operations_but_no_controls(viewer: User, operator: User) -> None:
    letters = many(1)
    operation = plan_operation(kind="archive", filter={"ids": [letters[0].pk]}, actor=operator)

    html = client_for(viewer).get(f"/operations/{operation.pk}/").content.decode()

    assert f"Archive #{operation.pk}" in html
    assert "/start/" not in html and "/cancel/" not in html


def test_changes_need_the_csrf_token(operator: User) -> None:
    letters = many(1)
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(operator)

    response = strict.post("/operations/plan/", {"kind": "archive", "scope": "all", "ids": [letters[0].pk]})

    assert response.status_code == 403
    assert Operation.objects.count() == 0


def test_dashboard_lists_operations_under_way_but_not_idle_plans(operator: User) -> None:
    letters = many(2)
    idle = plan_operation(kind="archive", filter={"ids": [letters[0].pk]}, actor=operator)
    paused = plan_operation(kind="retry", filter={"ids": [letters[1].pk]}, actor=operator)
    Operation.objects.filter(pk=paused.pk).update(status=OperationStatus.PAUSED)

    html = client_for(operator).get("/", headers=HX).content.decode()

    assert f"Retry #{paused.pk}" in html
    assert f"Archive #{idle.pk}" not in html


def test_a_cancelled_operation_is_polled_until_its_in_flight_messages_are_settled(operator: User) -> None:
    letters = many(3)
    operation = plan_operation(kind="archive", filter={"pattern": [letters[0].pattern_id]}, actor=operator)
    Operation.objects.filter(pk=operation.pk).update(status=OperationStatus.CANCELLED, in_flight=1)

    settling = client_for(operator).get(f"/operations/{operation.pk}/", headers=HX)
    Operation.objects.filter(pk=operation.pk).update(in_flight=0)
    settled = client_for(operator).get(f"/operations/{operation.pk}/", headers=HX)

    assert settling.status_code == 200 and "every 1s" in settling.content.decode()
    assert settled.status_code == 286 and "every 1s" not in settled.content.decode()


def test_an_operation_whose_messages_failed_is_not_shown_as_a_green_done(operator: User) -> None:
    letters = many(2)
    operation = plan_operation(kind="archive", filter={"pattern": [letters[0].pattern_id]}, actor=operator)
    Operation.objects.filter(pk=operation.pk).update(status=OperationStatus.DONE, failed=2, total=2)

    detail = client_for(operator).get(f"/operations/{operation.pk}/").content.decode()
    listing = client_for(operator).get("/operations/").content.decode()

    assert '<span class="chip st-failed" data-testid="status">Done: every message failed</span>' in detail
    assert '<span class="chip st-failed">Done: every message failed</span>' in listing


def test_the_start_button_warns_when_messages_cannot_be_replayed(operator: User) -> None:
    letters = many(2)
    operation = plan_operation(kind="retry", filter={"pattern": [letters[0].pattern_id]}, actor=operator)
    Operation.objects.filter(pk=operation.pk).update(unreplayable_reasons={"queue 'gone' does not exist": 2})

    partly = plan_operation(kind="retry", filter={"ids": [letters[0].pk, letters[1].pk]}, actor=operator)
    Operation.objects.filter(pk=partly.pk).update(unreplayable_reasons={"queue 'gone' does not exist": 1})
    client = client_for(operator)

    html = client.get(f"/operations/{operation.pk}/").content.decode()
    fragment = client.get(f"/operations/{operation.pk}/", headers=HX).content.decode()
    partly_html = client.get(f"/operations/{partly.pk}/").content.decode()

    for body in (shown(html), shown(fragment)):
        assert (
            "None of these 2 messages can be replayed: see why below. Start is disabled: plan again with a "
            "destination that exists, or discard this plan."
        ) in body
        assert re.search(r'<button type="submit" class="primary" disabled[^>]*> ?Start: retry 2 messages', body)
    assert "1 of these 2 messages cannot be replayed: see why below. They will be marked failed." in partly_html
    assert re.search(r'<button type="submit" class="primary" ?> ?Start: retry 2 messages', shown(partly_html))


def test_a_plan_none_of_whose_messages_can_be_replayed_is_refused_by_the_server(
    operator: User, celery_queue: str, django_capture_on_commit_callbacks
) -> None:
    letters = many(2)
    operation = plan_operation(
        kind="move", filter={"pattern": [letters[0].pattern_id]}, actor=operator, target_queue="no.such.queue"
    )
    assert operation.unreplayable_reasons == {"queue 'no.such.queue' does not exist": 2}
    client = client_for(operator)

    with django_capture_on_commit_callbacks(execute=True) as enqueued:
        fragment = client.post(f"/operations/{operation.pk}/start/", headers=HX)
        page = client.post(f"/operations/{operation.pk}/start/")

    reason = (
        "Nothing was started: any of these 2 messages cannot be replayed (queue &#x27;no.such.queue&#x27; does not "
        "exist). Plan again with a destination that exists, or discard this plan."
    )
    assert fragment.status_code == 409 and reason in _feedback(fragment.content.decode())
    assert page.status_code == 409 and reason in _feedback(page.content.decode())
    assert enqueued == []
    operation.refresh_from_db()
    assert (operation.status, operation.started_at) == (OperationStatus.PLANNED, None)
    assert not AuditEntry.objects.filter(action="operation.move.start").exists()
    assert set(DeadLetter.objects.filter(pk__in=[row.pk for row in letters]).values_list("status", flat=True)) == {
        DeadLetterStatus.PARKED
    }


def test_history_page_mark_in_other_digits_is_ignored_not_a_server_error(viewer: User) -> None:
    # '²' passes str.isdigit() but int() refuses it.
    response = client_for(viewer).get("/operations/", {"before": "²"})

    assert response.status_code == 200


def test_the_start_form_of_a_purge_asks_for_its_number_of_messages(admin_user: User) -> None:
    letters = many(3)
    purge = plan_operation(kind="purge", filter={"pattern": [letters[0].pattern_id]}, actor=admin_user)
    retry = plan_operation(kind="retry", filter={"pattern": [letters[0].pattern_id]}, actor=admin_user)
    client = client_for(admin_user)

    purge_page = client.get(f"/operations/{purge.pk}/").content.decode()
    retry_page = client.get(f"/operations/{retry.pk}/").content.decode()

    assert 'name="typed_count"' in purge_page and "Type <strong>3</strong>, the number of messages" in purge_page
    assert "Start: purge 3 messages" in purge_page
    assert 'name="typed_count"' not in retry_page and "Start: retry 3 messages" in retry_page


def test_a_purge_starts_only_with_its_number_of_messages_typed(
    admin_user: User, celery_queue: str, django_capture_on_commit_callbacks
) -> None:
    letters = many(3)
    ids = [row.pk for row in letters]
    operation = plan_operation(kind="purge", filter={"pattern": [letters[0].pattern_id]}, actor=admin_user)
    client = client_for(admin_user)

    missing = client.post(f"/operations/{operation.pk}/start/", headers=HX)
    wrong = client.post(f"/operations/{operation.pk}/start/", {"typed_count": "30"})

    assert missing.status_code == 409
    assert "Nothing was deleted: type 3 (the number of messages) to purge these 3 messages." in (
        missing.content.decode()
    )
    assert wrong.status_code == 409
    assert "Nothing was deleted: you typed 30, but this purge deletes 3 messages. Type 3 to confirm." in (
        wrong.content.decode()
    )
    operation.refresh_from_db()
    assert (operation.status, operation.started_at) == (OperationStatus.PLANNED, None)
    assert DeadLetter.objects.filter(pk__in=ids).count() == 3
    refusals = AuditEntry.objects.filter(action="operation.purge.start_refused", target=f"operation:{operation.pk}")
    assert sorted(refusals.values_list("detail", flat=True)) == ["no count typed", "typed '30' instead of 3"]
    assert not AuditEntry.objects.filter(action="operation.purge.start").exists()

    with django_capture_on_commit_callbacks(execute=True) as started:
        right = client.post(f"/operations/{operation.pk}/start/", {"typed_count": " 3 "}, headers=HX)
    run_operation(operation_id=operation.pk)

    assert right.status_code == 200 and len(started) == 1
    operation.refresh_from_db()
    assert (operation.status, operation.succeeded) == (OperationStatus.DONE, 3)
    assert not DeadLetter.objects.filter(pk__in=ids).exists()
    assert AuditEntry.objects.filter(action="operation.purge.start", count=3).exists()


def test_other_kinds_start_without_typing_anything(
    operator: User, celery_queue: str, django_capture_on_commit_callbacks
) -> None:
    letters = many(2)
    operation = plan_operation(kind="archive", filter={"pattern": [letters[0].pattern_id]}, actor=operator)

    with django_capture_on_commit_callbacks(execute=True):
        response = client_for(operator).post(f"/operations/{operation.pk}/start/", headers=HX)

    assert response.status_code == 200
    assert Operation.objects.get(pk=operation.pk).status == OperationStatus.RUNNING


def test_a_discarded_plan_is_shown_as_never_started_not_as_a_cancelled_run(operator: User) -> None:
    letters = many(3)
    plan = plan_operation(kind="archive", filter={"pattern": [letters[0].pattern_id]}, actor=operator)
    client = client_for(operator)

    planned_page = client.get(f"/operations/{plan.pk}/").content.decode()
    discard = client.post(f"/operations/{plan.pk}/cancel/", follow=True)

    assert 'hx-confirm="Discard this plan? Nothing has been done yet."' in planned_page
    assert "Discard the plan" in planned_page
    assert "Plan discarded." in discard.content.decode()
    plan.refresh_from_db()
    assert (plan.status, plan.skipped, plan.started_at) == (OperationStatus.CANCELLED, 3, None)
    assert plan.outcome == ("Discarded (never started)", "cancelled")
    assert AuditEntry.objects.get(action="operation.cancel").detail == "plan discarded before it started"
    detail = client.get(f"/operations/{plan.pk}/").content.decode()
    assert '<span class="chip st-cancelled" data-testid="status">Discarded (never started)</span>' in detail
    assert 'data-testid="progress"' not in detail and "100%" not in detail and "skipped" not in detail
    assert "3 planned; the plan was discarded before it started, so none was touched" in detail
    listing = client.get("/operations/").content.decode()
    assert '<span class="chip st-cancelled">Discarded (never started)</span>' in listing
    assert 'role="progressbar"' not in listing and "0 / 3" in listing
    assert set(DeadLetter.objects.filter(pk__in=[row.pk for row in letters]).values_list("status", flat=True)) == {
        DeadLetterStatus.PARKED
    }


def test_a_started_operation_asks_before_cancelling_and_is_called_cancelled(operator: User) -> None:
    letters = many(2)
    operation = plan_operation(kind="archive", filter={"pattern": [letters[0].pattern_id]}, actor=operator)
    Operation.objects.filter(pk=operation.pk).update(
        status=OperationStatus.PAUSED, started_at=timezone.now(), pause_reason="20 of 22 replayed messages came back"
    )
    client = client_for(operator)

    paused_page = client.get(f"/operations/{operation.pk}/").content.decode()
    cancel = client.post(f"/operations/{operation.pk}/cancel/", follow=True)

    assert 'hx-confirm="Cancel this operation? What is done stays done."' in paused_page
    assert "Cancelled." in cancel.content.decode()
    detail = client.get(f"/operations/{operation.pk}/").content.decode()
    assert '<span class="chip st-cancelled" data-testid="status">Cancelled</span>' in detail
    assert 'data-testid="progress"' in detail
    # A person cancelled it, not the system: who, and the pause it came after.
    assert re.search(r'data-testid="cancelled-by">by otto-operator, [^<]+</span>', detail)
    assert 'data-testid="pause-reason">after it paused: 20 of 22 replayed messages came back</span>' in detail


def test_time_left_on_the_page_counts_the_canary_wait(operator: User) -> None:
    letters = many(16)
    operation = plan_operation(
        kind="retry", filter={"pattern": [letters[0].pattern_id]}, actor=operator, canary_size=10, rate="10/1s"
    )
    now = timezone.now()
    Operation.objects.filter(pk=operation.pk).update(
        status=OperationStatus.CANARY,
        started_at=now - dt.timedelta(seconds=2),
        succeeded=10,
        canary_until=now + dt.timedelta(seconds=50, milliseconds=500),
    )

    fragment = client_for(operator).get(f"/operations/{operation.pk}/", headers=HX).content.decode()

    # 50 s of wait left and 6 messages at 10 a second: not "about 1s".
    assert re.search(r'<dd data-testid="eta">about 5[01]s</dd>', fragment)


def test_plan_page_offers_small_canaries_and_says_their_share_of_the_plan(operator: User) -> None:
    letters = many(16)
    client = client_for(operator)

    html = client.get(f"/operations/plan/?kind=retry&pattern={letters[0].pattern_id}&scope=all").content.decode()
    limited = client.get(
        f"/operations/plan/?kind=retry&pattern={letters[0].pattern_id}&scope=all&limit=8"
    ).content.decode()

    sizes = re.findall(r'<option value="(\d+)"', html.split('name="canary_size"')[1].split("</select>")[0])
    assert sizes == ["0", "1", "5", "10", "50", "100"]
    assert '<option value="1">first 1, then wait (6% of about 16)</option>' in html
    assert '<option value="10">first 10, then wait (62% of about 16)</option>' in html
    assert '<option value="50" disabled>first 50: not smaller than the plan (about 16)</option>' in shown(html)
    assert "its share of the plan (about 16 messages) is shown beside each size" in html
    assert '<option value="5">first 5, then wait (62% of about 8)</option>' in limited
    assert '<option value="10" disabled>first 10: not smaller than the plan (about 8)</option>' in shown(limited)


def test_a_canary_not_smaller_than_the_plan_is_refused_and_plans_nothing(operator: User) -> None:
    letters = many(16)
    form = {"kind": "retry", "scope": "all", "pattern": letters[0].pattern_id}
    client = client_for(operator)

    too_big = client.post("/operations/plan/", {**form, "canary_size": "50"})
    whole = client.post("/operations/plan/", {**form, "canary_size": "16"})

    assert too_big.status_code == 400 and whole.status_code == 400
    assert (
        "a canary of 50 is not smaller than the plan (16 messages): it would replay them all before watching any; "
        "choose a canary under 16, or none"
    ) in too_big.content.decode()
    assert "a canary of 16 is not smaller than the plan" in whole.content.decode()
    assert Operation.objects.count() == 0
    assert not AuditEntry.objects.filter(action="operation.retry.plan").exists()

    planned = client.post("/operations/plan/", {**form, "canary_size": "5"})

    operation = Operation.objects.get()
    assert planned.status_code == 302 and (operation.canary_size, operation.total) == (5, 16)
    detail = client.get(f"/operations/{operation.pk}/").content.decode()
    assert "5 first (31% of the plan)" in detail


def test_numbers_too_big_for_the_database_are_refused_with_a_clear_error(operator: User) -> None:
    letters = many(3)
    form = {"kind": "retry", "scope": "all", "pattern": letters[0].pattern_id}
    client = client_for(operator)

    limit = client.post("/operations/plan/", {**form, "limit": "99999999999999999999"})
    canary = client.post("/operations/plan/", {**form, "canary_size": "99999999999999999999"})

    assert limit.status_code == 400 and canary.status_code == 400
    assert "the limit must be between 1 and 1,000,000,000" in limit.content.decode()
    assert "the canary size must be at most 1,000,000" in canary.content.decode()
    assert Operation.objects.count() == 0


def _feedback(html: str) -> str:
    """The control-feedback region of a page or reply (empty when it has none)."""
    found = re.search(r'<div id="control-feedback".*?</div>', html, re.S)
    return found.group(0) if found else ""


def test_a_refused_start_says_why_in_a_region_the_polls_keep_and_keeps_the_typed_count(admin_user: User) -> None:
    letters = many(3)
    operation = plan_operation(kind="purge", filter={"pattern": [letters[0].pattern_id]}, actor=admin_user)
    client = client_for(admin_user)
    reason = "Nothing was deleted: you typed 5, but this purge deletes 3 messages. Type 3 to confirm."

    reply = client.post(f"/operations/{operation.pk}/start/", {"typed_count": "5"}, headers=HX)
    poll = client.get(f"/operations/{operation.pk}/", headers=HX)
    page = client.post(f"/operations/{operation.pk}/start/", {"typed_count": "5"})

    assert reply.status_code == 409
    body = reply.content.decode()
    # The reply's region replaces the page's (no hx-preserve); the poll's empty one is marked to keep the page's.
    assert reason in _feedback(body) and "hx-preserve" not in _feedback(body)
    polled = poll.content.decode()
    assert poll.status_code == 200 and 'hx-trigger="every 1s"' in polled
    assert _feedback(polled).startswith('<div id="control-feedback" aria-live="polite" hx-preserve>')
    assert "error-box" not in _feedback(polled)
    # The poll keeps the field the operator typed in (htmx moves the old one into the new fragment).
    assert re.search(r'<input id="typed-count-\d+"[^>]*hx-preserve', polled)
    # Without htmx, the page itself says why and keeps what was typed.
    html = page.content.decode()
    assert page.status_code == 409 and "<html" in html
    assert reason in _feedback(html) and re.search(r'<input id="typed-count-\d+"[^>]*value="5"', html)
    operation.refresh_from_db()
    assert operation.status == OperationStatus.PLANNED


def test_a_bad_rate_says_why_until_the_next_action_clears_it(operator: User) -> None:
    letters = many(2)
    operation = plan_operation(kind="retry", filter={"pattern": [letters[0].pattern_id]}, actor=operator, rate="1/1m")
    client = client_for(operator)

    refused = client.post(f"/operations/{operation.pk}/rate/", {"rate": "garbage"}, headers=HX)
    page = client.post(f"/operations/{operation.pk}/rate/", {"rate": "garbage"})
    accepted = client.post(f"/operations/{operation.pk}/rate/", {"rate": "5/1s"}, headers=HX)

    assert refused.status_code == 409
    feedback = _feedback(refused.content.decode())
    assert "hx-preserve" not in feedback and "garbage" in feedback and 'data-testid="control-error"' in feedback
    assert 'hx-preserve data-testid="rate-input"' in refused.content.decode()
    assert page.status_code == 409 and re.search(
        r'<input id="rate-\d+" name="rate" value="garbage"', shown(page.content.decode())
    )
    assert 'data-testid="control-error"' in _feedback(page.content.decode())
    # The next action that works replaces the region with an empty one.
    assert accepted.status_code == 200
    cleared = _feedback(accepted.content.decode())
    assert cleared and "hx-preserve" not in cleared and "error-box" not in cleared
    assert Operation.objects.get(pk=operation.pk).rate == "5/1s"


def test_a_conflict_is_shown_in_the_feedback_region_with_a_dismiss_link(operator: User) -> None:
    letters = many(1)
    operation = plan_operation(kind="archive", filter={"ids": [letters[0].pk]}, actor=operator)

    response = client_for(operator).post(f"/operations/{operation.pk}/resume/", headers=HX)

    assert response.status_code == 409
    feedback = _feedback(response.content.decode())
    assert "only a paused one can resume" in feedback
    assert f'href="/operations/{operation.pk}/" data-dismiss>Dismiss</a>' in feedback


def test_a_cancelled_operation_counts_done_skipped_and_not_attempted_apart(operator: User) -> None:
    letters = many(7)
    operation = plan_operation(kind="archive", filter={"pattern": [letters[0].pattern_id]}, actor=operator)
    items = list(operation.items.order_by("id"))
    OperationItem.objects.filter(pk__in=[item.pk for item in items[:2]]).update(status=ItemStatus.DONE)
    OperationItem.objects.filter(pk=items[2].pk).update(status=ItemStatus.SKIPPED, error="its status is now archived")
    OperationItem.objects.filter(pk__in=[item.pk for item in items[3:]]).update(
        status=ItemStatus.SKIPPED, error="cancelled"
    )
    Operation.objects.filter(pk=operation.pk).update(
        status=OperationStatus.CANCELLED, started_at=timezone.now(), finished_at=timezone.now(), succeeded=2, skipped=5
    )
    client = client_for(operator)

    page = client.get(f"/operations/{operation.pk}/").content.decode()
    fragment = client.get(f"/operations/{operation.pk}/", headers=HX).content.decode()
    listing = client.get("/operations/").content.decode()

    for html in (page, fragment):
        assert '<span class="progress-label" data-testid="progress-label">29% archived</span>' in html
        assert 'aria-valuenow="29"' in html and "100%" not in html
        assert (
            '<dd data-testid="figures"><strong>2</strong> archived, 0 failed, 1 skipped, '
            "4 not attempted (cancelled) — of 7</dd>"
        ) in shown(html)
        # The bar: 2 of 7 done, then the one skipped; the four never attempted stay empty.
        assert re.findall(r'<span class="(\w+)" style="left: ([\d.]+)%; width: ([\d.]+)%"', html) == [
            ("done", "0.0", "28.57"),
            ("skipped", "28.57", "14.29"),
        ]
    assert "2 / 7" in listing and "7 / 7" not in listing
    assert "5 skipped or not attempted" in listing


def test_an_archive_that_archived_nothing_does_not_say_done_one_of_one(operator: User) -> None:
    letters = many(1)
    operation = plan_operation(kind="archive", filter={"ids": [letters[0].pk]}, actor=operator)
    DeadLetter.objects.filter(pk=letters[0].pk).update(status=DeadLetterStatus.ARCHIVED)
    Operation.objects.filter(pk=operation.pk).update(status=OperationStatus.RUNNING, started_at=timezone.now())
    run_operation(operation_id=operation.pk)
    client = client_for(operator)

    page = client.get(f"/operations/{operation.pk}/").content.decode()
    fragment = client.get(f"/operations/{operation.pk}/", headers=HX)
    listing = client.get("/operations/", headers=HX).content.decode()

    operation.refresh_from_db()
    assert (operation.status, operation.succeeded, operation.skipped) == (OperationStatus.DONE, 0, 1)
    assert fragment.status_code == 286
    for html in (page, fragment.content.decode()):
        assert 'data-testid="status">Done: nothing archived, 1 skipped</span>' in html
        assert "0% archived" in html and 'aria-valuenow="0"' in html
        assert "<strong>0</strong> archived, 0 failed, 1 skipped — of 1" in shown(html)
    assert "0 / 1" in listing and "1 / 1" not in listing
    assert "Done: nothing archived, 1 skipped" in listing


def test_wording_paused_by_a_person_no_return_figures_before_publishing_and_an_old_error_as_history(
    operator: User,
) -> None:
    letters = many(2)
    plan = plan_operation(kind="retry", filter={"ids": [letters[0].pk]}, actor=operator)
    paused = plan_operation(kind="retry", filter={"ids": [letters[1].pk]}, actor=operator)
    Operation.objects.filter(pk=paused.pk).update(
        status=OperationStatus.PAUSED,
        started_at=timezone.now(),
        pause_reason="paused by otto-operator",
        succeeded=1,
        last_error="1 came back to a dead-letter queue",
    )
    client = client_for(operator)

    plan_page = client.get(f"/operations/{plan.pk}/").content.decode()
    paused_page = client.get(f"/operations/{paused.pk}/", headers=HX).content.decode()
    client.post(f"/operations/{paused.pk}/resume/")
    resumed_page = client.get(f"/operations/{paused.pk}/", headers=HX).content.decode()
    client.post(f"/operations/{plan.pk}/cancel/")
    discarded_page = client.get(f"/operations/{plan.pk}/").content.decode()

    assert "Came back" not in plan_page and "Came back" not in discarded_page
    assert 'data-testid="status">Paused</span></span>' not in paused_page
    assert '<span class="small" data-testid="pause-reason">by otto-operator</span>' in paused_page
    assert "paused by otto-operator" not in paused_page and "Came back" in paused_page
    assert "<dt>Last error</dt>" in paused_page
    # The pause's error leaves the page on resume and is kept in the resume's audit row.
    assert "<dt>Last error</dt>" not in resumed_page and "1 came back to a dead-letter queue" not in resumed_page
    resume_row = AuditEntry.objects.get(action="operation.resume", target=f"operation:{paused.pk}")
    assert resume_row.detail.endswith("; the error before the resume: 1 came back to a dead-letter queue")
    assert " 1 messages" not in plan_page + paused_page + resumed_page + discarded_page


def test_an_old_plan_says_its_age_offers_a_fresh_plan_and_starts_only_when_confirmed(
    operator: User, celery_queue: str, django_capture_on_commit_callbacks
) -> None:
    letters = many(2)
    operation = plan_operation(kind="archive", filter={"pattern": [letters[0].pattern_id]}, actor=operator)
    Operation.objects.filter(pk=operation.pk).update(created_at=timezone.now() - dt.timedelta(minutes=16))
    client = client_for(operator)

    page = client.get(f"/operations/{operation.pk}/").content.decode()
    fragment = client.get(f"/operations/{operation.pk}/", headers=HX).content.decode()
    unconfirmed = client.post(f"/operations/{operation.pk}/start/", headers=HX)

    for html in (page, fragment):
        assert "Planned 16\xa0minutes ago: dead letters that arrived since are not in it;" in shown(html)
        assert 'name="stale_confirmed" value="yes" required' in html
    replan = re.search(r'<a href="([^"]+)">plan again</a>', page)
    assert replan is not None
    again = client.get(replan.group(1).replace("&amp;", "&"))
    assert again.status_code == 200 and f'<dd class="mono">{letters[0].pattern_id}</dd>' in again.content.decode()
    assert unconfirmed.status_code == 409
    assert "this plan was made 16 minutes ago" in _feedback(unconfirmed.content.decode())
    assert Operation.objects.get(pk=operation.pk).status == OperationStatus.PLANNED

    with django_capture_on_commit_callbacks(execute=True) as started:
        confirmed = client.post(f"/operations/{operation.pk}/start/", {"stale_confirmed": "yes"}, headers=HX)

    assert confirmed.status_code == 200 and len(started) == 1
    assert Operation.objects.get(pk=operation.pk).status == OperationStatus.RUNNING


def test_a_fresh_plan_starts_without_the_age_check_and_plans_are_listed_as_plans(operator: User) -> None:
    letters = many(1)
    operation = plan_operation(kind="archive", filter={"ids": [letters[0].pk]}, actor=operator)
    client = client_for(operator)

    page = client.get(f"/operations/{operation.pk}/").content.decode()
    listing = client.get("/operations/").content.decode()
    fragment = client.get("/operations/", headers=HX).content.decode()

    assert "Planned less than a minute ago" in page and "stale_confirmed" not in page
    assert "Discard the plan" in page
    for html in (listing, fragment):
        assert '<span class="chip st-planned" data-testid="plan">Plan, not started</span>' in html


def test_the_operation_page_prints_no_template_comment(operator: User) -> None:
    letters = many(1)
    operation = plan_operation(kind="archive", filter={"ids": [letters[0].pk]}, actor=operator)

    html = client_for(operator).get(f"/operations/{operation.pk}/").content.decode()

    assert "{#" not in html and "hx-preserve, so htmx keeps" not in html


def test_a_plan_that_holds_no_dead_letter_cannot_be_started(
    operator: User, celery_queue: str, django_capture_on_commit_callbacks
) -> None:
    # A replayed message, ticked on the messages page (which lists replayed ones) and sent to Retry: a retry does
    # not act on it unless the filter asks for its status, so the plan holds nothing.
    (replayed,) = many(1)
    DeadLetter.objects.filter(pk=replayed.pk).update(status=DeadLetterStatus.REPLAYED)
    operation = plan_operation(kind="retry", filter={"ids": [replayed.pk]}, actor=operator)
    assert operation.total == 0
    client = client_for(operator)

    html = client.get(f"/operations/{operation.pk}/").content.decode()
    with django_capture_on_commit_callbacks(execute=True) as enqueued:
        started = client.post(f"/operations/{operation.pk}/start/", headers=HX)

    assert "Nothing to do: none of the dead letters chosen is in a state a retry acts on." in html
    assert re.search(
        r'<button type="submit" class="primary" disabled title="The plan holds no dead letter">', shown(html)
    )
    assert started.status_code == 409
    assert "Nothing was started: the plan holds no dead letter" in _feedback(started.content.decode())
    assert enqueued == []
    operation.refresh_from_db()
    assert (operation.status, operation.started_at) == (OperationStatus.PLANNED, None)


def test_the_list_refreshes_itself_only_while_a_worker_moves_an_operation_on(operator: User) -> None:
    letters = many(2)
    operation = plan_operation(kind="retry", filter={"ids": [letter.pk for letter in letters]}, actor=operator)
    client = client_for(operator)

    planned_only = client.get("/operations/").content.decode()
    Operation.objects.filter(pk=operation.pk).update(status=OperationStatus.RUNNING)
    running = client.get("/operations/").content.decode()

    assert "still running" not in planned_only and 'hx-trigger="every 2s"' not in planned_only
    assert "still running" in running
