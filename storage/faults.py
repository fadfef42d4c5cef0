"""Fail points for the fault-injection tests (tests/test_faults.py), in the manner of FreeBSD's fail points.

``CLIPCACHE_FAULT=<point>:<n>`` kills this process with SIGKILL (no clean-up, no atexit: a power cut as far as the
files are concerned) the n-th time it reaches ``point``. ``CLIPCACHE_FAULT=census:<file>`` appends the name of every
point reached to ``file`` instead, so a test can pick seeded kill points among those a run really passes. Unset (as
it always is outside those tests) a point costs one global lookup.

Points: ``encode-rows`` (rows written to a partial entry, its progress not yet), ``encode-commit`` (progress
written), ``publish`` (a complete entry's metadata written, not yet renamed into place), ``atomic-write`` (a result
file, Parquet part or BEIR file fully written beside its final name, not yet renamed), ``pair-done`` (one
evaluation's results written, the run's row not yet), ``caption`` (a caption received, not yet appended to the
caption cache).
"""

from __future__ import annotations

import os
import signal

_SPEC = os.environ.get("CLIPCACHE_FAULT")
_seen: dict[str, int] = {}


def point(name: str) -> None:
    if _SPEC is None:
        return
    target, _, arg = _SPEC.partition(":")
    if target == "census":
        with open(arg, "a", encoding="utf-8") as f:
            f.write(name + "\n")
        return
    if target != name:
        return
    _seen[name] = _seen.get(name, 0) + 1
    if _seen[name] == int(arg or 1):
        os.kill(os.getpid(), signal.SIGKILL)
