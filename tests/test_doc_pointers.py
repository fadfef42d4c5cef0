"""Every module, attribute and source file the docs name exists: a renamed module must not leave a stale pointer."""

from __future__ import annotations

import importlib
import re

import pytest

from conftest import REPO

DOCS = sorted([REPO / "README.md", REPO / "CONTRIBUTING.md", *(REPO / "docs").glob("*.md")])
DOTTED = re.compile(r"(?<![\w/.-])clipcache(?:\.[A-Za-z_]\w*)+")
FILES = re.compile(r"(?<![\w/.-])((?:flows|tasks|storage|tests|benchmarks|scripts|dbt_reports|examples|docs)"
                   r"/[\w./*-]*[\w*])(?::(\w+))?")
# entry-point groups and file names that read like dotted module paths
NOT_MODULES = {"clipcache.datasets", "clipcache.tasks", "clipcache.models", "clipcache.loaders", "clipcache.html",
               "clipcache.egg", "clipcache.api_formats", "clipcache.dataset_sources",
               "clipcache.flow"}  # entry-point groups, file names and the flows' logger (log lines quoted in docs)


def mentions(pattern: re.Pattern) -> list[tuple[str, str]]:
    return sorted({(doc.name, m.group(0).rstrip(".")) for doc in DOCS for m in pattern.finditer(doc.read_text())})


def resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


@pytest.mark.parametrize("doc,dotted", [m for m in mentions(DOTTED) if m[1] not in NOT_MODULES])
def test_named_module_or_attribute_exists(doc, dotted):
    assert resolves(dotted), f"{doc} names {dotted}, which does not import"


@pytest.mark.parametrize("doc,pointer", mentions(FILES))
def test_named_file_exists(doc, pointer):
    path, _, attr = pointer.partition(":")
    target = REPO / path
    assert target.exists() or any(REPO.glob(path)), f"{doc} names {path}, which does not exist"
    if attr and target.suffix == ".py":
        assert re.search(rf"^\s*(def|class|async def)\s+{attr}\b|^{attr}\s*[:=]", target.read_text(), re.M), \
            f"{doc} names {pointer}: no {attr} in {path}"


MODULE_ROLE = re.compile(r":mod:`((?:flows|tasks|storage|clipcache)(?:\.\w+)+)`")


@pytest.mark.parametrize("source,dotted", sorted({
    (str(p.relative_to(REPO)), m.group(1)) for top in ("flows", "tasks", "storage") for p in (REPO / top).rglob("*.py")
    for m in MODULE_ROLE.finditer(p.read_text(encoding="utf-8"))}))
def test_modules_named_in_docstrings_exist(source, dotted):
    name = dotted if dotted.startswith("clipcache.") else f"clipcache.{dotted}"
    assert resolves(name), f"{source} names {dotted}, which does not import"


def test_docs_point_only_inside_the_repository():
    outside = [(doc.name, m.group(0)) for doc in DOCS
               for m in re.finditer(r"/work/\S+|\.\./(?:shared|\.library)\S*", doc.read_text())]
    assert not outside, outside
