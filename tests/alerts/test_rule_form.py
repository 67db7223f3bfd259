"""The rule form: durations written as 5m or 1h, the fields each kind needs (and the others ignored), clear errors,
a warning for a queue nobody knows, and a page grouped in sections that works without JavaScript."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.alerts.forms import RuleForm
from dlqconsole.alerts.models import AlertRule
from dlqconsole.core.durations import format_duration, parse_duration
from dlqconsole.ingest.models import WatchedQueue
from tests.factories import parked

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]


def post(**fields: Any) -> dict[str, Any]:
    """A rule form submission: a name and kind, the rest as given (nothing else is needed)."""
    return {"name": "test rule", "severity": "warning", "enabled": "on", **fields}


def saved(data: dict[str, Any]) -> AlertRule:
    form = RuleForm(data, instance=AlertRule())
    assert form.is_valid(), form.errors
    return form.save()


def errors(data: dict[str, Any]) -> dict[str, list[str]]:
    form = RuleForm(data, instance=AlertRule())
    assert not form.is_valid()
    return {name: [str(message) for message in messages] for name, messages in form.errors.items()}


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), ("90s", 90), ("5m", 300), ("5 min", 300), ("1h30m", 5400), ("1h 30m", 5400), ("2d", 172800)],
)
def test_durations_are_parsed(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "m5", "5 parsecs", "1.5h", "-5m"])
def test_bad_durations_say_how_to_write_them(text: str) -> None:
    with pytest.raises(ValueError, match=r"duration|unit"):
        parse_duration(text)


def test_durations_are_shown_the_short_way() -> None:
    assert [format_duration(value) for value in (0, 45, 300, 5400, 86400, 90061)] == [
        "0",
        "45s",
        "5m",
        "1h30m",
        "1d",
        "1d1h1m1s",
    ]


def test_not_empty_rule_takes_durations_and_ignores_the_window() -> None:
    rule = saved(
        post(
            kind="dlq_not_empty",
            threshold="",
            window_seconds="3h",
            for_seconds="2m",
            cooldown_seconds="10m",
            reminder_seconds="4h",
        )
    )

    assert (rule.threshold, rule.effective_threshold) == (None, 0)
    assert (rule.for_seconds, rule.cooldown_seconds, rule.reminder_seconds) == (120, 600, 14400)
    assert rule.window_seconds == 60  # the model's own value: the window does not matter for this kind


def test_empty_optional_durations_mean_zero() -> None:
    rule = saved(post(kind="dlq_not_empty", for_seconds="", cooldown_seconds="", reminder_seconds=""))

    assert (rule.for_seconds, rule.cooldown_seconds, rule.reminder_seconds) == (0, 0, 0)


def test_growth_rule_needs_a_threshold_and_a_window() -> None:
    found = errors(post(kind="dlq_growth", threshold="", window_seconds=""))

    assert found["threshold"] == ["Required: how many new dead letters within the window make an alert."]
    assert found["window_seconds"] == ["Required for this kind, e.g. 1m or 1h."]
    rule = saved(post(kind="dlq_growth", threshold="100", window_seconds="2m"))
    assert (rule.threshold, rule.window_seconds) == (100, 120)


def test_bad_duration_is_a_clear_field_error() -> None:
    found = errors(post(kind="dlq_growth", threshold="5", window_seconds="5 parsecs"))

    assert found == {"window_seconds": ["“parsecs” is not a unit: use s, m, h, d or w."]}


def test_depth_rule_threshold_is_optional_but_not_zero() -> None:
    assert saved(post(kind="queue_depth", threshold="")).threshold is None
    assert "At least 1" in errors(post(kind="queue_depth", threshold="0"))["threshold"][0]


def test_pattern_rules_ignore_threshold_and_pattern_and_need_a_window() -> None:
    letters = parked(1)

    assert errors(post(kind="new_pattern", window_seconds=""))["window_seconds"]
    rule = saved(post(kind="pattern_reopened", threshold="5", pattern=str(letters[0].pattern_id), window_seconds="1h"))
    assert (rule.threshold, rule.pattern_id, rule.window_seconds) == (None, None, 3600)


def test_oldest_age_rule_takes_the_age_as_a_duration() -> None:
    assert errors(post(kind="oldest_age", age=""))["age"] == [
        "Required: how long the oldest dead letter may wait, e.g. 1d."
    ]
    rule = saved(post(kind="oldest_age", age="6h", threshold="3"))
    assert rule.threshold == 6 * 3600

    form = RuleForm(instance=rule)
    assert 'value="6h"' in str(form["age"])
    assert form["threshold"].value() is None  # the count threshold is not the age


def test_operation_paused_rule_ignores_every_kind_specific_field_even_nonsense() -> None:
    rule = saved(post(kind="operation_paused", threshold="-4", age="soon", window_seconds="x", pattern="abc"))

    assert (rule.threshold, rule.pattern_id, rule.window_seconds) == (None, None, 60)


def test_queue_and_pattern_together_are_refused_where_a_pattern_counts() -> None:
    letters = parked(1)

    found = errors(post(kind="dlq_not_empty", queue="orders.dlq", pattern=str(letters[0].pattern_id)))

    assert found == {"queue": ["Choose a queue or a pattern, not both."]}


@pytest.mark.parametrize("value", ["999999", "-1", "abc"])
def test_a_pattern_id_that_names_no_pattern_says_so(value: str) -> None:
    found = errors(post(kind="dlq_not_empty", pattern=value))

    assert found == {
        "pattern": [
            "No such pattern (or it was merged into another): type the number of a pattern listed on the patterns page."
        ]
    }


def test_unknown_queue_is_a_warning_not_an_error() -> None:
    parked(1, queue="orders.dlq")
    WatchedQueue.objects.create(name="payments", dead_letter_queue="payments.dlq", dead_letter_exchange="payments.dlx")

    known = [
        RuleForm(post(kind="dlq_not_empty", queue=name), instance=AlertRule()) for name in ("orders.dlq", "payments")
    ]
    typo = RuleForm(post(kind="dlq_not_empty", queue="ordres.dlq"), instance=AlertRule())
    depth_of_unwatched = RuleForm(post(kind="queue_depth", queue="orders.dlq"), instance=AlertRule())

    assert all(form.is_valid() and form.warnings == [] for form in known)
    assert typo.is_valid() and "No queue named “ordres.dlq”" in typo.warnings[0]
    assert depth_of_unwatched.is_valid() and "only sampled for watched queues" in depth_of_unwatched.warnings[0]


def test_saving_a_rule_with_an_unknown_queue_warns_after_saving(client: Client, admin_user: User) -> None:
    client.force_login(admin_user)

    response = client.post(reverse("alerts:rule-new"), post(kind="dlq_not_empty", queue="nowhere.dlq"), follow=True)

    assert response.redirect_chain == [(reverse("alerts:rules"), 302)]
    html = response.content.decode()
    assert "Rule “test rule” saved." in html and "No queue named “nowhere.dlq”" in html
    assert AuditEntry.objects.filter(action="alerts.rule.create").exists()


def test_invalid_rule_is_shown_again_with_its_errors(client: Client, admin_user: User) -> None:
    client.force_login(admin_user)

    response = client.post(reverse("alerts:rule-new"), post(kind="dlq_growth", threshold="", window_seconds="1m"))

    assert response.status_code == 400
    html = response.content.decode()
    assert "Required: how many new dead letters" in html
    # The fields the posted kind ignored are shown again, usable for whichever kind is chosen next.
    assert 'name="age"' in html and 'name="age" disabled' not in html
    assert not AlertRule.objects.filter(name="test rule").exists()


def test_rule_form_page_is_grouped_and_marks_each_field_with_its_kinds(client: Client, admin_user: User) -> None:
    parked(1, queue="orders.dlq")
    client.force_login(admin_user)

    html = client.get(reverse("alerts:rule-new")).content.decode()

    for legend in ("What", "Scope", "When", "Who to tell"):
        assert f"<legend>{legend}</legend>" in html
    assert 'data-kinds="dlq_growth new_pattern pattern_reopened"' in html  # the window
    assert 'data-kinds="oldest_age"' in html  # the age
    assert '<option value="orders.dlq">' in html  # known queues offered for the scope
    assert '<script id="rule-kind-defaults" type="application/json">' in html
    assert 'src="/static/js/alerts.js"' in html
    assert 'value="5m"' in html and 'value="4h"' in html  # cooldown and reminder as durations


def test_new_rule_of_a_chosen_kind_starts_from_its_defaults(client: Client, admin_user: User) -> None:
    client.force_login(admin_user)

    html = client.get(reverse("alerts:rule-new") + "?kind=dlq_growth").content.decode()

    assert '<option value="dlq_growth" selected>' in html
    assert 'name="threshold" value="100"' in html and 'name="window_seconds" value="1m"' in html


def test_existing_rule_shows_its_durations(client: Client, admin_user: User) -> None:
    rule = AlertRule.objects.get(name="New failure pattern")  # a default rule, window 3600 s
    client.force_login(admin_user)

    html = client.get(reverse("alerts:rule", args=[rule.pk])).content.decode()

    assert 'name="window_seconds" value="1h"' in html


@pytest.mark.parametrize(
    ("kind", "field", "value", "message"),
    [
        ("dlq_growth", "threshold", "99999999999999999999999", "At most 1,000,000,000 messages (no queue holds more)."),
        ("dlq_not_empty", "threshold", "1000000001", "At most 1,000,000,000 messages (no queue holds more)."),
        ("dlq_not_empty", "threshold", "-1", "At least 0."),
        ("dlq_growth", "window_seconds", "99999999999999999999999", "At most a year."),
        ("dlq_not_empty", "for_seconds", "400d", "At most a year."),
        ("dlq_not_empty", "cooldown_seconds", "99999999999999999999999", "At most a year."),
        ("dlq_not_empty", "reminder_seconds", "53w", "At most a year."),
        ("oldest_age", "age", "99999999999999999999999", "At most a year."),
    ],
)
def test_rule_numbers_out_of_range_are_clear_field_errors(kind: str, field: str, value: str, message: str) -> None:
    data = post(kind=kind, **{"threshold": "10", "window_seconds": "1m", "age": "1d", field: value})

    assert errors(data) == {field: [message]}


def test_the_largest_threshold_is_stored_as_typed() -> None:
    assert saved(post(kind="dlq_growth", threshold="1000000000", window_seconds="1m")).threshold == 1_000_000_000


def test_a_huge_threshold_on_the_page_stores_nothing(client: Client, admin_user: User) -> None:
    client.force_login(admin_user)
    before = AlertRule.objects.count()

    response = client.post(
        reverse("alerts:rule-new"), post(kind="dlq_growth", threshold="99999999999999999999999", window_seconds="1m")
    )

    assert response.status_code == 400
    assert "At most 1,000,000,000 messages" in response.content.decode()
    assert AlertRule.objects.count() == before


def test_a_pattern_id_beyond_any_row_is_a_field_error_not_a_server_error() -> None:
    found = errors(post(kind="dlq_not_empty", pattern="99999999999999999999999"))

    assert list(found) == ["pattern"]


def test_the_admin_refuses_a_rule_threshold_out_of_range(db: None) -> None:
    root = User.objects.create_superuser("root", password="pw-root")
    client = Client()
    client.force_login(root)
    rule = AlertRule.objects.get(name="Dead letters waiting")

    response = client.post(
        reverse("admin:alerts_alertrule_change", args=[rule.pk]),
        {
            "name": rule.name,
            "kind": rule.kind,
            "threshold": "99999999999999999999999",
            "window_seconds": "99999999999",
            "for_seconds": "0",
            "severity": rule.severity,
            "cooldown_seconds": "300",
            "reminder_seconds": "3600",
            "created_at_0": "2026-01-01",
            "created_at_1": "00:00:00",
        },
    )

    assert response.status_code == 200
    page = response.content.decode()
    assert "less than or equal to 1000000000" in page and "less than or equal to 31622400" in page
    rule.refresh_from_db()
    assert rule.threshold is None or rule.threshold < 1e9
