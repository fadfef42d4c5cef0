"""The ``clipcache`` command line: ``app`` builds the parser and runs a command, ``flags`` declares the eval /
rescore flags, one module per other command (cache, catalog, compare, init, query, server, suite), ``console``
prints. It calls down into orchestration/ and config/, never the other way."""

from clipcache.flows.cli.app import main

__all__ = ["main"]
