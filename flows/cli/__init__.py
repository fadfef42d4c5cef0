"""The ``clipcache`` command line: ``app`` builds the parser and runs a command, ``flags`` declares the eval /
rescore flags, ``commands`` names every command and its help line (a command line builds only its own parser), one
module per other command (cache, catalog, compare, init, query, server, suite), ``console`` prints. It calls
down into orchestration/ and config/, never the other way."""

from collections.abc import Sequence

__all__ = ["console", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """The ``clipcache`` console script. Imported lazily, so ``python -m clipcache.flows.cli.flags`` (which ``app``
    imports) runs without the package having imported it first."""
    from clipcache.flows.cli.app import main as run

    return run(argv)


def console() -> int:
    """The ``clipcache`` console script (and ``python -m clipcache.flows.cli``): :func:`main`, then ``gc.freeze()``
    as the process ends. The interpreter's exit collects garbage over every object still alive, and torch,
    transformers and open_clip leave millions from their imports: that pass took 0.7-1.2 s of each call's exit here
    (0.3-0.45 s frozen). Frozen objects are still freed; only cycles among them are left to the process's end, and
    clipcache closes what it writes itself. Not in ``main``, which tests and scripts call in a process that goes on."""
    code = main()
    import gc

    gc.freeze()
    return code
