"""Export the dead letters matching a filter as CSV or JSON lines.

Small sets stream straight to the browser, read in keyset chunks so memory stays flat. Sets larger than
STREAM_LIMIT are written by a Celery task to VAR_DIR/exports/<token>.<ext> (a `.part` file while it runs, an
`.error` file if it fails) and downloaded from the export status page. The token starts with the requester's
user id: only that user (or an admin) can fetch the file. Beat deletes export files older than
DLQ_EXPORT_RETENTION_HOURS (a `.part` file that old belongs to a worker that died).
"""

from __future__ import annotations

import base64
import csv
import io
import json
import logging
import re
import time
import uuid
from collections.abc import Iterator
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
from dlqconsole.core.taskargs import RefusedArgument, row_id, shown
from dlqconsole.deadletters.filters import DeadLetterFilter, FilterError
from dlqconsole.deadletters.models import DeadLetter

logger = logging.getLogger(__name__)

FORMATS = {"csv": "text/csv; charset=utf-8", "jsonl": "application/x-ndjson; charset=utf-8"}
STREAM_LIMIT = 50_000
CHUNK = 1000
TOKEN = re.compile(r"^([0-9]+)-[0-9a-f]{32}$")
COLUMNS = (
    "id",
    "ingested_at",
    "status",
    "source_queue",
    "original_queue",
    "original_exchange",
    "original_routing_keys",
    "death_reason",
    "failure_reason",
    "error_type",
    "error_message",
    "attempt_count",
    "first_failed_at",
    "last_failed_at",
    "host",
    "app_version",
    "message_id",
    "correlation_id",
    "priority",
    "content_type",
    "content_encoding",
    "task_name",
    "task_id",
    "pattern_id",
    "replay_count",
    "body_size",
    "body_encoding",
    "body",
    "headers",
    "properties",
    "x_death",
)
# A spreadsheet runs a cell starting with one of these as a formula; dead letters carry text from anywhere.
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
# The largest primary key PostgreSQL's bigint (and SQLite's integer) holds.
MAX_ID = 2**63 - 1


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


def iter_letters(chosen: DeadLetterFilter) -> Iterator[DeadLetter]:
    """Every matching dead letter, newest first, in keyset chunks (no OFFSET, no server-side cursor)."""
    found = chosen.apply().order_by("-id")
    last: int | None = None
    while True:
        page = found.filter(pk__lt=last) if last is not None else found
        chunk = list(page[:CHUNK])
        if not chunk:
            return
        yield from chunk
        last = chunk[-1].pk


def record(letter: DeadLetter) -> dict[str, Any]:
    body = bytes(letter.body)
    try:
        body_text, encoding = body.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        body_text, encoding = base64.b64encode(body).decode(), "base64"
    values: dict[str, Any] = {name: getattr(letter, name, None) for name in COLUMNS}
    values.update(
        ingested_at=_iso(letter.ingested_at),
        first_failed_at=_iso(letter.first_failed_at),
        last_failed_at=_iso(letter.last_failed_at),
        body=body_text,
        body_encoding=encoding,
    )
    return values


def csv_lines(letters: Iterator[DeadLetter]) -> Iterator[str]:
    buffer = io.StringIO()
    writer = csv.writer(buffer)

    def flush() -> str:
        text = buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()
        return text

    writer.writerow(COLUMNS)
    yield flush()
    for letter in letters:
        values = record(letter)
        if values["body_encoding"] == "utf-8" and "\x00" in values["body"]:
            # A NUL inside a CSV cell breaks spreadsheets and many CSV readers: such a body goes as base64, as a
            # body that is not UTF-8 does (the body_encoding column says which).
            values.update(body=base64.b64encode(bytes(letter.body)).decode(), body_encoding="base64")
        writer.writerow([_cell(values[name]) for name in COLUMNS])
        yield flush()


def jsonl_lines(letters: Iterator[DeadLetter]) -> Iterator[str]:
    for letter in letters:
        yield json.dumps(record(letter), ensure_ascii=False, default=str) + "\n"


def lines(chosen: DeadLetterFilter, *, export_format: str) -> Iterator[str]:
    letters = iter_letters(chosen)
    return csv_lines(letters) if export_format == "csv" else jsonl_lines(letters)


def streaming_response(chosen: DeadLetterFilter, *, export_format: str) -> StreamingHttpResponse:
    response = StreamingHttpResponse(lines(chosen, export_format=export_format), content_type=FORMATS[export_format])
    stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
    response["Content-Disposition"] = f'attachment; filename="dead-letters-{stamp}.{export_format}"'
    return response


def start_export(
    *,
    filter: dict[str, Any],
    export_format: str,
    user: AbstractBaseUser | AnonymousUser,  # noqa: A002
) -> str:
    """Create the export's `.part` file and enqueue the task that writes it; returns the export's token."""
    from dlqconsole.deadletters.tasks import write_export_task

    token = f"{user.pk}-{uuid.uuid4().hex}"
    (export_dir() / f"{token}.{export_format}.part").touch()
    record_audit(actor=user, action="export", target=f"export:{token}", filter=filter, detail=export_format)
    # delay_on_commit (Celery 5.4+) is not yet in celery-types.
    write_export_task.delay_on_commit(token=token, filter=filter, export_format=export_format)  # type: ignore[attr-defined]
    return token


def write_export(*, token: str, filter: dict[str, Any], export_format: str) -> int:  # noqa: A002
    """Write the export file for `token`; returns how many dead letters it holds."""
    directory = export_dir()
    part = directory / f"{token}.{export_format}.part"
    if not part.exists():
        # Finished already (a redelivered task), or never started by start_export.
        logger.error("export %s: no %s export waits under this token; nothing written", token, export_format)
        return 0
    written = 0
    try:
        chosen = DeadLetterFilter.from_dict(filter)
        with part.open("w", encoding="utf-8", newline="") as handle:
            for line in lines(chosen, export_format=export_format):
                handle.write(line)
                written += 1
        part.rename(directory / f"{token}.{export_format}")
    except Exception as error:
        (directory / f"{token}.{export_format}.error").write_text(f"{type(error).__name__}: {error}")
        part.unlink(missing_ok=True)
        raise
    # The CSV header is a line too.
    return written - 1 if export_format == "csv" else written


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


@dataclass(frozen=True)
class ExportFile:
    token: str
    state: str  # running, ready or failed
    path: Path
    export_format: str
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
        if ready.exists():
            return ExportFile(token=name, state="ready", path=ready, export_format=export_format)
        failed = directory / f"{name}.{export_format}.error"
        if failed.exists():
            return ExportFile(
                token=name, state="failed", path=failed, export_format=export_format, error=failed.read_text()[:2000]
            )
        running = directory / f"{name}.{export_format}.part"
        if running.exists():
            return ExportFile(token=name, state="running", path=running, export_format=export_format)
    return None


def _cell(value: Any) -> str:
    if value is None:
        return ""
    text = json.dumps(value, ensure_ascii=False) if isinstance(value, list | dict) else str(value)
    if isinstance(value, str) and text.startswith(FORMULA_START):
        return "'" + text
    return text


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None
