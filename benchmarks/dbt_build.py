"""The dbt build of `clipcache report` (tasks/report/dbt_build.py): wall and CPU time of the report's build (models
and data tests, the suites' intervals) against the same build with the project's unit tests, which a report leaves
out, in one process, alternating, each in a fresh copy of the warehouse (so dbt parses the project in full, as in a
first report of a folder). Then, once each, a build in a process of its own (imports included, as `clipcache report`
pays them) and a second build of the same folder (dbt's partial parsing: the project unchanged, nothing re-parsed).

    python benchmarks/dbt_build.py --output_dir outputs --repeats 3
"""

from __future__ import annotations

import argparse
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _fresh(warehouse: Path, scratch: Path) -> Path:
    out = Path(tempfile.mkdtemp(dir=scratch)) / "out"
    shutil.copytree(warehouse, out / "warehouse")
    return out


def _timed(out: Path, *, unit_tests: bool) -> tuple[float, float]:
    from clipcache.tasks.report.dbt_build import dbt_build

    wall, cpu = time.perf_counter(), _cpu()
    dbt_build(out, unit_tests=unit_tests)
    return time.perf_counter() - wall, _cpu() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output_dir", required=True, help="an output folder with a warehouse/ (it is only read)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    warehouse = Path(args.output_dir) / "warehouse"
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        out = _fresh(warehouse, scratch)
        code = ("import sys, time; t = time.perf_counter(); from clipcache.tasks.report.dbt_build import dbt_build; "
                "dbt_build(sys.argv[1]); print(time.perf_counter() - t)")
        started = time.perf_counter()
        alone = float(subprocess.run([sys.executable, "-c", code, str(out)], check=True, capture_output=True,
                                     text=True).stdout)
        print(f"a build in a process of its own (imports included): {alone:.1f} s "
              f"({time.perf_counter() - started:.1f} s with the interpreter's start)")
        again = _timed(out, unit_tests=False)  # this process's imports and dbt's JSON schemas are paid here too
        again = _timed(out, unit_tests=False)
        print(f"a second build of the same folder (partial parsing): {again[0]:.1f} s, CPU {again[1]:.1f} s")
        sides: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        for _ in range(args.repeats):
            for unit_tests in (True, False):
                sides[unit_tests].append(_timed(_fresh(warehouse, scratch), unit_tests=unit_tests))
        for unit_tests, name in ((True, "with the unit tests"), (False, "the report's build")):
            walls, cpus = sorted(w for w, _ in sides[unit_tests]), sorted(c for _, c in sides[unit_tests])
            print(f"{name}: wall median {walls[len(walls) // 2]:.1f} s, CPU median {cpus[len(cpus) // 2]:.2f} s")
        ratio = sorted(c for _, c in sides[False])[args.repeats // 2] / sorted(c for _, c in sides[True])[
            args.repeats // 2]
        print(f"report's build / with unit tests, CPU: {ratio:.2f}x")


if __name__ == "__main__":
    main()
