"""The migration that gives every queue-named table a broker, from the schema before brokers, with rows in every
table of the console: nothing lost, every row on the broker default, counters and keys as they were."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.apps import apps as current_apps
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from dlqconsole.brokers import migration_ops

BEFORE = [
    ("accounts", "0003_audit_target_and_filter_indexes"),
    ("deadletters", "0015_identical_copies_and_cut_bodies"),
    ("ingest", "0003_ingeststat"),
    ("operations", "0007_purged_dead_letter"),
    ("alerts", "0007_webhook_signing"),
]
APPS = ("accounts", "deadletters", "ingest", "operations", "alerts")


def fill(old: Any) -> None:
    """At least one row in every table of the console's apps; five dead letters (the backfill's batch is two)."""
    now = timezone.now().replace(microsecond=0)

    def model(label: str) -> Any:
        app, name = label.split(".")
        return old.get_model(app, name)

    user = old.get_model("auth", "User").objects.create(username="ada")
    audit = model("accounts.AuditEntry").objects.create(action="operation.start", actor=user, actor_name="ada")
    pattern = model("deadletters.FailurePattern").objects.create(key="p1", template="Timed out after <NUM>ms")
    for number in range(5):
        model("deadletters.DeadLetter").objects.create(
            dedupe_key=f"k{number}",
            source_queue="orders.dlq",
            body=b"{}",
            fingerprint="f1",
            pattern=pattern,
            status="parked",
        )
    model("deadletters.DeadLetterCount").objects.create(
        source_queue="orders.dlq", pattern=pattern, failure_reason="TIMEOUT", status="parked", count=5
    )
    model("deadletters.ArrivalCount").objects.create(minute=now.replace(second=0), source_queue="orders.dlq", count=5)
    model("deadletters.PatternArrivalCount").objects.create(pattern=pattern, hour=now.replace(minute=0, second=0))
    model("deadletters.PatternEvent").objects.create(pattern=pattern, kind="created")
    model("deadletters.PatternCluster").objects.create(key="c1", failure_reason="TIMEOUT")
    model("deadletters.Fingerprint").objects.create(key="f1", template="Timed out after <NUM>ms", pattern=pattern)
    model("deadletters.FingerprintRule").objects.create(name="orders", regex="order")
    model("ingest.WatchedQueue").objects.create(
        name="orders", dead_letter_queue="orders.dlq", dead_letter_exchange="orders.dlx"
    )
    for minutes in range(3):
        model("ingest.QueueSample").objects.create(
            queue="orders", messages=minutes, consumers=1, sampled_at=now - dt.timedelta(minutes=minutes)
        )
    model("ingest.IngestStat").objects.create(source_queue="orders.dlq", received=5, inserted=5)
    operation = model("operations.Operation").objects.create(kind="purge", filter={"queue": ["orders.dlq"]})
    model("operations.OperationItem").objects.create(operation=operation, dead_letter_id=1)
    model("operations.PurgedDeadLetter").objects.create(
        operation=operation,
        audit_entry=audit,
        dead_letter_id=99,
        dedupe_key="k99",
        source_queue="orders.dlq",
        status="parked",
        ingested_at=now,
    )
    model("operations.RetryPolicy").objects.create(name="timeouts", queue="orders.dlq")
    model("operations.SchedulerCursor").objects.create(name="retry-policies")
    channel = model("alerts.Channel").objects.create(name="ops", kind="webhook", target="https://hooks.example/x")
    rule = model("alerts.AlertRule").objects.create(name="orders piling up", kind="dlq_not_empty", queue="orders.dlq")
    alert = model("alerts.Alert").objects.create(
        rule=rule, subject="queue:orders.dlq", subject_label="orders.dlq", severity="warning", summary="5 waiting"
    )
    model("alerts.Notification").objects.create(channel=channel, alert=alert, kind="fired")
    model("alerts.GrowthSample").objects.create(subject="queue:orders.dlq", total=5)
    model("alerts.EvaluationState").objects.create()


def counts(apps: Any) -> dict[str, int]:
    return {
        f"{model._meta.app_label}.{model.__name__}": model.objects.count()
        for label in APPS
        for model in apps.get_app_config(label).get_models()
    }


@pytest.mark.django_db(transaction=True)
@pytest.mark.sqlite
def test_every_row_is_kept_and_belongs_to_the_broker_default(migrate: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(migration_ops, "BATCH", 2)
    old = migrate(BEFORE)
    # Before brokers there is no brokers table either.
    executor = MigrationExecutor(connection)
    executor.migrate([("brokers", None)])
    assert "brokers_broker" not in connection.introspection.table_names()
    fill(old)
    before = counts(old)
    assert all(before.values()), [name for name, count in before.items() if not count]

    new = migrate(
        [
            ("deadletters", "0016_brokers"),
            ("ingest", "0004_brokers"),
            ("operations", "0008_brokers"),
            ("alerts", "0008_rule_broker"),
        ]
    )

    assert counts(new) == before
    default = new.get_model("brokers", "Broker").objects.get(name="default")
    for label in ("DeadLetter", "DeadLetterCount", "ArrivalCount"):
        assert set(new.get_model("deadletters", label).objects.values_list("broker_id", flat=True)) == {default.pk}
    for label in ("WatchedQueue", "QueueSample", "IngestStat"):
        assert set(new.get_model("ingest", label).objects.values_list("broker_id", flat=True)) == {default.pk}
    assert new.get_model("operations", "PurgedDeadLetter").objects.get().broker_name == "default"
    assert new.get_model("operations", "RetryPolicy").objects.get(name="timeouts").broker_id is None
    assert set(new.get_model("alerts", "AlertRule").objects.values_list("broker_id", flat=True)) == {None}
    assert new.get_model("alerts", "Alert").objects.get().subject == "queue:orders.dlq"
    count = new.get_model("deadletters", "DeadLetterCount").objects.get()
    assert (count.source_queue, count.count) == ("orders.dlq", 5)
    assert current_apps.get_model("deadletters", "DeadLetter")._meta.get_field("broker").null is False


@pytest.mark.django_db(transaction=True)
def test_on_postgresql_the_column_is_not_null_with_a_validated_foreign_key(migrate: Any) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's catalog")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT is_nullable FROM information_schema.columns "
            "WHERE table_name = 'deadletters_deadletter' AND column_name = 'broker_id'"
        )
        assert cursor.fetchone() == ("NO",)
        cursor.execute("SELECT convalidated FROM pg_constraint WHERE conname = 'deadletters_deadletter_broker_fk'")
        assert cursor.fetchone() == (True,)
        # The helper CHECK constraint is gone once NOT NULL is set.
        cursor.execute("SELECT count(*) FROM pg_constraint WHERE conname = 'deadletters_deadletter_broker_not_null'")
        assert cursor.fetchone() == (0,)
