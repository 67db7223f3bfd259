"""Retry one message from its page: one button (and its confirm dialog), one POST that plans and starts a retry
of just that message, for operators only, once per submission token."""

from __future__ import annotations

import html as html_lib
import re
import threading
from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from django.contrib.messages import get_messages
from django.db import connection as db_connection
from pika.adapters.blocking_connection import BlockingChannel as Channel

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.deadletters.models import DeadLetter, DeadLetterStatus
from dlqconsole.deadletters.templatetags.charts import stamp, stamp_time
from dlqconsole.operations.models import Operation, OperationKind, OperationStatus
from dlqconsole.operations.services import run_operation
from tests.conftest import client_for
from tests.factories import EnvelopeFactory, store
from tests.support import declare_with_dlq, drain, ingest_from, kill_on_broker, wait_for_depth

pytestmark = [pytest.mark.django_db]

SUBMISSION = "7" * 32


def shown(html: str) -> str:
    """The page with each run of spaces and line breaks as one space, as a browser reads it: the templates break
    their long lines wherever HTML allows."""
    return re.sub(r"[ \n]+", " ", html)


def retry_form(page: str) -> dict[str, str]:
    """The Retry form of a message page: its action, confirm text and hidden fields."""
    found = re.search(r'<form method="post" action="([^"]+)" data-confirm="([^"]*)">(.*?)</form>', page, re.S)
    assert found, "no Retry form on the page"
    fields = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', found.group(3)))
    return {"action": found.group(1), "confirm": html_lib.unescape(found.group(2)), **fields}


def test_message_page_offers_retry_as_a_button_naming_the_destination(operator: User) -> None:
    (stored,) = store(EnvelopeFactory.build(exchange="shop", routing_key="orders.created"))

    page = client_for(operator).get(f"/messages/{stored.pk}/").content.decode()

    form = retry_form(page)
    assert form["action"] == f"/operations/retry-message/{stored.pk}/"
    assert form["confirm"] == f"Retry dead letter #{stored.pk}: publish it again to exchange shop / orders.created?"
    assert re.fullmatch(r"[0-9a-f]{32}", form["submission"]) and form["status"] == "parked"
    assert "csrfmiddlewaretoken" in form
    # Retry no longer goes through the plan page; move, archive and purge still do.
    assert "kind=retry" not in page
    assert f"kind=move&amp;ids={stored.pk}" in page and f"kind=archive&amp;ids={stored.pk}" in page


def test_retry_plans_and_starts_an_operation_for_the_one_message(
    operator: User, celery_queue: str, django_capture_on_commit_callbacks
) -> None:
    stored, other = store(EnvelopeFactory.build(), EnvelopeFactory.build())

    with django_capture_on_commit_callbacks(execute=True) as enqueued:
        response = client_for(operator).post(
            f"/operations/retry-message/{stored.pk}/", {"submission": SUBMISSION, "status": "parked"}
        )

    operation = Operation.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/operations/{operation.pk}/"
    assert operation.kind == OperationKind.RETRY and operation.status == OperationStatus.RUNNING
    assert operation.created_by == operator
    assert list(operation.items.values_list("dead_letter_id", flat=True)) == [stored.pk]
    assert operation.filter == {"ids": [stored.pk], "status": ["parked"]}
    assert len(enqueued) == 1
    audit = AuditEntry.objects.get(action="deadletter.retry")
    assert audit.target == f"deadletter:{stored.pk}" and audit.actor == operator and audit.count == 1
    assert audit.detail == f"operation {operation.pk}"
    assert operation.submission and SUBMISSION not in operation.submission  # a digest of the token and the id
    assert {"operation.retry.plan", "operation.retry.start"} <= set(AuditEntry.objects.values_list("action", flat=True))
    assert DeadLetter.objects.get(pk=other.pk).status == DeadLetterStatus.PARKED


@pytest.mark.sqlite
def test_the_same_retry_sent_twice_starts_one_operation(
    operator: User, celery_queue: str, django_capture_on_commit_callbacks
) -> None:
    (stored,) = store(EnvelopeFactory.build())
    form = {"submission": SUBMISSION, "status": "parked"}

    with django_capture_on_commit_callbacks(execute=True) as enqueued:
        first = client_for(operator).post(f"/operations/retry-message/{stored.pk}/", form)
    with django_capture_on_commit_callbacks(execute=True) as enqueued_again:
        again = client_for(operator).post(f"/operations/retry-message/{stored.pk}/", form)

    assert first.status_code == 302 and again.status_code == 302
    assert again["Location"] == first["Location"]
    assert Operation.objects.count() == 1
    assert len(enqueued) == 1 and enqueued_again == []
    assert AuditEntry.objects.filter(action="deadletter.retry").count() == 1


def test_a_new_page_load_may_retry_again(operator: User, celery_queue: str) -> None:
    (stored,) = store(EnvelopeFactory.build())
    client = client_for(operator)

    client.post(f"/operations/retry-message/{stored.pk}/", {"submission": SUBMISSION, "status": "parked"})
    client.post(f"/operations/retry-message/{stored.pk}/", {"submission": "8" * 32, "status": "parked"})

    assert Operation.objects.count() == 2


@pytest.mark.django_db(transaction=True)
def test_a_double_click_racing_itself_starts_one_operation(operator: User, celery_queue: str) -> None:
    """Two requests with one token at once: the second waits on the message's row lock, then finds the
    operation of the first."""
    (stored,) = store(EnvelopeFactory.build())
    start = threading.Barrier(2)
    locations: list[str] = []
    errors: list[BaseException] = []

    def send() -> None:
        try:
            client = client_for(operator)
            start.wait()
            response = client.post(
                f"/operations/retry-message/{stored.pk}/", {"submission": SUBMISSION, "status": "parked"}
            )
            locations.append(response["Location"])
        except BaseException as error:  # noqa: BLE001  (reported by the assertion below)
            errors.append(error)
        finally:
            db_connection.close()

    threads = [threading.Thread(target=send) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert errors == []
    operation = Operation.objects.get()
    assert locations == [f"/operations/{operation.pk}/"] * 2
    assert AuditEntry.objects.filter(action="deadletter.retry").count() == 1


@pytest.mark.sqlite
def test_viewer_cannot_retry(viewer: User, celery_queue: str) -> None:
    (stored,) = store(EnvelopeFactory.build())

    response = client_for(viewer).post(
        f"/operations/retry-message/{stored.pk}/", {"submission": SUBMISSION, "status": "parked"}
    )

    assert response.status_code == 403
    assert Operation.objects.count() == 0
    assert not AuditEntry.objects.exists()
    assert DeadLetter.objects.get(pk=stored.pk).status == DeadLetterStatus.PARKED


def test_retry_needs_the_csrf_token(operator: User) -> None:
    (stored,) = store(EnvelopeFactory.build())

    response = client_for(operator, enforce_csrf_checks=True).post(
        f"/operations/retry-message/{stored.pk}/", {"submission": SUBMISSION, "status": "parked"}
    )

    assert response.status_code == 403
    assert Operation.objects.count() == 0


def test_retry_is_a_post_with_a_submission_token(operator: User) -> None:
    (stored,) = store(EnvelopeFactory.build())
    client = client_for(operator)

    assert client.get(f"/operations/retry-message/{stored.pk}/").status_code == 405
    assert client.post(f"/operations/retry-message/{stored.pk}/", {"status": "parked"}).status_code == 400
    assert client.post(f"/operations/retry-message/{stored.pk + 1000}/", {"submission": SUBMISSION}).status_code == 404
    assert Operation.objects.count() == 0


def test_a_message_that_changed_since_the_page_was_loaded_is_not_retried(operator: User) -> None:
    (stored,) = store(EnvelopeFactory.build())
    DeadLetter.objects.filter(pk=stored.pk).update(status=DeadLetterStatus.REPLAYED)

    response = client_for(operator).post(
        f"/operations/retry-message/{stored.pk}/", {"submission": SUBMISSION, "status": "parked"}
    )

    assert response.status_code == 302 and response["Location"] == f"/messages/{stored.pk}/"
    assert Operation.objects.count() == 0
    (warning,) = [str(message) for message in get_messages(response.wsgi_request)]
    assert "is replayed now" in warning and "nothing was retried" in warning


def test_a_message_a_retry_cannot_take_is_refused_with_the_reason(operator: User) -> None:
    (stored,) = store(EnvelopeFactory.build())
    DeadLetter.objects.filter(pk=stored.pk).update(status=DeadLetterStatus.ARCHIVED)

    response = client_for(operator).post(
        f"/operations/retry-message/{stored.pk}/", {"submission": SUBMISSION, "status": "archived"}
    )

    assert response["Location"] == f"/messages/{stored.pk}/"
    assert Operation.objects.count() == 0
    (error,) = [str(message) for message in get_messages(response.wsgi_request)]
    assert error.startswith(f"Dead letter #{stored.pk}: nothing was retried; a retry cannot act on")
    page = client_for(operator).get(f"/messages/{stored.pk}/").content.decode()
    assert "/operations/retry-message/" not in page and "kind=restore" in page


def test_a_message_with_nowhere_to_go_offers_no_retry(operator: User) -> None:
    (stored,) = store(EnvelopeFactory.build())
    DeadLetter.objects.filter(pk=stored.pk).update(original_exchange="", original_routing_keys=[], original_queue="")

    page = client_for(operator).get(f"/messages/{stored.pk}/").content.decode()

    assert "/operations/retry-message/" not in page
    assert "No retry: its x-death names no queue, exchange or routing key" in page


def test_a_replayed_message_warns_before_it_is_retried_again(
    channel: Channel, queue_name: Callable[[str], str], operator: User
) -> None:
    orders = queue_name("orders")
    declare_with_dlq(channel, orders)
    channel.basic_publish(exchange="", routing_key=orders, body=b'{"order": 5}')
    kill_on_broker(channel, orders, 1)
    wait_for_depth(channel, orders + ".dlq", 1)
    (stored,) = ingest_from(channel, orders + ".dlq")
    client = client_for(operator)
    first = retry_form(client.get(f"/messages/{stored.pk}/").content.decode())
    assert first["confirm"] == f"Retry dead letter #{stored.pk}: publish it again to queue {orders}?"
    client.post(first["action"], {"submission": first["submission"], "status": first["status"]})
    operation = Operation.objects.get()
    run_operation(operation_id=operation.pk)
    assert [body for _, body in drain(channel, orders)] == [b'{"order": 5}']
    published_at = operation.items.get().published_at

    page = client.get(f"/messages/{stored.pk}/").content.decode()

    assert DeadLetter.objects.get(pk=stored.pk).status == DeadLetterStatus.REPLAYED
    assert (
        f"Already replayed at {stamp_time(published_at)} by operation "
        f'<a href="/operations/{operation.pk}/">#{operation.pk}</a>; retrying sends it again.'
    ) in shown(page)
    again = retry_form(page)
    assert again["confirm"] == (
        f"Already replayed at {stamp(published_at)} by operation #{operation.pk}; retrying sends it again.\n\n"
        f"Retry dead letter #{stored.pk}: publish it again to queue {orders}?"
    )
    # Retrying it again is the operator's choice, made knowingly: it is sent again.
    client.post(again["action"], {"submission": again["submission"], "status": again["status"]})
    second = Operation.objects.exclude(pk=operation.pk).get()
    assert second.total == 1 and second.filter == {"ids": [stored.pk], "status": ["replayed"]}


def test_a_message_marked_replayed_without_an_operation_at_hand_still_warns(operator: User) -> None:
    (stored,) = store(EnvelopeFactory.build())
    DeadLetter.objects.filter(pk=stored.pk).update(status=DeadLetterStatus.REPLAYED, replay_count=2)
    stored.refresh_from_db()

    page = client_for(operator).get(f"/messages/{stored.pk}/").content.decode()

    assert f"Already replayed at {stamp_time(stored.status_changed_at)}; retrying sends it again." in page
    assert retry_form(page)["confirm"].startswith(
        f"Already replayed at {stamp(stored.status_changed_at)}; retrying sends it again."
    )


def test_a_boomerang_says_it_died_again_after_its_replay_not_that_it_was_replayed(operator: User) -> None:
    first, copy = store(EnvelopeFactory.build(), EnvelopeFactory.build())
    DeadLetter.objects.filter(pk=copy.pk).update(replay_count=1, previous=first)

    page = client_for(operator).get(f"/messages/{copy.pk}/").content.decode()

    assert "Already replayed" not in page
    assert (
        f'This message died again after 1 replay of <a href="/messages/{first.pk}/">#{first.pk}</a>; '
        "retrying sends it once more." in shown(page)
    )
    assert retry_form(page)["confirm"].startswith(
        f"This message died again after 1 replay of #{first.pk}; retrying sends it once more."
    )


def test_a_parked_message_never_replayed_has_no_warning(operator: User) -> None:
    (stored,) = store(EnvelopeFactory.build())

    page = client_for(operator).get(f"/messages/{stored.pk}/").content.decode()

    assert "Already replayed" not in page and 'data-testid="sent-warning"' not in page


def test_viewer_sees_no_action_buttons_on_a_replayed_message(viewer: User) -> None:
    (stored,) = store(EnvelopeFactory.build())
    DeadLetter.objects.filter(pk=stored.pk).update(status=DeadLetterStatus.REPLAYED, replay_count=1)

    page = client_for(viewer).get(f"/messages/{stored.pk}/").content.decode()

    assert "/operations/retry-message/" not in page and "Already replayed" not in page
    assert "/operations/plan/" not in page and "/edit/" not in page and "<button" not in page.split("<main")[-1]
