"""Start the clipcache CLI as a forked child of a process that has already imported torch, torchvision,
transformers, open_clip and the other libraries a run imports (the fault-injection tests run it dozens of times;
those imports are ~8 s of each start on a 2-core machine, the run itself 2-3 s).

The forked child is a real process of its own: a fail point's SIGKILL kills it and nothing else, its files are
written by its own file descriptors, and its exit status comes back as ``subprocess.run`` reports it (``-9`` for
SIGKILL). What changes from a fresh interpreter is only which modules are already in memory, and those are chosen
to read nothing per run at import: Prefect and everything that reads ``PREFECT_*`` variables are imported by the
child, after its environment and working folder are set (the zygote refuses to serve if a preloaded module imported
Prefect). clipcache's own modules are preloaded too (~0.7 s of CPU of each ~2.5 s run: a third of a fault case's
start-ups), except that the one module that reads a ``CLIPCACHE_*`` variable at import, ``clipcache.storage.faults``
(``CLIPCACHE_FAULT``), is executed again in the child once its environment is set (READ_AT_IMPORT); every other
``CLIPCACHE_*`` variable is read when it is used.

The zygote runs no Python thread besides its main one (checked at start-up): forking a process that runs threads can
copy a lock held by a thread that does not exist in the child. (NumPy's OpenBLAS starts an idle native worker at
import; OpenBLAS re-initialises its pool after a fork, as every ``multiprocessing`` fork of a NumPy process relies
on.) Each request is one connection: the zygote forks a waiter, the waiter forks the CLI, reports its pid, waits for
it and reports the exit status.

    zygote = Zygote()                       # ~8 s, once
    done = zygote.run(["eval", ...], cwd, env, timeout=300)   # a subprocess.CompletedProcess
    child = zygote.start([...], cwd, env, script=path)        # `python path ...`, not waited for (pid, poll, kill)
    zygote.close()
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import uuid
from importlib.metadata import entry_points
from pathlib import Path

PRELOAD = ("numpy", "PIL.Image", "torch", "torchvision", "transformers", "open_clip",
           # what every eval, encode or convert run imports besides clipcache (~1 s of each start): none of them reads
           # a CLIPCACHE_* or PREFECT_* variable at import
           "pydantic", "zarr", "numcodecs", "fsspec", "pyarrow", "pyarrow.parquet", "rich.console", "rich.table",
           "cloudpickle", "msgpack", "numpy.ma", "pyarrow.compute", "pyarrow.json", "rich.progress",
           # clipcache's modules that an eval, encode or convert run imports (none imports Prefect: checked at start-up)
           "clipcache.flows.cli.app", "clipcache.flows.config.params", "clipcache.flows.orchestration.pipeline",
           "clipcache.tasks.score.stage", "clipcache.tasks.encode.stage", "clipcache.tasks.models.resolve",
           "clipcache.tasks.models.open_clip_model", "clipcache.tasks.datasets.shapes")
# Modules that read the environment when imported: executed again in each child, after its environment is set (a
# reload runs the module's code again in the same namespace, so the functions other modules hold see the new values).
READ_AT_IMPORT = ("clipcache.storage.faults",)


class Zygote:
    def __init__(self, *, preload: tuple[str, ...] = ()) -> None:
        """``preload``: modules to import besides PRELOAD (e.g. what the API clients of a convert run import)."""
        self._dir = tempfile.TemporaryDirectory(prefix="clipcache-zygote-")
        self._address = str(Path(self._dir.name) / "socket")
        self._proc = subprocess.Popen([sys.executable, __file__, self._address, *preload], stdin=subprocess.DEVNULL,
                                      stdout=subprocess.PIPE, text=True)
        assert self._proc.stdout is not None
        ready = self._proc.stdout.readline().strip()
        if ready != "ready":
            self.close()
            raise RuntimeError(f"the CLI zygote did not start: {ready!r}")

    def run(self, argv: list[str], cwd: Path, env: dict[str, str], timeout: float,
            fsize: int | None = None) -> subprocess.CompletedProcess:
        """``fsize``: a file-size limit (RLIMIT_FSIZE, bytes) set in the CLI process, as a ``preexec_fn`` would."""
        child = self.start(argv, cwd, env, fsize=fsize)
        try:
            out, err = child.communicate(timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            raise subprocess.TimeoutExpired(["clipcache", *argv], timeout) from None
        return subprocess.CompletedProcess(["clipcache", *argv], child.returncode, out, err)

    def start(self, argv: list[str], cwd: Path, env: dict[str, str], *, fsize: int | None = None,
              script: Path | None = None) -> Child:
        """The CLI (or ``python SCRIPT ARGV...`` when ``script`` is given) started and not waited for: a handle
        like ``subprocess.Popen``'s (pid, poll, wait, send_signal, communicate)."""
        name = uuid.uuid4().hex
        out, err = Path(self._dir.name) / f"{name}.out", Path(self._dir.name) / f"{name}.err"
        request = {"argv": argv, "cwd": str(cwd), "env": env, "stdout": str(out), "stderr": str(err), "fsize": fsize,
                   "script": str(script) if script is not None else None}
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(self._address)
        conn.sendall(json.dumps(request).encode() + b"\n")
        return Child(conn, out, err)

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()
        self._dir.cleanup()


class Child:
    """A process forked by the zygote: its pid, and its exit status once the zygote's waiter reports it (read by a
    thread of this process, so that ``poll`` never blocks)."""

    def __init__(self, conn: socket.socket, out: Path, err: Path) -> None:
        self._conn, self._out, self._err = conn, out, err
        self._lines = conn.makefile("r")
        self.pid = int(json.loads(self._lines.readline())["pid"])
        self.returncode: int | None = None
        self._reader = threading.Thread(target=self._read_status, daemon=True)
        self._reader.start()

    def _read_status(self) -> None:
        try:
            answer = self._lines.readline()
            self.returncode = int(json.loads(answer)["returncode"]) if answer else -1  # the waiter died unreported
        finally:
            self._lines.close()
            self._conn.close()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._reader.join(timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(str(self.pid), timeout or 0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Waits, then the process's whole stdout and stderr (like ``Popen.communicate``)."""
        self.wait(timeout)
        texts = [p.read_text(errors="replace") if p.exists() else "" for p in (self._out, self._err)]
        for p in (self._out, self._err):
            p.unlink(missing_ok=True)
        return texts[0], texts[1]


# --- the zygote process ---------------------------------------------------------------------------------------


def _cli(request: dict) -> int:
    """Runs in the forked CLI process: what ``clipcache <argv>`` would do, then exit without returning."""
    code = 1
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for name in READ_AT_IMPORT:
            if name in sys.modules:
                importlib.reload(sys.modules[name])
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        if request.get("fsize") is not None:  # after the redirections: their files are not limited by it
            import resource

            resource.setrlimit(resource.RLIMIT_FSIZE, (request["fsize"], request["fsize"]))
        if request.get("script"):  # python SCRIPT ARGV...
            import runpy

            sys.argv = [request["script"], *request["argv"]]
            runpy.run_path(request["script"], run_name="__main__")
            code = 0
        else:
            sys.argv = ["clipcache", *request["argv"]]
            from clipcache.flows.cli import main

            code = main(request["argv"])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # what the interpreter would print before exiting 1
        import traceback

        traceback.print_exc()
    finally:
        try:
            import atexit

            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _serve(address: str, preload: list[str]) -> None:
    for name in (*PRELOAD, *preload):
        __import__(name)
    with contextlib.suppress(ImportError):  # pydantic's once-per-process scan of the installed packages for plugins
        from pydantic.plugin._loader import get_plugins  # (~0.7 s of each start, at its first model class)

        get_plugins()
    # importlib.metadata's scan of the installed packages, cached per folder and checked against the folder's mtime:
    # a child's read of clipcache's plugin entry points then costs what a warm scan costs (~0.1 s of each start)
    entry_points(group="clipcache.models")
    if read_prefect := sorted(m for m in sys.modules if m == "prefect" or m.startswith("prefect.")):
        print(f"a preloaded module imported {read_prefect[0]}, which reads PREFECT_* variables at import", flush=True)
        return
    if threading.active_count() != 1:
        print(f"{threading.active_count()} Python threads after the imports; forking would be unsafe", flush=True)
        return
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(address)
    server.listen(16)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # waiters are reaped by the kernel
    print("ready", flush=True)
    while True:
        conn, _ = server.accept()
        if os.fork() == 0:  # the waiter
            server.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            request = json.loads(conn.makefile("r").readline())
            pid = os.fork()
            if pid == 0:
                conn.close()
                _cli(request)
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            _, status = os.waitpid(pid, 0)
            conn.sendall(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
            os._exit(0)
        conn.close()


if __name__ == "__main__":
    _serve(sys.argv[1], sys.argv[2:])
