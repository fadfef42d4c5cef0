"""Count the package's bare ``Any`` parameters: function parameters annotated exactly ``Any`` (``x: Any``,
``*args: Any``, ``**kwargs: Any``; also ``typing.Any`` and the string ``"Any"``). A parameter typed ``dict[str, Any]``
or ``Any | None`` is not bare: it says what the container or the absence is.

    python scripts/code_metrics.py            # the total, then the names counted most often
    python scripts/code_metrics.py --files    # and the count per file
    python scripts/code_metrics.py --root ../other-checkout   # another checkout of the repository

It reads the source with ``ast`` (nothing is imported), from the package's folders ``flows/``, ``tasks/`` and
``storage/`` and ``clipcache/`` itself (not through the ``clipcache/{flows,tasks,storage}`` links, so nothing counts
twice). docs/architecture.md records what it printed before and after the task contract was typed (issue 41).
"""

from __future__ import annotations

import argparse
import ast
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FOLDERS = ("clipcache", "flows", "tasks", "storage")


def is_bare_any(annotation: ast.expr | None) -> bool:
    if isinstance(annotation, ast.Name):
        return annotation.id == "Any"
    if isinstance(annotation, ast.Attribute):
        return annotation.attr == "Any" and isinstance(annotation.value, ast.Name) and annotation.value.id == "typing"
    if isinstance(annotation, ast.Constant):
        return annotation.value == "Any"
    return False


def bare_any_parameters(source: str) -> list[tuple[int, str, str]]:
    """(line, function, parameter) of every parameter annotated exactly ``Any`` in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        args = node.args
        params = [*args.posonlyargs, *args.args, *args.kwonlyargs,
                  *(a for a in (args.vararg, args.kwarg) if a is not None)]
        found += [(node.lineno, node.name, p.arg) for p in params if is_bare_any(p.annotation)]
    return found


def package_files(repo: Path = REPO) -> list[Path]:
    """The package's modules, each once: a path through a link (clipcache/tasks -> ../tasks) is left out."""
    def linked(path: Path) -> bool:
        parts = path.relative_to(repo).parts
        return any((repo.joinpath(*parts[:i])).is_symlink() for i in range(1, len(parts)))

    return sorted(p for folder in FOLDERS for p in (repo / folder).rglob("*.py") if not linked(p))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", action="store_true", help="print the count per file")
    parser.add_argument("--root", type=Path, default=REPO, help="the checkout to measure (default: this one)")
    args = parser.parse_args()
    root = args.root.resolve()
    per_file: dict[str, list[tuple[int, str, str]]] = {}
    for path in package_files(root):
        hits = bare_any_parameters(path.read_text(encoding="utf-8"))
        if hits:
            per_file[str(path.relative_to(root))] = hits
    names = Counter(name for hits in per_file.values() for _, _, name in hits)
    print(f"bare Any parameters: {sum(len(h) for h in per_file.values())} in {len(per_file)} files")
    print("most often: " + ", ".join(f"{name}: Any x{n}" for name, n in names.most_common(8)))
    if args.files:
        for file, hits in sorted(per_file.items(), key=lambda kv: -len(kv[1])):
            print(f"{len(hits):4d}  {file}")


if __name__ == "__main__":
    main()
