"""The console's own Celery app with one more task, the sentinel: it leaves a file behind when it runs. A worker
started with `-A tests.operations.sentinel_celery` is a console worker that shows whether a forged task reached it.
"""

from __future__ import annotations

import os
from pathlib import Path

from dlqconsole.celery import app

__all__ = ["app", "touch"]


@app.task(name="sentinel.touch")
def touch(marker: str) -> None:
    # The marker is the test's own (a plain name); the file says the console's worker ran a task it was sent.
    (Path(os.environ["SENTINEL_DIR"]) / f"{marker}.ran").touch()
