"""bench/grouping.py --loghub: scores the Loghub 2k samples of a folder through the code path of `dlq fingerprint`."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest

from bench.grouping import DEFAULT_LOGHUB, group, load, loghub, loghub_files, score


def write_dataset(directory: Path, name: str, rows: list[tuple[str, str]]) -> None:
    folder = directory / name
    folder.mkdir()
    with (folder / f"{name}_2k.log_structured.csv").open("w", encoding="utf-8", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["LineId", "Date", "Content", "EventId", "EventTemplate"])
        for number, (event, content) in enumerate(rows, 1):
            writer.writerow([number, "2026-01-01", content, event, ""])


def test_loghub_scores_each_dataset_by_its_event_ids(tmp_path: Path) -> None:
    write_dataset(
        tmp_path,
        "Shop",
        [
            ("E1", "user bob not found"),
            ("E1", "user John Smith not found"),
            ("E2", "upload finished, 0 bytes written"),
            ("E2", "upload finished, 1190 bytes (1.16 KB) written"),
        ],
    )
    write_dataset(tmp_path, "Pay", [("E1", "payment declined: card expired"), ("E1", "payment declined: card stolen")])
    (tmp_path / "Other").mkdir()
    (tmp_path / "Other" / "notes_2k.log_structured.csv").write_text("Content,EventId\nx,E1\n", encoding="utf-8")

    results = loghub(tmp_path)

    assert list(results) == ["Pay", "Shop"]
    assert results["Shop"]["accuracy"] == 1.0
    assert results["Shop"]["group_f1"] == 1.0
    # Two fixed words that differ stay apart: one true event split in two groups.
    assert results["Pay"]["accuracy"] == 0.0
    assert results["Pay"]["patterns"] == 2


def test_loghub_lists_the_events_grouped_wrongly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_dataset(tmp_path, "Pay", [("E1", "payment declined: card expired"), ("E1", "payment declined: card stolen")])
    write_dataset(tmp_path, "Shop", [("E1", "user bob not found"), ("E1", "user ann not found")])

    loghub(tmp_path, errors=True)

    out = capsys.readouterr().out
    assert "- Pay E1: split into 2 pattern(s); mixed with []" in out
    assert "'payment declined: card stolen'" in out
    assert "Shop" not in out


def test_the_labelled_corpus_meets_the_grouping_bar_in_every_split() -> None:
    """The corpus's bar (accuracy >= 0.97, group F1 >= 0.90) in every split, the held-out causes (never tuned on)
    included, so that a change to grouping that loses it fails here and not only in `make bench`."""
    rows = load()
    splits = {
        "train": [row for row in rows if row["split"] == "train"],
        "heldout": [row for row in rows if row["split"] == "heldout"],
        "all": rows,
    }

    results = {name: score([row["cause"] for row in part], group(part)) for name, part in splits.items()}

    assert results["all"]["messages"] >= 4400 and results["all"]["causes"] >= 330
    assert results["heldout"]["causes"] >= 80
    for name, numbers in results.items():
        assert numbers["accuracy"] >= 0.97, (name, numbers)
        assert numbers["group_f1"] >= 0.90, (name, numbers)


LOGHUB_DATASETS = 16


def test_the_public_loghub_datasets_meet_the_grouping_bar() -> None:
    """Mean grouping accuracy and group F1 >= 0.92 over the 16 Loghub-2k datasets with corrected labels, whole, in
    one configuration. The data is not part of this repository (DLQ_LOGHUB_DIR, else ../shared/data beside the
    checkout): without it the test is skipped on a developer's machine and fails in CI, where the bar must hold."""
    files = loghub_files(DEFAULT_LOGHUB)
    if len(files) < LOGHUB_DATASETS:
        message = f"{LOGHUB_DATASETS} Loghub-2k datasets expected under {DEFAULT_LOGHUB}, found {len(files)}"
        if os.environ.get("CI") == "true":
            pytest.fail(message + " (set DLQ_LOGHUB_DIR)")
        pytest.skip(message)

    results = loghub(DEFAULT_LOGHUB)

    assert len(results) == LOGHUB_DATASETS
    assert all(numbers["messages"] == 2000 for numbers in results.values())
    accuracy = sum(numbers["accuracy"] for numbers in results.values()) / len(results)
    f1 = sum(numbers["group_f1"] for numbers in results.values()) / len(results)
    assert accuracy >= 0.92, (accuracy, results)
    assert f1 >= 0.92, (f1, results)


def test_corrected_labels_are_read_first_by_their_event_template(tmp_path: Path) -> None:
    """The corrected datasets (logpai/logparser's loghub_2k_corrected) name the true event by its template; the
    older file beside it, whose event ids disagree, is not read."""
    write_dataset(tmp_path, "Shop", [("E1", "user bob not found"), ("E2", "user alice not found")])
    folder = tmp_path / "Shop"
    with (folder / "Shop_2k.log_structured_corrected.csv").open("w", encoding="utf-8", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["LineId", "Content", "EventId", "EventTemplate"])
        writer.writerow([1, "user bob not found", "E1", "user <*> not found"])
        writer.writerow([2, "user alice not found", "E9", "user <*> not found"])

    results = loghub(tmp_path)

    assert results["Shop"]["causes"] == 1
    assert results["Shop"]["accuracy"] == 1.0
