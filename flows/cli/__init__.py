"""The ``clipcache`` command line: ``app`` builds the parser and runs a command, ``flags`` declares the eval /
rescore flags, ``commands`` names every command and its help line (a command line builds only its own parser), one
module per other command (cache, catalog, compare, init, query, server, suite), ``console`` prints. It calls
down into orchestration/ and config/, never the other way."""

from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """The ``clipcache`` console script. Imported lazily, so ``python -m clipcache.flows.cli.flags`` (which ``app``
    imports) runs without the package having imported it first."""
    from clipcache.flows.cli.app import main as run

    return run(argv)
