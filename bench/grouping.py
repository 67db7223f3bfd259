"""Grouping quality and speed on the labelled corpus (tests/data/error_corpus.jsonl).

    .venv/bin/python bench/grouping.py                 # accuracy, group F1 and messages/s, per split
    .venv/bin/python bench/grouping.py --show-errors   # also list the train causes that were grouped wrongly
    .venv/bin/python bench/grouping.py --loghub        # instead: grouping accuracy on the Loghub 2k datasets
    .venv/bin/python bench/grouping.py --loghub DIR    # the same on the Loghub 2k datasets in DIR
    .venv/bin/python bench/grouping.py --loghub DIR --show-errors   # also list the events grouped wrongly
    .venv/bin/python bench/grouping.py --against REV   # only the speed: ours and git revision REV's, in turns

Grouping accuracy: the share of messages whose pattern holds exactly the messages of their true cause.
Group F1: a predicted group is right when it equals a true group; precision is the share of predicted groups
that are right, recall the share of true groups found, F1 their harmonic mean. Both are computed for the train
and held-out causes separately (each grouped on its own, as two independent streams) and for everything.
Speed: fingerprinting plus template mining (which includes classifying each distinct template's failure reason)
for the whole corpus in one process, CPU time of the best of several runs. No database is involved:
`assign_patterns` adds a few queries per batch on top of this.

A plain run also compares the speed with the grouping before the rules that generalise (BEFORE_GENERALISING, the
throughput bar of issue 17 is 0.9 times it): both trees group this tree's corpus in separate processes, in turns,
the best run of each counting. Instruction counts (valgrind's callgrind on the same rounds) measure the same work
without the noise of a shared machine, though not its cost in time: docs/performance.md has both.

Grouping must never be tuned on the held-out causes; `--show-errors` shows only train causes. With `--loghub`,
`--show-errors` lists each dataset's wrongly grouped events: keep some datasets out of DIR while tuning and score
them once at the end.

`--loghub DIR` measures the same on public system logs instead of the corpus: the Loghub 2k datasets
(https://github.com/logpai/loghub; not part of this repository). In each `DIR/<Name>/` it reads
`<Name>_2k.log_structured_corrected.csv` (the corrected labels of logpai/logparser's `data/loghub_2k_corrected`,
true cause: the `EventTemplate` column) or else `<Name>_2k.log_structured.csv` (the loghub repository's layout, true
cause: `EventId`), groups each dataset's `Content` lines on their own through `group_lines`, the code path of `dlq
fingerprint`, and prints grouping accuracy (GA) and group F1 per dataset and their mean. Without DIR: the folder
DLQ_LOGHUB_DIR names, else `../shared/data/loghub2k-corrected` beside the checkout. A plain run scores that folder
too when it is there. These logs are not dead-letter errors: they show how grouping copes with text it was not
written for.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# `--code DIR`: time the grouping of the code in DIR (another tree of this repository, as `--against` unpacks it)
# on this tree's corpus.
CODE = Path(sys.argv[sys.argv.index("--code") + 1]).resolve() if "--code" in sys.argv[:-1] else ROOT
sys.path.insert(0, str(CODE))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dlqconsole.settings")

import django  # noqa: E402

django.setup()

from dlqconsole.deadletters.fingerprint import clear_caches, split_error_type  # noqa: E402
from dlqconsole.deadletters.grouping.engine import Grouper, Pattern, group_lines  # noqa: E402

CORPUS = ROOT / "tests" / "data" / "error_corpus.jsonl"
# The grouping before the rules that generalise (docs/grouping.md): what a plain run compares its speed with.
BEFORE_GENERALISING = "c74d891"


def load() -> list[dict[str, str]]:
    with CORPUS.open(encoding="utf-8") as lines:
        return [json.loads(line) for line in lines]


def prepare(rows: list[dict[str, str]]) -> list[tuple[str, str]]:
    """(error type, message) as ingest reads them: a message printed as "Type: message" is split."""
    return [
        (row["error_type"], row["message"]) if row["error_type"] else split_error_type(row["message"]) for row in rows
    ]


def group(rows: list[dict[str, str]], prepared: list[tuple[str, str]] | None = None) -> list[str]:
    """The pattern key of each row, all rows mined together."""
    grouper = Grouper()
    keys = [
        grouper.add(error_type=error_type, message=message, stack_trace=row["stack_trace"])
        for row, (error_type, message) in zip(rows, prepared or prepare(rows), strict=True)
    ]
    patterns = grouper.patterns()
    return [patterns[key].key for key in keys]


def score(truth: list[str], predicted: list[str]) -> dict[str, float]:
    true_groups: dict[str, set[int]] = defaultdict(set)
    predicted_groups: dict[str, set[int]] = defaultdict(set)
    for index, (cause, pattern) in enumerate(zip(truth, predicted, strict=True)):
        true_groups[cause].add(index)
        predicted_groups[pattern].add(index)
    exact = {frozenset(members) for members in true_groups.values()}
    right_messages = sum(len(members) for members in predicted_groups.values() if frozenset(members) in exact)
    right_groups = sum(1 for members in predicted_groups.values() if frozenset(members) in exact)
    precision = right_groups / len(predicted_groups)
    recall = right_groups / len(true_groups)
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {
        "messages": len(truth),
        "causes": len(true_groups),
        "patterns": len(predicted_groups),
        "accuracy": right_messages / len(truth),
        "group_precision": precision,
        "group_recall": recall,
        "group_f1": f1,
    }


def show_errors(rows: list[dict[str, str]], predicted: list[str]) -> None:
    by_cause: dict[str, set[str]] = defaultdict(set)
    by_pattern: dict[str, set[str]] = defaultdict(set)
    examples: dict[str, str] = {}
    for row, pattern in zip(rows, predicted, strict=True):
        by_cause[row["cause"]].add(pattern)
        by_pattern[pattern].add(row["cause"])
        examples.setdefault(row["cause"], (row["error_type"] + " | " + row["message"])[:300])
    for cause in sorted(by_cause):
        patterns = by_cause[cause]
        mixed = sorted({other for pattern in patterns for other in by_pattern[pattern]} - {cause})
        if len(patterns) > 1 or mixed:
            print(f"- {cause}: split into {len(patterns)} pattern(s); mixed with {mixed}")
            print(f"    {examples[cause]!r}")


def speed(rows: list[dict[str, str]], rounds: int) -> float:
    """Messages per second for fingerprinting and mining, CPU time of this process in the best run (so other
    load on the machine counts as little as possible)."""
    prepared = prepare(rows)
    best = float("inf")
    for _ in range(rounds):
        clear_caches()
        started = time.process_time()
        group(rows, prepared)
        best = min(best, time.process_time() - started)
    return len(rows) / best


def has_revision(reference: str) -> bool:
    """Whether this tree is a git checkout that holds `reference` (a clone does; an unpacked archive does not)."""
    found = subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "-e", f"{reference}^{{commit}}"], capture_output=True, check=False
    )
    return found.returncode == 0


def against(reference: str, rounds: int, runs: int) -> dict[str, float]:
    """Messages per second of this tree's grouping and of the grouping at git revision `reference`, on this tree's
    corpus, measured in turns (ours, theirs, ours, ...; `runs` each, the best counts) so that both see the same
    machine (each side first in every other pair); and their ratio."""
    with tempfile.TemporaryDirectory(prefix="grouping-against-") as folder:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", reference], check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", folder], input=archive.stdout, check=True)
        ours = theirs = 0.0
        for run in range(runs):
            # Ours first, then theirs first, and so on: whichever side runs first in a pair is not always the same.
            for code in (ROOT, Path(folder)) if run % 2 == 0 else (Path(folder), ROOT):
                command = [sys.executable, str(Path(__file__)), "--speed-only", "--rounds", str(rounds)]
                result = subprocess.run([*command, "--code", str(code)], check=True, capture_output=True, text=True)
                speed_of_run = float(result.stdout.strip())
                if code == ROOT:
                    ours = max(ours, speed_of_run)
                else:
                    theirs = max(theirs, speed_of_run)
    return {"messages_per_second": ours, "reference_messages_per_second": theirs, "ratio": ours / theirs}


def show_loghub_errors(name: str, rows: list[tuple[str, str]], patterns: list[Pattern]) -> None:
    """The events of one dataset that were split over several patterns or share one with another event, with
    the template and an example line of each of their patterns."""
    by_event: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    by_pattern: dict[str, set[str]] = defaultdict(set)
    for index, ((event, _), pattern) in enumerate(zip(rows, patterns, strict=True)):
        by_event[event][pattern.key].append(index)
        by_pattern[pattern.key].add(event)
    for event in sorted(by_event):
        groups = by_event[event]
        mixed = sorted({other for key in groups for other in by_pattern[key]} - {event})
        if len(groups) > 1 or mixed:
            print(f"- {name} {event}: split into {len(groups)} pattern(s); mixed with {mixed}")
            for members in groups.values():
                first = members[0]
                print(f"    [{len(members)}] {patterns[first].template[:160]!r}  e.g. {rows[first][1][:160]!r}")


DEFAULT_LOGHUB = Path(os.environ.get("DLQ_LOGHUB_DIR") or ROOT.parent / "shared" / "data" / "loghub2k-corrected")


def loghub_files(directory: Path) -> list[tuple[str, Path, str]]:
    """(dataset name, file, column of the true cause) of every dataset under `directory`, corrected labels first."""
    found = []
    for folder in sorted(path for path in directory.iterdir() if path.is_dir()) if directory.is_dir() else []:
        name = folder.name
        for file_name, truth in (
            (f"{name}_2k.log_structured_corrected.csv", "EventTemplate"),
            (f"{name}_2k.log_structured.csv", "EventId"),
        ):
            if (folder / file_name).is_file():
                found.append((name, folder / file_name, truth))
                break
    return found


def loghub(directory: Path, *, errors: bool = False) -> dict[str, dict[str, float]]:
    """{dataset name: scores} for every dataset under `directory`, by name."""
    results: dict[str, dict[str, float]] = {}
    for name, path, truth in loghub_files(directory):
        with path.open(encoding="utf-8", newline="") as lines:
            rows = [(row[truth], row["Content"]) for row in csv.DictReader(lines)]
        if not rows:
            continue
        clear_caches()
        patterns = group_lines([content for _, content in rows])
        results[name] = score([event for event, _ in rows], [pattern.key for pattern in patterns])
        if errors:
            show_loghub_errors(name, rows, patterns)
    return results


def print_loghub(results: dict[str, dict[str, float]]) -> None:
    if not results:
        print("no <Name>/<Name>_2k.log_structured_corrected.csv or <Name>_2k.log_structured.csv found")
        return
    for name, numbers in results.items():
        print(
            f"{name:<12} lines={numbers['messages']:<5} events={numbers['causes']:<4} "
            f"groups={numbers['patterns']:<4} GA={numbers['accuracy']:.3f} F1={numbers['group_f1']:.3f}"
        )
    accuracy = sum(numbers["accuracy"] for numbers in results.values()) / len(results)
    f1 = sum(numbers["group_f1"] for numbers in results.values()) / len(results)
    print(f"{'mean':<12} datasets={len(results)} GA={accuracy:.3f} F1={f1:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--show-errors", action="store_true", help="List wrongly grouped train causes.")
    parser.add_argument(
        "--rounds",
        type=int,
        default=20,
        help="Timing runs (the best one counts; each takes about a tenth of a second).",
    )
    parser.add_argument("--json", action="store_true", help="Print the results as JSON.")
    parser.add_argument(
        "--against",
        metavar="REVISION",
        help="Only the speed: this tree's grouping and that of a git revision, in turns, and their ratio.",
    )
    parser.add_argument(
        "--runs", type=int, default=5, help="With --against: runs of each side, in turns (the best counts)."
    )
    parser.add_argument("--speed-only", action="store_true", help="Print only the messages per second.")
    parser.add_argument("--code", type=Path, metavar="DIR", help="Time the grouping code in DIR (for --against).")
    parser.add_argument(
        "--loghub",
        type=Path,
        nargs="?",
        const=DEFAULT_LOGHUB,
        metavar="DIR",
        help=f"Score the Loghub 2k datasets under DIR (default {DEFAULT_LOGHUB}) instead of the corpus.",
    )
    options = parser.parse_args()

    if options.speed_only:
        if hasattr(os, "sched_setaffinity"):
            # One core for the whole run (the last): a process moved between cores in the middle of a round runs
            # slower for a while, and that is noise in a comparison.
            os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
        print(f"{speed(load(), options.rounds):.1f}")
        return
    if options.against:
        # More rounds than a plain run: the best of 20 still moves by a few percent from run to run.
        compared = against(options.against, max(options.rounds, 40), options.runs)
        if options.json:
            print(json.dumps(compared, indent=2))
        else:
            print(
                f"speed: fingerprint + merge {compared['messages_per_second']:,.0f} msg/s, "
                f"{options.against} {compared['reference_messages_per_second']:,.0f} msg/s "
                f"(same corpus, in turns): ratio {compared['ratio']:.3f}"
            )
        return
    if options.loghub is not None:
        by_dataset = loghub(options.loghub, errors=options.show_errors)
        if options.json:
            print(json.dumps(by_dataset, indent=2))
        else:
            print_loghub(by_dataset)
        return

    rows = load()
    results: dict[str, dict[str, float]] = {}
    for split in ("train", "heldout"):
        part = [row for row in rows if row["split"] == split]
        predicted = group(part)
        results[split] = score([row["cause"] for row in part], predicted)
        if options.show_errors and split == "train":
            show_errors(part, predicted)
    results["all"] = score([row["cause"] for row in rows], group(rows))
    results["all"]["messages_per_second"] = speed(rows, options.rounds)

    if options.json:
        print(json.dumps(results, indent=2))
        return
    for split, numbers in results.items():
        line = (
            f"{split:<8} messages={numbers['messages']:<5} causes={numbers['causes']:<4} "
            f"patterns={numbers['patterns']:<4} accuracy={numbers['accuracy']:.3f} "
            f"group_f1={numbers['group_f1']:.3f} (precision {numbers['group_precision']:.3f}, "
            f"recall {numbers['group_recall']:.3f})"
        )
        if "messages_per_second" in numbers:
            line += f"\nspeed: fingerprint + merge {numbers['messages_per_second']:,.0f} msg/s"
        print(line)
    if has_revision(BEFORE_GENERALISING):
        compared = against(BEFORE_GENERALISING, max(options.rounds, 40), options.runs)
        print(
            f"speed before the rules that generalise ({BEFORE_GENERALISING}, same corpus, in turns): "
            f"{compared['reference_messages_per_second']:,.0f} msg/s; ours {compared['messages_per_second']:,.0f} "
            f"msg/s, ratio {compared['ratio']:.3f} (bar 0.9)"
        )
    every = results.values()
    quality = all(numbers["accuracy"] >= 0.95 and numbers["group_f1"] >= 0.90 for numbers in every)
    fast = results["all"]["messages_per_second"] >= 20_000
    print(f"target: accuracy >= 0.95 and group F1 >= 0.90 in every split -> {'OK' if quality else 'MISSED'}")
    print(f"target: >= 20,000 msg/s in one process -> {'OK' if fast else 'MISSED'}")
    if loghub_files(DEFAULT_LOGHUB):
        print(f"\nLoghub 2k, {DEFAULT_LOGHUB}:")
        print_loghub(loghub(DEFAULT_LOGHUB))


if __name__ == "__main__":
    main()
