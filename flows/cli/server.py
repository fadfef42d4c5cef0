"""``clipcache server start | stop | status``: a local Prefect server in the background, reused by later calls."""

from __future__ import annotations

import argparse

from clipcache.flows.cli.commands import add_command


def add_server_parser(sub: argparse._SubParsersAction) -> None:
    server = add_command(sub, "server",
                         description="A local Prefect server on 127.0.0.1, started in the background. While it "
                                     "runs, clipcache eval / rescore / run calls are Prefect flow runs you can "
                                     "follow in its UI (unless PREFECT_API_URL names another server).")
    actions = server.add_subparsers(dest="action", required=True)
    start = actions.add_parser("start", help="start it (or report the one running)")
    start.add_argument("--port", type=int, default=None, help="default: a free port")
    actions.add_parser("stop", help="stop it")
    actions.add_parser("status", help="is one running, and where")
    server.set_defaults(handler=run_server_command)


def run_server_command(args: argparse.Namespace) -> int:
    from clipcache.flows.cli.console import data_console
    from clipcache.flows.orchestration import prefect_server

    out = data_console()
    if args.action == "start":
        started = prefect_server.start(args.port)
        out.print(f"Prefect server: {started.url.removesuffix('/api')} (API {started.url}, pid {started.pid}); later "
                  f"clipcache calls report their runs to it. Stop it with `clipcache server stop`.", highlight=False)
        return 0
    if args.action == "stop":
        info = prefect_server.stop()
        out.print(f"stopped the Prefect server (pid {info.pid})" if info else "no clipcache Prefect server is running")
        return 0
    info = prefect_server.running()
    out.print(f"running: {info.url} (pid {info.pid})" if info else "not running", highlight=False)
    return 0 if info else 3
