"""Checks shared by the hostile-input tier (``tests/test_hostile_*.py``, marker ``hostile``, ``make test-hostile``).

A hostile case is a file or name an attacker or a careless user hands clipcache: a model folder that asks to run its
own code, a pickle that runs a payload, a name that walks out of the output folder, a second experiment whose files
would land on the first one's. Each case must end the way the bad-input corpus does (one line on stderr, a non-zero
exit, nothing half-written) and, beyond that:

- no payload runs: the canary file a payload would create is never created (:func:`canary_payload`);
- nothing is written outside the folders the command was given (:func:`Tree` snapshots the whole tmp folder);
- no file of another experiment is replaced (the same snapshot, compared file by file).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from clipcache.flows.cli import main


def canary_payload(canary: Path) -> str:
    """Python source that creates ``canary`` when it runs (what a hostile file would try to execute)."""
    return f"open({str(canary)!r}, 'w').write('pwned')"


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """``clipcache argv`` in-process: (exit code, stdout, stderr); argparse's exits count as exit codes."""
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    captured = capsys.readouterr()
    return int(code or 0), captured.out, captured.err.strip()


def assert_refused(code: int, err: str, phrase: str) -> None:
    """One line on stderr containing ``phrase`` (no traceback), and a non-zero exit."""
    assert code != 0, f"exit 0 (expected a refusal containing {phrase!r})\n{err}"
    assert "Traceback" not in err, err
    assert len(err.splitlines()) == 1, f"not one line:\n{err}"
    assert phrase in err, f"{phrase!r} not in {err!r}"


class Tree:
    """A snapshot of every file under ``root`` (path -> SHA-256), to compare after a command ran."""

    def __init__(self, root: Path):
        self.root = root
        self.files = self._scan()

    def _scan(self) -> dict[Path, str]:
        return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in self.root.rglob("*")
                if p.is_file() and not p.is_symlink()}

    def changes(self) -> tuple[set[Path], set[Path], set[Path]]:
        """(created, modified, removed) since the snapshot."""
        now = self._scan()
        created = set(now) - set(self.files)
        removed = set(self.files) - set(now)
        modified = {p for p in set(now) & set(self.files) if now[p] != self.files[p]}
        return created, modified, removed

    def assert_writes_only_under(self, *folders: Path) -> None:
        """Every file created or modified since the snapshot lies under one of ``folders``."""
        created, modified, _ = self.changes()
        outside = sorted(p for p in created | modified
                         if not any(p.resolve().is_relative_to(f.resolve()) for f in folders))
        assert not outside, f"written outside {[str(f) for f in folders]}: {outside}"

    def assert_unchanged(self, *paths: Path) -> None:
        """The files under ``paths`` (files or folders) are byte for byte what they were."""
        created, modified, removed = self.changes()
        touched = sorted(p for p in created | modified | removed
                         if any(p == q or p.is_relative_to(q) for q in paths))
        assert not touched, f"replaced or changed: {touched}"
