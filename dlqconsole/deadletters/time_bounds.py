"""A time window as an id range: the newest-first lists walk ids downwards, so a window that ends long before the
newest row (`until=25d`) would read every newer row before the first match. HourIds holds, for each hour, the
lowest and highest id of the rows that arrived in it, so:

- every row with ingested_at < T has an id at most the highest id of the hours up to T's;
- every row with ingested_at >= T has an id at least the lowest id of the hours from T's on.

Both bounds are exact consequences of the time condition (which the query keeps), so adding them never changes
which rows match; they only tell PostgreSQL where to start and stop. Other databases keep no HourIds and get no
bound."""

from __future__ import annotations

import datetime as dt

from django.db import connection
from django.db.models import Max, Min

from dlqconsole.deadletters.models import HourIds

# Folds the rows of {rows} (id, ingested_at) into their hours' ranges; the triggers of migration 0019 run it over
# each statement's new rows, and fold_all() over the whole table.
FOLD = """
    INSERT INTO deadletters_hourids AS kept (hour, min_id, max_id)
    SELECT date_trunc('hour', ingested_at, 'UTC'), min(id), max(id) FROM {rows} GROUP BY 1 ORDER BY 1
    ON CONFLICT (hour) DO UPDATE SET min_id = least(kept.min_id, excluded.min_id),
                                     max_id = greatest(kept.max_id, excluded.max_id)
    WHERE excluded.min_id < kept.min_id OR excluded.max_id > kept.max_id
"""

# No dead letter can have an id below 1: a bound that says "none" is an empty range.
NONE_BEFORE = 0


def hour_of(moment: dt.datetime) -> dt.datetime:
    return moment.astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0)


def kept() -> bool:
    return connection.vendor == "postgresql"


def highest_id_before(moment: dt.datetime) -> int:
    """An id no dead letter that arrived before `moment` exceeds (0 when none arrived before it)."""
    found = HourIds.objects.filter(hour__lte=hour_of(moment)).aggregate(highest=Max("max_id"))["highest"]
    return NONE_BEFORE if found is None else int(found)


def lowest_id_from(moment: dt.datetime) -> int | None:
    """An id no dead letter that arrived at or after `moment` is below (None when none did)."""
    found = HourIds.objects.filter(hour__gte=hour_of(moment)).aggregate(lowest=Min("min_id"))["lowest"]
    return None if found is None else int(found)


def fold_all() -> None:
    """Fold every stored dead letter into HourIds: after rows were written with triggers off (a bulk load)."""
    with connection.cursor() as cursor:
        cursor.execute(FOLD.format(rows="deadletters_deadletter"))
