"""The templates' own djLint rule (.djlint_rules.yaml): lines of at most 120 characters, except a line that holds
one attribute alone, whose value (a title, a confirm text, an address) cannot break without changing the page."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def lint(tmp_path: Path, text: str) -> str:
    page = tmp_path / "page.html"
    page.write_text(text)
    djlint = str(Path(sys.executable).parent / "djlint")
    found = subprocess.run(
        [djlint, str(page), "--lint", "--profile", "django", "--rules", str(ROOT / ".djlint_rules.yaml")],
        capture_output=True,
        text=True,
        check=False,
    )
    return found.stdout


def test_a_line_over_120_characters_is_flagged(tmp_path: Path) -> None:
    report = lint(tmp_path, "<p>" + "x" * 114 + "</p>\n<p>" + "x" * 113 + "</p>\n")

    assert "L001 1:" in report  # 121 characters
    assert "L001 2:" not in report  # 120


def test_a_long_attribute_alone_on_its_line_is_not_flagged(tmp_path: Path) -> None:
    confirm = "Delete this channel and the history of every alert it was told of? " * 3
    address = "/messages/?queue=" + "q" * 120
    report = lint(
        tmp_path,
        f'<form method="post"\n      data-confirm="{confirm}">\n</form>\n'
        f'<a href="{address}">\n  x</a>\n<a href="{address}">x</a>\n',
    )

    assert "L001 2:" not in report and "L001 4:" not in report
    assert "L001 6:" in report  # the tag's text after it: the line can break before the text
