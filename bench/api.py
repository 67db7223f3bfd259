"""Server time of the JSON API's dead-letter list (GET /api/v1/dead-letters/) with 1,000,000 dead letters.

    .venv/bin/python bench/api.py                 # builds bench/pages.py's world once (a few minutes), then measures
    .venv/bin/python bench/api.py --rows 100000   # a smaller world while developing
    .venv/bin/python bench/api.py --rebuild       # throw the world away and build it again
    .venv/bin/python bench/api.py --explain       # also print EXPLAIN ANALYZE of each case's dead-letter query

The world is bench/pages.py's, in the same database (BENCH_DATABASE_URL, default
postgres://postgres@127.0.0.1:5432/dlq_pages_bench): built once, it serves both benchmarks.

Each case is requested through Django's test Client in this process, as a script would call the API: with
`Authorization: Bearer <token>`, a personal token of a user with the operator role. So the server's whole work is
measured, without a socket: middleware, token authentication, the role check, the per-token rate limit (in Redis,
--redis, default redis://127.0.0.1:6379/13, as web processes share it; DLQ_API_TOKEN_RATE is set so high here that
it never throttles), the keyset page's queries and the JSON. Cases:

- the first page (50 rows, newest first) and a deep cursor page, --deep rows in (default 500,000; the last full
  page where fewer match). The deep cursor is built from the id of the row before it, in the format the first
  page's `next` link uses (DRF's cursor: base64 of `p=<id>`); the bench checks that format, and that a built
  cursor lands where following `next` links does;
- the same two for one queue (`?queue=`) and for the largest pattern (`?pattern=`);
- `?limit=500`, the largest page.

Reported: median and p95 over the runs, this process's CPU time, and a baseline: the same SQL statements one
request ran, replayed bare through the driver, with the ratio. Target: p95 under 100 ms for every case; the verdict
is printed (PASS / FAIL), and the exit status is 0 either way, as bench/pages.py's.
"""

from __future__ import annotations

import argparse
import base64
import os
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.pages import DEFAULT_URL, build_world, ensure_database, measure  # noqa: E402

LIST = "/api/v1/dead-letters/"
PAGE_SIZE = 50  # the API's default page (api/base.py NewestFirst)
TARGET_MS = 100.0
# High enough never to throttle the bench, and still a real rate: the limiter does its whole work per request.
UNTHROTTLED_RATE = "100000/1s:100000"
QUEUE = "svc3.dlq"  # the queue bench/pages.py filters by
FOLLOWED = 3  # `next` links followed to check a built cursor against


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=40, help="measured requests per case")
    parser.add_argument("--rebuild", action="store_true")
    parser.add_argument("--deep", type=int, default=500_000, help="rows before the deep cursor page")
    parser.add_argument(
        "--redis",
        default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/13"),
        help="REDIS_URL for the rate limit; empty for the in-process limiter",
    )
    parser.add_argument("--explain", action="store_true", help="print EXPLAIN ANALYZE of each case's list query")
    return parser.parse_args()


def redis_reachable(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1).ping())
    except redis.RedisError:
        return False


def operator_token() -> str:
    """The plaintext of a new personal token of `bench-operator`, a user with the operator role (its earlier bench
    tokens are revoked)."""
    from django.contrib.auth.models import User

    from dlqconsole.accounts.models import ApiToken
    from dlqconsole.accounts.roles import OPERATOR
    from dlqconsole.accounts.services import set_role
    from dlqconsole.accounts.tokens import create_token, revoke_tokens

    user, _ = User.objects.get_or_create(username="bench-operator")
    if not user.is_active or user.is_superuser or user.is_staff:
        user.is_active, user.is_superuser, user.is_staff = True, False, False
        user.save(update_fields=["is_active", "is_superuser", "is_staff"])
    set_role(user=user, role=OPERATOR)
    revoke_tokens(ApiToken.objects.filter(user=user, revoked_at__isnull=True).select_related("user"), actor=None)
    _, plaintext = create_token(user=user, name="bench")
    return plaintext


def cursor(position: int) -> str:
    """DRF's CursorPagination cursor of the page after the row with id `position` (ordering -id)."""
    return base64.b64encode(urlencode({"p": str(position)}).encode("ascii")).decode("ascii")


def page_path(query: dict[str, Any], position: int | None = None) -> str:
    params = dict(query)
    if position is not None:
        params["cursor"] = cursor(position)
    return f"{LIST}?{urlencode(params)}" if params else LIST


def id_at(query: dict[str, Any], depth: int) -> int:
    """The id of the `depth`th dead letter the filter shows, newest first: the page after it starts at row depth + 1.
    OFFSET only to find it here; the API never uses one."""
    from dlqconsole.deadletters.filters import DeadLetterFilter

    return int(DeadLetterFilter.from_dict(query).apply().order_by("-id").values_list("id", flat=True)[depth - 1])


def deep_position(query: dict[str, Any], depth: int, size: int) -> tuple[int, int]:
    """(id, depth) of the deep page's cursor: `depth` rows in, or the last full page where fewer match."""
    from dlqconsole.deadletters.filters import DeadLetterFilter

    depth = max(1, min(depth, DeadLetterFilter.from_dict(query).apply().count() - size))
    return id_at(query, depth), depth


def get_json(client: Any, path: str, name: str) -> dict[str, Any]:
    response = client.get(path)
    if response.status_code != 200:
        raise SystemExit(f"{name}: {response.status_code} {response.content[:300]!r}")
    return dict(response.json())


def check_cursor_format(client: Any, query: dict[str, Any]) -> None:
    """The first page's `next` carries the cursor this bench builds; following it FOLLOWED times lands where a built
    cursor does."""
    page = get_json(client, page_path(query), "first page")
    ids = [row["id"] for row in page["results"]]
    if not ids or ids != sorted(ids, reverse=True) or not page.get("next"):
        raise SystemExit(f"first page: expected rows newest first and a next link, got ids {ids[:5]}...")
    tokens = parse_qs(base64.b64decode(parse_qs(urlsplit(page["next"]).query)["cursor"][0]).decode("ascii"))
    if tokens != {"p": [str(ids[-1])]}:
        raise SystemExit(f"the next link's cursor is {tokens}, not p=<last id> ({ids[-1]}); teach bench/api.py")
    followed = page
    for _ in range(FOLLOWED):
        followed = get_json(client, followed["next"], "a next link")
    built = get_json(client, page_path(query, id_at(query, len(ids) * FOLLOWED)), "a built cursor")
    if [row["id"] for row in built["results"]] != [row["id"] for row in followed["results"]]:
        raise SystemExit("a built cursor lands elsewhere than following next links does; teach bench/api.py")


def explain(request: Callable[[], Any]) -> list[str]:
    """EXPLAIN (ANALYZE, BUFFERS) of the statements a request ran that read the dead letters."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        request()
    plans = []
    with connection.cursor() as cursor:
        for query in captured.captured_queries:
            sql = query["sql"]
            if 'FROM "deadletters_deadletter"' not in sql or not sql.lstrip().upper().startswith("SELECT"):
                continue
            cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}")
            plans.append(sql + "\n" + "\n".join(f"    {line}" for (line,) in cursor.fetchall()))
    return plans


def main() -> None:
    options = parse_args()
    url = os.environ.get("BENCH_DATABASE_URL", DEFAULT_URL)
    ensure_database(url)
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dlqconsole.settings")
    os.environ.setdefault("ALLOWED_HOSTS", "testserver")
    os.environ["DLQ_API_TOKEN_RATE"] = UNTHROTTLED_RATE
    redis_url = options.redis
    if redis_url and not redis_reachable(redis_url):
        print(f"Redis at {redis_url} does not answer: the rate limit is kept in process")
        redis_url = ""
    os.environ["REDIS_URL"] = redis_url
    import django

    django.setup()
    from django.db import connection
    from django.test import Client

    build_world(options.rows, rebuild=options.rebuild)
    client = Client(HTTP_AUTHORIZATION=f"Bearer {operator_token()}")
    probe = client.get(LIST)
    if probe.status_code == 404:
        raise SystemExit(f"{LIST} answers 404: dlqconsole/api/deadletters.py registers no route for it yet")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pattern_id FROM deadletters_deadlettercount GROUP BY 1 ORDER BY sum(count) DESC LIMIT 1")
        top_pattern = cursor.fetchone()[0]
    check_cursor_format(client, {})

    cases: list[tuple[str, dict[str, Any], bool]] = []
    for label, query in (("", {}), ("queue, ", {"queue": QUEUE}), ("pattern, ", {"pattern": top_pattern})):
        cases.append((f"{label}first page", query, False))
        cases.append((f"{label}deep page", query, True))
    cases.append(("limit=500, first page", {"limit": 500}, False))

    requests: list[tuple[str, Callable[[], Any], int]] = []
    for name, query, deep in cases:
        path = page_path(query)
        title = name
        size = int(query.get("limit", PAGE_SIZE))
        if deep:
            filters = {key: value for key, value in query.items() if key != "limit"}
            position, depth = deep_position(filters, options.deep, size)
            path = page_path(query, position)
            title = f"{name}, {depth:,} in"
        page = get_json(client, path, title)
        ids = [row["id"] for row in page["results"]]
        if len(ids) != size or ids != sorted(ids, reverse=True):
            raise SystemExit(f"{title}: expected {size} rows newest first, got {len(ids)}")
        requests.append((title, partial(client.get, path), len(client.get(path).content)))

    load_before = os.getloadavg()[0]
    results = []
    for title, request, content_bytes in requests:
        row = measure(title, request, runs=options.runs)
        row["kb"] = content_bytes / 1024
        results.append(row)
    load_after = os.getloadavg()[0]

    print(f"\nGET {LIST}: {options.rows:,} dead letters, {options.runs} runs per case (ms)")
    # The machine is shared: a busy one stretches every number, so say how busy it was.
    print(f"load average {load_before:.1f} before, {load_after:.1f} after, on {os.cpu_count()} CPUs")
    print(f"rate limit in {'Redis ' + redis_url if redis_url else 'this process'}; top pattern {top_pattern}")
    # median and p95: wall time of the request; cpu: this process's own CPU time (Python, serialization), the part
    # that does not wait for PostgreSQL or for a CPU another process holds; sql: the same statements, bare.
    print(
        f"{'case':<36}{'median':>9}{'p95':>9}{'cpu':>8}{'sql med':>10}{'sql p95':>10}{'ratio':>8}{'queries':>9}"
        f"{'KB':>8}  p95 < {TARGET_MS:g}"
    )
    for row in results:
        ratio = row["median"] / row["sql_median"] if row["sql_median"] else float("inf")
        verdict = "PASS" if row["p95"] < TARGET_MS else "FAIL"
        print(
            f"{row['page']:<36}{row['median']:>9.1f}{row['p95']:>9.1f}{row['cpu']:>8.1f}{row['sql_median']:>10.1f}"
            f"{row['sql_p95']:>10.1f}{ratio:>8.1f}{row['queries']:>9}{row['kb']:>8.1f}  {verdict}"
        )
    worst = max(row["p95"] for row in results)
    verdict = "PASS" if worst < TARGET_MS else "FAIL"
    print(f"\nworst p95 {worst:.1f} ms; target under {TARGET_MS:g} ms: {'met' if worst < TARGET_MS else 'NOT met'}")
    print(verdict)
    if options.explain:
        for title, request, _ in requests:
            print(f"\n== {title}")
            for plan in explain(request):
                print(plan)


if __name__ == "__main__":
    main()
