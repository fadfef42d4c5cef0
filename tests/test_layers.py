"""The layer rule, read from the source (every import statement, at module level, inside functions and under
TYPE_CHECKING alike): storage <- tasks <- flows, and the stage packages never reach up into evaluation. Inside
flows/: config <- orchestration <- cli (migrations beside them, called by the cli), and Prefect only under
orchestration/ (and the compatibility modules that re-export its flows)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import REPO

PACKAGES = {"flows": "clipcache.flows", "tasks": "clipcache.tasks", "storage": "clipcache.storage"}

# (importing package prefix, forbidden imported prefix, why)
RULES = [
    ("clipcache.storage", "clipcache.tasks", "storage imports nothing above it"),
    ("clipcache.storage", "clipcache.flows", "storage imports nothing above it"),
    ("clipcache.storage", "prefect", "only flows/ imports Prefect"),
    ("clipcache.tasks", "clipcache.flows", "tasks never import flows"),
    ("clipcache.tasks", "prefect", "only flows/ imports Prefect"),
    *[(f"clipcache.tasks.{stage}", "clipcache.tasks.evaluation", "the stages sit below the evaluation tasks")
      for stage in ("encode", "score", "datasets", "models", "convert")],
    ("clipcache.tasks.score", "clipcache.tasks.models", "scoring sees arrays and ids, never a model"),
    ("clipcache.tasks.score", "clipcache.tasks.encode", "scoring sees arrays and ids, never the encoder"),
    *[(f"clipcache.flows.{low}", f"clipcache.flows.{high}", f"flows/{low} sits below flows/{high}")
      for low, high in (("config", "orchestration"), ("config", "cli"), ("config", "migrations"),
                        ("orchestration", "cli"), ("orchestration", "migrations"),
                        ("migrations", "cli"), ("migrations", "orchestration"))],
    *[(f"clipcache.flows.{package}", "prefect", "Prefect runs under flows/orchestration only")
      for package in ("cli", "config", "migrations")],
]


def module_name(path: Path) -> str:
    top, *rest = path.relative_to(REPO).with_suffix("").parts
    parts = [PACKAGES[top], *rest]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in the file (or in ``source``, read as that file); relative
    imports resolved against its package."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = []
    text = path.read_text(encoding="utf-8") if source is None else source
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            found.append((node.lineno, target))
            found += [(node.lineno, f"{target}.{alias.name}") for alias in node.names]
    return found


def sources() -> list[Path]:
    return sorted(p for top in PACKAGES for p in (REPO / top).rglob("*.py"))


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


@pytest.mark.parametrize("importer,forbidden,why", RULES, ids=[f"{a}-x-{b}" for a, b, _ in RULES])
def test_layer_rule(importer, forbidden, why):
    violations = [f"{p.relative_to(REPO)}:{line} imports {target}" for p in sources()
                  if under(module_name(p), importer) for line, target in imports_of(p) if under(target, forbidden)]
    assert not violations, f"{why}:\n" + "\n".join(violations)


def test_the_rule_reads_every_kind_of_import():
    """A check that cannot see is worse than none: function-level, TYPE_CHECKING and relative imports count."""
    source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from clipcache.flows import cli\n"
              "def f():\n    import prefect\n    from ..evaluation import base\n")
    found = [t for _, t in imports_of(REPO / "tasks" / "score" / "probe.py", source)]
    assert "clipcache.flows.cli" in found and "prefect" in found and "clipcache.tasks.evaluation.base" in found


def test_the_import_root_is_static():
    """clipcache.{flows,tasks,storage} resolve on disk (committed links), not only through the editable install's
    import hook, and lint may not take an unresolved internal import as Any."""
    import tomllib

    for name in ("flows", "tasks", "storage"):
        link = REPO / "clipcache" / name
        assert link.is_symlink() and link.resolve() == (REPO / name).resolve(), link
    mypy = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]
    assert "ignore_missing_imports" not in mypy
    for override in mypy.get("overrides", []):
        if override.get("ignore_missing_imports"):
            assert not [m for m in override["module"] if m.split(".")[0] in ("clipcache", "flows", "tasks", "storage")]


def test_flows_modules_sit_in_the_subpackages_that_say_their_job():
    """flows/ holds cli/, config/, orchestration/ and migrations/; the modules left at its top only re-export the
    Prefect flows (the entrypoints older prefect.yaml files name), defining nothing, so the rules above see all code."""
    top = sorted(p.name for p in (REPO / "flows").glob("*.py"))
    assert top == ["__init__.py", "convert.py", "deployments.py", "evaluate.py", "report.py"], top
    for name in top:
        tree = ast.parse((REPO / "flows" / name).read_text(encoding="utf-8"))
        assert all(isinstance(n, ast.Import | ast.ImportFrom | ast.Expr | ast.Assign) for n in tree.body), name
    assert {p.parent.name for p in (REPO / "flows").glob("*/__init__.py")} == {"cli", "config", "orchestration",
                                                                              "migrations"}
