"""Export the dead letters matching a filter as CSV or JSON lines.

Small sets stream straight to the browser. Sets larger than STREAM_LIMIT are written by a Celery task to
VAR_DIR/exports/<token>.<ext> (a `.part` file while it waits and runs, an `.error` file beside it if it fails or
stops early) and downloaded from the export status page. The token starts with the requester's user id: only that
user (or an admin) can fetch the file. Beat deletes export files older than DLQ_EXPORT_RETENTION_HOURS (a `.part`
file that old belongs to a worker that died).

No export may exhaust the machine, so each is bounded three ways:
- Reads and memory: bounded pieces under a statement timeout (export_lines.py); a read that times out ends the
  file or stream with an `export_error` line saying so, rather than hanging.
- Per user: at most DLQ_EXPORTS_PER_USER exports run at once, streamed ones included; a further one is refused.
- Per kind: at most DLQ_EXPORT_CONCURRENCY background exports write at once, across all workers (which also run
  the operations). A task that finds them all busy does not hold its worker: it comes back WAIT_SECONDS later with
  the same arguments, and the status page says the export waits.
Both limits are leases (core/leases.py) that an export renews as it works and gives back when it ends, so a
crashed export frees its place when its lease runs out. A background export stuck in the Celery queue behind
other work renews nothing: its place among its user's exports lapses until a worker picks it up.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.http import StreamingHttpResponse
from django.utils import timezone

from dlqconsole.accounts.roles import ADMIN, has_role
from dlqconsole.accounts.services import record_audit
from dlqconsole.core.leases import Leases, LeasesUnavailable, get_leases
from dlqconsole.core.taskargs import RefusedArgument, row_id, shown
from dlqconsole.deadletters.export_lines import Reader, lines
from dlqconsole.deadletters.filters import DeadLetterFilter, FilterError

logger = logging.getLogger(__name__)

FORMATS = {"csv": "text/csv; charset=utf-8", "jsonl": "application/x-ndjson; charset=utf-8"}
STREAM_LIMIT = 50_000
# A background export that finds every export slot busy comes back after this long.
WAIT_SECONDS = 5
# An export renews its leases at most this often; they last this margin plus twice the read timeout.
RENEW_SECONDS = 10
LEASE_MARGIN_SECONDS = 60.0
RUNNING_POOL = "exports:running"
TOKEN = re.compile(r"^([0-9]+)-[0-9a-f]{32}$")
# The largest primary key PostgreSQL's bigint (and SQLite's integer) holds.
MAX_ID = 2**63 - 1


class ExportRefused(Exception):
    """An export that may not start now; the message says why, for the person who asked."""


def export_dir() -> Path:
    path = Path(settings.VAR_DIR) / "exports"
    path.mkdir(parents=True, exist_ok=True)
    return path


def delete_expired_exports() -> int:
    """Delete export files (ready, failed or abandoned) last written more than DLQ_EXPORT_RETENTION_HOURS ago;
    returns how many."""
    cutoff = time.time() - settings.DLQ_EXPORT_RETENTION_HOURS * 3600
    deleted = 0
    for path in export_dir().iterdir():
        if not (path.is_file() and TOKEN.fullmatch(path.name.partition(".")[0])):
            continue
        try:
            if path.stat().st_mtime < cutoff:
                path.unlink()
                deleted += 1
        except FileNotFoundError:  # deleted by another worker meanwhile
            continue
    return deleted


def is_large(chosen: DeadLetterFilter) -> bool:
    """Whether the set holds more than STREAM_LIMIT rows: one bounded probe, not a count."""
    return chosen.apply().order_by("-id").values_list("pk", flat=True)[STREAM_LIMIT : STREAM_LIMIT + 1].exists()


# Places: the limits per user and per kind -----------------------------------------------------------------------


def lease_seconds() -> float:
    """How long an export's leases last between renewals: longer than any one read may take, with room to spare."""
    return LEASE_MARGIN_SECONDS + 2 * settings.DLQ_EXPORT_READ_TIMEOUT_SECONDS


def user_pool(user_id: object) -> str:
    return f"exports:user:{user_id}"


class Hold:
    """An export's leases, renewed as it works (at most every RENEW_SECONDS) and given back when it ends.

    Renewing and giving back never stop an export: when Redis cannot be reached the leases simply run out.
    """

    def __init__(self, *, holder: str, pools: list[str], leases: Leases | None = None) -> None:
        self.holder = holder
        self.pools = pools
        self.leases = leases or get_leases()
        self.renewed = time.monotonic()
        self.released = False

    def renew(self) -> None:
        if time.monotonic() - self.renewed < RENEW_SECONDS:
            return
        self.renewed = time.monotonic()
        try:
            for pool in self.pools:
                self.leases.renew(pool, self.holder, seconds=lease_seconds())
        except LeasesUnavailable as error:
            logger.warning("export %s: could not renew its leases: %s", self.holder, error)

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        try:
            for pool in self.pools:
                self.leases.give_back(pool, self.holder)
        except LeasesUnavailable as error:
            logger.warning("export %s: could not give back its leases (they run out): %s", self.holder, error)


def take_user_place(
    *,
    user: AbstractBaseUser | AnonymousUser,
    holder: str,
    export_format: str,
    filter: dict[str, Any],  # noqa: A002
) -> Hold:
    """One of the user's DLQ_EXPORTS_PER_USER places, or ExportRefused (audited) when they are all taken."""
    limit = settings.DLQ_EXPORTS_PER_USER
    pool = user_pool(user.pk)
    try:
        taken = get_leases().take(pool, holder, limit=limit, seconds=lease_seconds())
    except LeasesUnavailable as error:
        logger.error("export refused: the running exports cannot be counted: %s", error)
        raise ExportRefused(
            "Exports cannot start right now (their count is out of reach); try again shortly."
        ) from None
    if not taken:
        record_audit(
            actor=user,
            action="export.refused",
            target=f"messages.{export_format}",
            filter=filter,
            detail=f"{limit} exports of this user already running",
        )
        running = "1 export" if limit == 1 else f"{limit} exports"
        raise ExportRefused(
            f"You already have {running} running, the most one person may run at once. "
            "Start this one when one of them has finished."
        )
    return Hold(holder=holder, pools=[pool])


class _Streamed:
    """A streamed export's lines. Django closes them when the response ends (sent, or the client went away), even
    if streaming never began; ending or closing gives back the export's place."""

    def __init__(self, lines: Iterator[str], hold: Hold) -> None:
        self.lines = lines
        self.hold = hold

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        try:
            return next(self.lines)
        except StopIteration:
            self.hold.release()
            raise

    def close(self) -> None:
        try:
            self.lines.close()  # type: ignore[attr-defined]
        finally:
            self.hold.release()


def streaming_response(
    chosen: DeadLetterFilter, *, export_format: str, user: AbstractBaseUser | AnonymousUser
) -> StreamingHttpResponse:
    """The export as a download, holding one of the user's places while it streams; ExportRefused when none is
    free."""
    filter_dict = chosen.to_dict()
    hold = take_user_place(
        user=user, holder=f"stream-{uuid.uuid4().hex}", export_format=export_format, filter=filter_dict
    )
    record_audit(actor=user, action="export", target=f"messages.{export_format}", filter=filter_dict)
    letters = Reader(chosen, renew=hold.renew)
    response = StreamingHttpResponse(
        _Streamed(lines(letters, export_format=export_format), hold), content_type=FORMATS[export_format]
    )
    stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
    response["Content-Disposition"] = f'attachment; filename="dead-letters-{stamp}.{export_format}"'
    return response


def start_export(
    *,
    filter: dict[str, Any],  # noqa: A002
    export_format: str,
    user: AbstractBaseUser | AnonymousUser,
) -> str:
    """Take one of the user's places (ExportRefused when none is free), create the export's `.part` file and
    enqueue the task that writes it; returns the export's token."""
    # Imported here: the tasks import this module (a service enqueueing its own task).
    from dlqconsole.deadletters.tasks import write_export_task

    try:
        # What the task will check: refuse here what it would refuse there, rather than leave a file that waits
        # forever.
        checked = filter_argument(filter)
    except RefusedArgument as problem:
        raise ExportRefused(f"This filter cannot be exported: {problem}") from None
    token = f"{user.pk}-{uuid.uuid4().hex}"
    take_user_place(user=user, holder=token, export_format=export_format, filter=checked)
    (export_dir() / f"{token}.{export_format}.part").touch()
    record_audit(actor=user, action="export", target=f"export:{token}", filter=checked, detail=export_format)
    # delay_on_commit (Celery 5.4+) is not yet in celery-types.
    write_export_task.delay_on_commit(token=token, filter=checked, export_format=export_format)  # type: ignore[attr-defined]
    return token


def write_export(
    *,
    token: str,
    filter: dict[str, Any],  # noqa: A002
    export_format: str,
    continue_later: Callable[[float], None] | None = None,
) -> int:
    """Write the export file for `token` and return how many dead letters it holds.

    When DLQ_EXPORT_CONCURRENCY exports are writing already, write nothing and call `continue_later(seconds)`
    (the task enqueues itself again) and return 0; without `continue_later`, write anyway.
    """
    directory = export_dir()
    part = directory / f"{token}.{export_format}.part"
    if not part.exists():
        # Finished already (a redelivered task), or never started by start_export.
        logger.error("export %s: no %s export waits under this token; nothing written", token, export_format)
        return 0
    leases = get_leases()
    user = user_pool(token.partition("-")[0])
    limit = settings.DLQ_EXPORT_CONCURRENCY
    if continue_later is not None:
        try:
            free = leases.take(RUNNING_POOL, token, limit=limit, seconds=lease_seconds())
        except LeasesUnavailable as error:
            logger.warning("export %s waits: the running exports cannot be counted: %s", token, error)
            free = False
        if not free:
            # Still one of its user's exports while it waits.
            with contextlib.suppress(LeasesUnavailable):
                leases.renew(user, token, seconds=lease_seconds())
            continue_later(WAIT_SECONDS)
            return 0
    hold = Hold(holder=token, pools=[RUNNING_POOL, user], leases=leases)
    try:
        letters = Reader(DeadLetterFilter.from_dict(filter), renew=hold.renew)
        with part.open("w", encoding="utf-8", newline="") as handle:
            for line in lines(letters, export_format=export_format):
                handle.write(line)
        part.rename(directory / f"{token}.{export_format}")
        if letters.stopped:
            (directory / f"{token}.{export_format}.error").write_text(letters.stopped)
    except Exception as error:
        (directory / f"{token}.{export_format}.error").write_text(f"{type(error).__name__}: {error}")
        part.unlink(missing_ok=True)
        raise
    finally:
        hold.release()
    return letters.count


# The task's arguments --------------------------------------------------------------------------------------------


def token_argument(value: Any) -> str:
    """An export token as write_export_task takes it: TOKEN's form, naming a user who exists, a file name inside
    the export folder."""
    match = TOKEN.fullmatch(value) if isinstance(value, str) else None
    # More digits than any id has would only make int() work hard.
    if match is None or len(match.group(1)) > 19:
        raise RefusedArgument(f"{shown(value)} is not an export token")
    row_id(get_user_model())(int(match.group(1)))
    directory = export_dir().resolve()
    if (directory / value).resolve().parent != directory:
        raise RefusedArgument(f"{shown(value)} is not a name inside the export folder")
    return value


def filter_argument(value: Any) -> dict[str, Any]:
    """A filter as start_export stores it: DeadLetterFilter's fields only, each text, a whole number or a flat list
    of them (lists only where the field is one), that DeadLetterFilter.from_dict accepts, with ids in range."""
    if not isinstance(value, dict):
        raise RefusedArgument(f"{shown(value)} is not a filter")
    empty = DeadLetterFilter()
    for name, item in value.items():
        if name not in DeadLetterFilter.FIELDS:
            raise RefusedArgument(f"{shown(name)} is not a filter field")
        listed = isinstance(getattr(empty, name), list)
        items = item if listed and isinstance(item, list) else [item]
        if not all(isinstance(part, str) or (listed and type(part) is int) for part in items):
            raise RefusedArgument(f"filter field {name}: {shown(item)} is neither text nor a list of it")
    try:
        chosen = DeadLetterFilter.from_dict(value)
    except FilterError as problem:
        raise RefusedArgument(f"filter: {problem}") from None
    outside = [number for number in (*chosen.pattern, *chosen.ids) if not 1 <= number <= MAX_ID]
    if outside:
        raise RefusedArgument(f"filter: the id {outside[0]} is outside 1..{MAX_ID}")
    return chosen.to_dict()


# Status ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExportFile:
    token: str
    state: str  # waiting, running, ready or failed
    path: Path
    export_format: str
    # Why it failed; for a ready file, why it stopped early (its last line says so too).
    error: str = ""

    @property
    def download_name(self) -> str:
        return f"dead-letters-{self.token.rpartition('-')[2][:8]}.{self.export_format}"

    @property
    def size(self) -> int:
        return self.path.stat().st_size if self.path.exists() else 0


def find_export(*, name: str, user: AbstractBaseUser | AnonymousUser) -> ExportFile | None:
    match = TOKEN.fullmatch(name)
    if match is None:
        return None
    if str(user.pk) != match.group(1) and not has_role(user, ADMIN):
        return None
    directory = export_dir()
    for export_format in FORMATS:
        ready = directory / f"{name}.{export_format}"
        failed = directory / f"{name}.{export_format}.error"
        error = failed.read_text()[:2000] if failed.exists() else ""
        if ready.exists():
            return ExportFile(token=name, state="ready", path=ready, export_format=export_format, error=error)
        if error:
            return ExportFile(token=name, state="failed", path=failed, export_format=export_format, error=error)
        running = directory / f"{name}.{export_format}.part"
        if running.exists():
            state = "running" if _is_writing(name) else "waiting"
            return ExportFile(token=name, state=state, path=running, export_format=export_format)
    return None


def _is_writing(token: str) -> bool:
    try:
        return token in get_leases().holders(RUNNING_POOL)
    except LeasesUnavailable:
        return True
