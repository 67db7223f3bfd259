"""Migration steps that give an existing table a broker column without a long lock.

On PostgreSQL: the column is added nullable (no rewrite, no scan); existing rows are given the broker `default`
in batches of BATCH rows, each its own short transaction; then the foreign key and NOT NULL are added as
constraints NOT VALID and validated (validation takes a lock that lets reads and writes go on), and NOT NULL is
set from the validated check without another scan. Other databases (SQLite, one writer) take the plain steps.
Migrations using these are not atomic (`atomic = False`)."""

from __future__ import annotations

from typing import Any

from django.db import migrations, models
from django.db.migrations.operations.base import Operation

import dlqconsole.brokers.models

BATCH = 10_000


class OnPostgres(Operation):
    """Runs `operation`'s database steps on PostgreSQL only, or (elsewhere=True) only on other databases. Use it
    among SeparateDatabaseAndState's database operations, beside the state operation (its state is only seen by
    the database operations that follow it there)."""

    reduces_to_sql = False
    reversible = True

    def __init__(self, operation: Operation, *, elsewhere: bool = False) -> None:
        self.operation = operation
        self.elsewhere = elsewhere

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        return self.__class__.__qualname__, [self.operation], {"elsewhere": self.elsewhere}

    def _applies(self, schema_editor: Any) -> bool:
        return (schema_editor.connection.vendor == "postgresql") != self.elsewhere

    def state_forwards(self, app_label: str, state: Any) -> None:
        self.operation.state_forwards(app_label, state)

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if self._applies(schema_editor):
            self.operation.database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if self._applies(schema_editor):
            self.operation.database_backwards(app_label, schema_editor, from_state, to_state)

    def describe(self) -> str:
        where = "other databases" if self.elsewhere else "PostgreSQL"
        return f"On {where}: {self.operation.describe()}"


def _field(*, null: bool) -> models.ForeignKey[Any, Any]:
    return models.ForeignKey(
        "brokers.Broker",
        on_delete=models.PROTECT,
        related_name="+",
        db_index=False,
        default=dlqconsole.brokers.models.default_broker_id,
        null=null,
    )


def _backfill(table: str) -> Any:
    def backfill(apps: Any, schema_editor: Any) -> None:
        # The migration is not atomic: each UPDATE commits on its own, so no lock is held for long.
        Broker = apps.get_model("brokers", "Broker")
        default = Broker.objects.get_or_create(name="default", defaults={"url": "", "managed": True})[0].pk
        quote = schema_editor.quote_name
        connection = schema_editor.connection
        while True:
            with connection.cursor() as cursor:
                cursor.execute(
                    f"UPDATE {quote(table)} SET broker_id = %s WHERE id IN "  # noqa: S608  (names, not input)
                    f"(SELECT id FROM {quote(table)} WHERE broker_id IS NULL LIMIT {BATCH})",
                    [default],
                )
                done = cursor.rowcount
            if done < BATCH:
                return

    return backfill


def add_broker(model_name: str, table: str) -> list[Operation]:
    """Give `table` (model `model_name`) a NOT NULL broker column whose existing rows belong to `default`."""
    nullable = migrations.AddField(model_name=model_name, name="broker", field=_field(null=True))
    constrained = migrations.AlterField(model_name=model_name, name="broker", field=_field(null=False))
    fk = f"{table}_broker_fk"
    check = f"{table}_broker_not_null"
    return [
        migrations.SeparateDatabaseAndState(
            state_operations=[nullable],
            database_operations=[
                OnPostgres(
                    migrations.RunSQL(
                        f'ALTER TABLE "{table}" ADD COLUMN "broker_id" bigint NULL',
                        reverse_sql=f'ALTER TABLE "{table}" DROP COLUMN "broker_id"',
                    )
                ),
                OnPostgres(nullable, elsewhere=True),
            ],
        ),
        migrations.RunPython(_backfill(table), migrations.RunPython.noop, elidable=False),
        migrations.SeparateDatabaseAndState(
            state_operations=[constrained],
            database_operations=[
                OnPostgres(
                    migrations.RunSQL(
                        [
                            f'ALTER TABLE "{table}" ADD CONSTRAINT "{fk}" FOREIGN KEY ("broker_id") '
                            f'REFERENCES "brokers_broker" ("id") DEFERRABLE INITIALLY DEFERRED NOT VALID',
                            f'ALTER TABLE "{table}" VALIDATE CONSTRAINT "{fk}"',
                            f'ALTER TABLE "{table}" ADD CONSTRAINT "{check}" CHECK ("broker_id" IS NOT NULL) NOT VALID',
                            f'ALTER TABLE "{table}" VALIDATE CONSTRAINT "{check}"',
                            f'ALTER TABLE "{table}" ALTER COLUMN "broker_id" SET NOT NULL',
                            f'ALTER TABLE "{table}" DROP CONSTRAINT "{check}"',
                        ],
                        reverse_sql=[
                            f'ALTER TABLE "{table}" ALTER COLUMN "broker_id" DROP NOT NULL',
                            f'ALTER TABLE "{table}" DROP CONSTRAINT "{fk}"',
                        ],
                    )
                ),
                OnPostgres(constrained, elsewhere=True),
            ],
        ),
    ]


def add_index(model_name: str, index: models.Index) -> Operation:
    """AddIndex, built CONCURRENTLY on PostgreSQL (no lock on writes while it builds)."""
    from django.contrib.postgres.operations import AddIndexConcurrently

    plain = migrations.AddIndex(model_name=model_name, index=index)
    return migrations.SeparateDatabaseAndState(
        state_operations=[plain],
        database_operations=[
            OnPostgres(AddIndexConcurrently(model_name=model_name, index=index)),
            OnPostgres(plain, elsewhere=True),
        ],
    )
