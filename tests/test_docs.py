"""The user docs stay whole and short: every setting the console reads is documented in README.md or docs/, the
README stays a README (under 200 lines), the links between the docs lead somewhere, and no file points to a
document this repository does not hold."""

from __future__ import annotations

import re
from pathlib import Path

from tests.test_env_example import settings_read

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
# A Markdown link or image: [text](target), the target without a title.
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} (.+)$", flags=re.MULTILINE)


def documents() -> list[Path]:
    return [README, ROOT / "CHANGELOG.md", *sorted(DOCS.glob("*.md"))]


def documented_text() -> str:
    return "\n".join(path.read_text(encoding="utf-8") for path in [README, *sorted(DOCS.glob("*.md"))])


def undocumented(names: set[str], text: str) -> set[str]:
    # Whole names only: DLQ_LOGIN_FAILURES_PER_NAME must not pass on DLQ_LOGIN_FAILURES_PER_NAME_AND_ADDRESS.
    return {name for name in names if not re.search(rf"(?<![A-Z0-9_]){name}(?![A-Z0-9_])", text)}


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def broken_links(path: Path) -> list[str]:
    broken = []
    for target in LINK.findall(path.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):
            continue
        file_part, _, anchor = target.partition("#")
        # Images are left out: a screenshot may be added after the text that shows it.
        if file_part.endswith((".png", ".svg", ".jpg")):
            continue
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(target)
        elif anchor and linked.suffix == ".md":
            anchors = {slug(heading) for heading in HEADING.findall(linked.read_text(encoding="utf-8"))}
            if anchor not in anchors:
                broken.append(target)
    return broken


def test_every_setting_read_from_the_environment_is_documented() -> None:
    missing = undocumented(settings_read(), documented_text())

    assert not missing, f"README.md and docs/*.md do not mention {sorted(missing)}"


def test_a_setting_nobody_documented_would_be_found() -> None:
    text = documented_text().replace("DLQ_LOGIN_FAILURES_PER_NAME`", "`")

    assert "DLQ_LOGIN_FAILURES_PER_NAME" in settings_read()
    assert undocumented({"DLQ_LOGIN_FAILURES_PER_NAME"}, text) == {"DLQ_LOGIN_FAILURES_PER_NAME"}


def test_readme_is_under_200_lines() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()

    assert len(lines) < 200, f"README.md has {len(lines)} lines; the long material belongs in docs/"


def test_readme_starts_with_the_two_commands() -> None:
    text = README.read_text(encoding="utf-8")
    first_block = text[text.index("```") : text.index("```", text.index("```") + 3)]

    assert "make run" in first_block
    assert "make test" in first_block


def test_every_doc_starts_with_a_summary_paragraph() -> None:
    for path in sorted(DOCS.glob("*.md")):
        blocks = [block for block in path.read_text(encoding="utf-8").split("\n\n") if block.strip()]

        assert blocks[0].startswith("# "), f"{path.name} does not start with its title"
        assert not blocks[1].startswith(("#", "|", "-", "```")), f"{path.name} has no summary paragraph"


def test_links_between_the_docs_lead_somewhere() -> None:
    broken = {path.name: broken_links(path) for path in documents()}

    assert not any(broken.values()), f"broken links: {broken}"


def test_a_broken_anchor_would_be_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Page\n\nSee [this](#there) and [that](#page).\n", encoding="utf-8")

    assert broken_links(page) == ["#there"]


def test_nothing_points_to_documents_this_repository_does_not_hold() -> None:
    # Built from parts, so that this file does not name them itself.
    absent = re.compile("(?:DESIGN|STYLE)" + r"\.md")
    places = [README, *DOCS.glob("*.md"), ROOT / "CHANGELOG.md", ROOT / ".env.example"]
    for folder in ("dlqconsole", "templates", "tests", "scripts", "bench", "deploy", "static"):
        places += [path for path in (ROOT / folder).rglob("*") if path.is_file() and path.suffix != ".pyc"]
    pointing = [
        str(path.relative_to(ROOT))
        for path in places
        if absent.search(path.read_text(encoding="utf-8", errors="replace"))
    ]

    assert not pointing, f"these point to a document that is not here: {pointing}"
