"""scripts/code_metrics.py counts bare ``Any`` parameters: checked on hand-written sources, and the counts the
typed task contract brought down stay down (no session, store or memo parameter typed ``Any`` anywhere)."""

from __future__ import annotations

import importlib.util

from conftest import REPO

spec = importlib.util.spec_from_file_location("code_metrics", REPO / "scripts" / "code_metrics.py")
code_metrics = importlib.util.module_from_spec(spec)
spec.loader.exec_module(code_metrics)

SOURCE = '''
import typing
from typing import Any

def f(a: Any, b: dict[str, Any], c: Any | None, *args: Any, d: typing.Any, e: "Any", **kw: Any) -> Any:
    def inner(x: Any, /, y: int, z=None): ...
    return lambda q: q

class C:
    async def g(self, h: list[Any], i: "Any | None", j: typing.Optional[Any], k: other.Any) -> None: ...
'''


def test_only_parameters_annotated_exactly_any_count():
    found = code_metrics.bare_any_parameters(SOURCE)
    assert sorted((func, name) for _, func, name in found) == [
        ("f", "a"), ("f", "args"), ("f", "d"), ("f", "e"), ("f", "kw"), ("inner", "x")]


def test_each_module_counts_once_not_again_through_a_link(tmp_path):
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "m.py").write_text("def f(a: Any): ...\n")
    (tmp_path / "clipcache").mkdir()
    (tmp_path / "clipcache" / "tasks").symlink_to("../tasks")
    (tmp_path / "clipcache" / "__init__.py").write_text("")
    files = code_metrics.package_files(tmp_path)
    assert [p.relative_to(tmp_path).as_posix() for p in files] == ["clipcache/__init__.py", "tasks/m.py"]


def test_no_session_store_or_memo_parameter_is_bare_any():
    found = [f"{path.relative_to(REPO)}:{line} {func}({name}: Any)"
             for path in code_metrics.package_files(REPO)
             for line, func, name in code_metrics.bare_any_parameters(path.read_text(encoding="utf-8"))
             if name in ("session", "store", "memo", "prepared", "con")]
    assert not found, "type them (EncodeSession, EmbeddingStore, FileHashMemo, Prepared[...], DuckDBPyConnection):\n" + "\n".join(found)
