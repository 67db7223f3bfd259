"""`.env.example` lists every setting the console reads from the environment (README: "lists them with a line
each"): a setting added to the code without a line there fails here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The strict readers of dlqconsole/core/env.py, and os.environ read directly.
READ = re.compile(r"""(?:env_[a-z]+\(|os\.environ(?:\.get)?[\[(])\s*"([A-Z][A-Z0-9_]+)\"""")
# Read from the environment but not settings a person sets: the demo hands its queue to its own Celery worker.
INTERNAL = {"DLQ_DEMO_CELERY_QUEUE"}


def settings_read() -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "dlqconsole").rglob("*.py"):
        names.update(READ.findall(path.read_text(encoding="utf-8")))
    return names - INTERNAL


def listed(text: str) -> set[str]:
    return set(re.findall(r"^(?:# ?)?([A-Z][A-Z0-9_]+)=", text, flags=re.MULTILINE))


def test_the_reader_finds_the_settings_it_should() -> None:
    names = settings_read()

    assert {"DATABASE_URL", "SECRET_KEY", "DLQ_TRUSTED_PROXIES", "DLQ_ADMIN_PASSWORD", "TIME_ZONE"} <= names


def test_every_setting_read_from_the_environment_has_a_line_in_env_example() -> None:
    missing = settings_read() - listed((ROOT / ".env.example").read_text(encoding="utf-8"))

    assert not missing, f".env.example does not list {sorted(missing)}"


def test_a_setting_without_a_line_would_be_found() -> None:
    text = (ROOT / ".env.example").read_text(encoding="utf-8").replace("\nTIME_ZONE=UTC", "\n")

    assert "TIME_ZONE" in settings_read() - listed(text)
