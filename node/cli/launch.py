"""``cancel-bus serve`` (a node) and ``cancel-bus demo`` (a local cluster). What they need of
the server side is imported when they run: the client commands start without it."""

from __future__ import annotations

import logging
import os
import shutil
import sys

import click

from ..settings import Settings
from .base import CliError, Command, Exit, out, usage_error
from .params import Parsed, Within, number

SERVE_FLAGS = {
    "redis_url": "REDIS_URL",
    "node_id": "NODE_ID",
    "host": "HOST",
    "port": "PORT",
    "namespace": "NAMESPACE",
}
PORT = Within.of(Settings, "port", number(int))


@click.command(
    "serve",
    cls=Command,
    short_help="run a node (no Redis URL: an embedded server)",
    help="Run a node: the HTTP API, the dashboard at /, API docs at /docs. Settings come from "
    "CANCEL_BUS_* variables (README, Configuration); these flags override a few. Ctrl-C "
    "(SIGTERM) drains: runs get CANCEL_BUS_DRAIN_TIMEOUT to finish, then are cancelled; a "
    "second Ctrl-C cancels them at once.",
)
@click.option("--host", help="address to listen on (CANCEL_BUS_HOST; default 127.0.0.1)")
@click.option(
    "--port",
    type=PORT,
    metavar="PORT",
    help=f"port to listen on ({PORT}; CANCEL_BUS_PORT; default 8080)",
)
@click.option("--redis-url", help="Redis URL (CANCEL_BUS_REDIS_URL; none: embedded server)")
@click.option("--node-id", help="this node's id (CANCEL_BUS_NODE_ID; default host-pid-random)")
@click.option("--namespace", help="key prefix shared by the cluster (CANCEL_BUS_NAMESPACE)")
@click.option(
    "--insecure-no-auth",
    is_flag=True,
    help="without API tokens, listen beyond loopback all the same (anyone may cancel)",
)
def serve(insecure_no_auth: bool, **flags: str | int | None) -> int:
    """Put the flags given into ``CANCEL_BUS_*`` variables, then serve until the node has drained; a
    bad configuration, or a node that cannot start, is one line."""
    for flag, key in SERVE_FLAGS.items():
        if flags[flag] is not None:
            os.environ[f"CANCEL_BUS_{key}"] = str(flags[flag])
    if insecure_no_auth:
        os.environ["CANCEL_BUS_INSECURE_NO_AUTH"] = "true"
    import uvicorn  # noqa: PLC0415 (the server side, only to serve)
    from pydantic import ValidationError  # noqa: PLC0415

    from cancel_bus import CancelBusError  # noqa: PLC0415

    from ..app import create_app  # noqa: PLC0415 (settings read the environment set above)
    from ..embedded import ServerError  # noqa: PLC0415
    from ..server import DrainingServer, PortInUse  # noqa: PLC0415
    from ..settings import ENV_PREFIX  # noqa: PLC0415
    from ..supervisor import DataDirBusy  # noqa: PLC0415

    try:
        settings = Settings()
        app = create_app(settings)
    except ValidationError as exc:
        problems = (f"{ENV_PREFIX}{str(e['loc'][0]).upper()}: {e['msg']}" for e in exc.errors())
        raise CliError(f"bad configuration: {'; '.join(problems)}") from None
    except (ValueError, OSError) as exc:
        raise CliError(f"bad configuration: {exc}") from None
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(levelname)s:     %(name)s: %(message)s"
    )
    node = app.state.node
    try:
        if settings.redis_connection_url() is None:
            node.embedded.claim_data_dir()  # before the port: a second node here says whom to join
        config = uvicorn.Config(
            app,
            host=settings.host,
            port=settings.port,
            log_level=settings.log_level,
            timeout_graceful_shutdown=5,  # after the drain: streams have ended, runs recorded
            access_log=settings.access_log,
        )
        _hint_the_cli()
        DrainingServer(config, node).run()  # binds the port before the node joins
    except (DataDirBusy, PortInUse) as exc:
        raise CliError(str(exc)) from None
    except (CancelBusError, ServerError) as exc:
        raise CliError(f"cannot start: {exc}") from None
    return Exit.OK


def _hint_the_cli() -> None:
    """Where this very command is, when a shell would not find it by name."""
    here = shutil.which(sys.argv[0]) or sys.argv[0]
    if os.path.basename(here) == "cancel-bus" and shutil.which("cancel-bus") != here:
        activate = os.path.join(os.path.dirname(here), "activate")
        out.print(
            f"the CLI: {here} --help (or `source {activate}` for cancel-bus on PATH)",
            soft_wrap=True,
        )


@click.command(
    "demo",
    cls=Command,
    short_help="a local cluster: cancel a run on node 1 via node 2",
    help="Start an embedded server and N nodes, cancel a run of node 1 through node 2, then "
    "keep the cluster up until Ctrl-C (or SIGTERM): its processes stop with it.",
)
@click.option(
    "--nodes",
    type=Parsed(number(int), "number"),
    default=3,
    metavar="N",
    help="how many nodes (default 3, at least 2)",
)
@click.option("--exit", "exit_after", is_flag=True, help="stop after the demo instead of waiting")
def demo(nodes: int, exit_after: bool) -> int:
    """Run the demo cluster (:func:`node.demo.run_demo`); a failure is one line."""
    if nodes < 2:
        raise usage_error("a demo of a cross-node cancel needs at least 2 nodes")
    import httpx  # noqa: PLC0415

    from ..demo import NotReady, run_demo  # noqa: PLC0415
    from ..embedded import ServerError  # noqa: PLC0415

    try:
        return run_demo(nodes, exit_after)
    except (NotReady, ServerError, httpx.HTTPError) as exc:
        raise CliError(f"demo: {exc}") from None
