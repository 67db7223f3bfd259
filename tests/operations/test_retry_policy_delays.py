"""A retry policy's delay far in the future overflowed the next retry's date and failed the scheduler on every beat,
for every policy: the admin form refuses it and the scheduler never goes past a year."""

from __future__ import annotations

import datetime as dt

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from dlqconsole.deadletters.models import DeadLetter
from dlqconsole.operations.models import MAX_RETRY_DELAY_SECONDS, RetryPolicy
from dlqconsole.operations.policies import schedule_new_dead_letters
from tests.factories import synthetic_dead_letters

pytestmark = pytest.mark.django_db


def test_the_admin_refuses_a_delay_beyond_a_year(client: Client) -> None:
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw-root"))

    response = client.post(
        reverse("admin:operations_retrypolicy_add"),
        {"name": "x", "delays": "60, 99999999999999", "max_attempts": "3", "rate": ""},
    )

    assert response.status_code == 200
    assert "at most" in response.content.decode()
    assert not RetryPolicy.objects.exists()


def test_a_stored_huge_delay_schedules_a_year_ahead_instead_of_failing() -> None:
    RetryPolicy.objects.create(name="far", delays=[10**15])
    now = timezone.now()
    (pk,) = synthetic_dead_letters(queue="far", count=1, now=now - dt.timedelta(minutes=5))

    assert schedule_new_dead_letters(now=now) == 1

    assert DeadLetter.objects.get(pk=pk).next_retry_at == now + dt.timedelta(seconds=MAX_RETRY_DELAY_SECONDS)
