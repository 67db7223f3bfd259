"""Imports run one way between the apps (the import-linter contracts of pyproject.toml, run by `make lint` and
scripts/test), and inside an app no two modules import each other when they load.

The contracts are checked here on a small package laid out like the console, with one breach in it: that proves
they catch what they are meant to catch, an import inside a function included, where a run on the console
itself only shows that there is nothing to catch today.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "dlqconsole"
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def contracts() -> str:
    """The [tool.importlinter] section of pyproject.toml, as the only content of another pyproject.toml."""
    text = (ROOT / "pyproject.toml").read_text()
    tomllib.loads(text)  # the section below is cut from a file that parses
    return text[text.index("[tool.importlinter]") :]


def lay_out_console(root: Path) -> Path:
    """An empty package named dlqconsole with every module the layers contract names, nothing importing anything."""
    package = root / "dlqconsole"
    for app in ("core", "accounts", "brokers", "deadletters", "ingest", "operations", "alerts", "api"):
        (package / app).mkdir(parents=True)
        (package / app / "__init__.py").write_text("")
        (package / app / "models.py").write_text("")
    for module in ("__init__", "apps", "dashboard", "metrics", "urls", "views", "celery", "checks", "settings", "wsgi"):
        (package / f"{module}.py").write_text("")
    (root / "pyproject.toml").write_text(contracts())
    return package


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=root, env={"PYTHONPATH": str(root)}, capture_output=True, text=True
    )


def test_the_contracts_pass_a_package_that_keeps_them(tmp_path: Path) -> None:
    package = lay_out_console(tmp_path)
    (package / "alerts" / "services.py").write_text("import dlqconsole.deadletters.models\n")
    (package / "dashboard.py").write_text("import dlqconsole.alerts.models\nimport dlqconsole.ingest.models\n")

    result = lint_imports(tmp_path)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 2 kept, 0 broken." in result.stdout


@pytest.mark.parametrize(
    ("module", "source", "breach"),
    [
        (
            "core/helpers.py",
            "def pattern_of(pk):\n    from dlqconsole.deadletters.models import FailurePattern\n",
            "dlqconsole.core.helpers -> dlqconsole.deadletters.models (l.2)",
        ),
        (
            "deadletters/views.py",
            "def quick_retry():\n    import dlqconsole.operations.models\n",
            "dlqconsole.deadletters.views -> dlqconsole.operations.models (l.2)",
        ),
        (
            "ingest/services.py",
            "from dlqconsole.operations.models import *\n",
            "dlqconsole.ingest.services -> dlqconsole.operations.models (l.1)",
        ),
        (
            "alerts/apps.py",
            "def ready():\n    import dlqconsole.metrics\n",
            "dlqconsole.alerts.apps -> dlqconsole.metrics",
        ),
        ("core/env.py", "import dlqconsole.settings\n", "dlqconsole.core.env -> dlqconsole.settings"),
    ],
)
def test_the_contracts_catch_an_import_against_the_layers(
    tmp_path: Path, module: str, source: str, breach: str
) -> None:
    package = lay_out_console(tmp_path)
    (package / module).write_text(source)

    result = lint_imports(tmp_path)

    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 broken" in result.stdout
    assert breach in result.stdout


def test_a_new_app_must_be_given_its_layer(tmp_path: Path) -> None:
    package = lay_out_console(tmp_path)
    (package / "billing").mkdir()
    (package / "billing" / "__init__.py").write_text("")

    result = lint_imports(tmp_path)

    assert result.returncode != 0
    assert "dlqconsole.billing" in result.stdout + result.stderr


# Inside an app ---------------------------------------------------------------------------------------------------


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "migrations" in path.parts:
            continue
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def imported(node: ast.Import | ast.ImportFrom, *, module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The console's modules an import statement loads: the module named, the packages above it, and the
    submodules a `from` names."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level:
            base = module.split(".")[: len(module.split(".")) - node.level + (path.name == "__init__.py")]
            target = ".".join([*base, node.module] if node.module else base)
        else:
            target = node.module or ""
        names = [target, *(f"{target}.{alias.name}" for alias in node.names)]
    loaded = set()
    for name in names:
        parts = name.split(".")
        loaded |= {".".join(parts[:end]) for end in range(2, len(parts) + 1)}
    return {name for name in loaded & set(known) if not module.startswith(f"{name}.") and name != module}


def statements(tree: ast.Module) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement, and whether it runs inside a function. Imports under `if TYPE_CHECKING:` never
    run, so they are left out."""

    def walk(node: ast.AST, in_function: bool) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                yield child, in_function
            elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                yield from (item for branch in child.orelse for item in walk(branch, in_function))
            else:
                nested = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
                yield from walk(child, nested)

    yield from walk(tree, False)


def test_no_two_modules_import_each_other_when_they_load() -> None:
    known = modules()
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        for node, in_function in statements(ast.parse(path.read_text())):
            if not in_function:
                graph[name] |= imported(node, module=name, path=path, known=known)

    assert first_cycle(graph) == []


def first_cycle(graph: dict[str, set[str]]) -> list[str]:
    """The first import cycle met, as the modules along it (the first one again at its end), or []."""
    done: set[str] = set()
    path: list[str] = []

    def visit(name: str) -> list[str]:
        if name in path:
            return [*path[path.index(name) :], name]
        if name in done:
            return []
        path.append(name)
        for target in sorted(graph[name]):
            if found := visit(target):
                return found
        path.pop()
        done.add(name)
        return []

    for name in sorted(graph):
        if found := visit(name):
            return found
    return []


def test_an_import_inside_a_function_says_why() -> None:
    """A module imported where it is used, not where the module loads, says why in a comment just above (a
    service enqueueing its own task, a cycle it breaks, an AppConfig.ready)."""
    known = modules()
    silent = []
    for name, path in known.items():
        lines = path.read_text().splitlines()
        for node, in_function in statements(ast.parse("\n".join(lines))):
            if not in_function or not imported(node, module=name, path=path, known=known):
                continue
            above = node.lineno - 2
            while above >= 0 and (not lines[above].strip() or lines[above].strip().startswith(("from ", "import "))):
                above -= 1
            if above < 0 or not lines[above].strip().startswith("#"):
                silent.append(f"{path.relative_to(ROOT)}:{node.lineno}")

    assert silent == []
