"""The ``cancel-bus`` command: serve a node, demo a local cluster, inspect, follow and cancel
runs. Client commands talk HTTP to ``--url`` (default: the local node) with ``--token``,
through :class:`NodeClient`; ``--json`` prints the API's answers (timestamps in ISO 8601).
Errors are one line on stderr; the exit codes are in :class:`Exit`."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import click

from cancel_bus import __version__

from .base import EXIT_HELP, PROG, CliError, Exit, Group, say, usage_line
from .cancel import cancel
from .client import HTTP_TIMEOUT, NodeClient, NodeError
from .follow import follow
from .launch import demo, serve
from .ops import nodes, print_acl_rules
from .options import check_before, client_options
from .runs import run, runs
from .selectors import cancel_where, tombstones

__all__ = ["HTTP_TIMEOUT", "CliError", "Exit", "NodeClient", "NodeError", "cli", "main"]


@click.group(
    PROG,
    cls=Group,
    params=client_options(before=True),
    context_settings={"help_option_names": ["-h", "--help"]},
    no_args_is_help=False,
    help="Cancel long-running work from any node of a cluster. The options of the commands "
    "that ask a node (--url, --token, --http-timeout, --json) come before the command or after "
    "it; see cancel-bus COMMAND --help.",
    epilog=EXIT_HELP,
)
@click.version_option(__version__, "--version", prog_name=PROG, message="%(prog)s %(version)s")
def cli(**before: Any) -> None:
    """Refuse client options given before a command that asks no node."""
    ctx = click.get_current_context()
    name = ctx.invoked_subcommand
    check_before(ctx, cli.get_command(ctx, name) if name else None)


for command in (
    serve,
    demo,
    runs,
    run,
    follow,
    cancel,
    cancel_where,
    tombstones,
    nodes,
    print_acl_rules,
):
    cli.add_command(command)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: the process's); the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        code = cli.main(args, prog_name=PROG, standalone_mode=False)
    except click.UsageError as exc:
        say(usage_line(exc))
        return Exit.USAGE
    except click.ClickException as exc:
        say(f"{PROG}: {exc.format_message()}")
        return exc.exit_code
    except CliError as exc:
        say(f"{PROG}: {exc}")
        return exc.code
    except NodeError as exc:
        say(f"{PROG}: {exc}")
        return Exit.ERROR
    except (click.Abort, KeyboardInterrupt):
        return Exit.INTERRUPTED  # Ctrl-C before serving or between steps: quietly
    return code if isinstance(code, int) else Exit.OK
