"""``cancel-bus nodes`` (the live nodes and their leases) and ``cancel-bus acl-rules`` (the
``ACL SETUSER`` line of a Redis user confined to namespaces)."""

from __future__ import annotations

import click

from cancel_bus import InvalidArgument, acl_rules

from ..display import json_text, nodes_table
from .base import CliError, Command, Exit, out
from .client import NodeClient
from .options import client_command
from .params import Parsed

ACL_USER = "cancel-bus"  # the user docs/deploy.md names


@client_command(
    "nodes",
    short_help="the live nodes and their leases (needs an ops token)",
    help="The live nodes: lease state (late: a heartbeat missed, it may be dying), heartbeat, "
    "lease left, the last probe of its own channel (latency, when), active runs.",
)
def nodes(client: NodeClient, as_json: bool) -> int:
    """Show the live nodes: a table, or JSON."""
    answer = client.nodes()
    if as_json:
        print(json_text(answer.nodes))
    else:
        out.print(nodes_table(answer.nodes, answer.at, out.width), crop=False)
    return Exit.OK


def acl_user(value: str) -> str:
    """A name ``ACL SETUSER`` takes as one word."""
    if not value or value != "".join(value.split()):
        raise ValueError(f"{value!r} is not a user name (one word)")
    return value


@click.command(
    "acl-rules",
    cls=Command,
    short_help="the Redis ACL user for these namespaces (and nothing else)",
    help="Print the ACL SETUSER command of a Redis user confined to the namespaces NAMESPACE...: "
    "its keys and channels, the commands the library uses (docs/deploy.md). Put its password "
    "in place of PASSWORD.",
)
@click.argument("namespaces", nargs=-1, required=True, metavar="NAMESPACE...")
@click.option(
    "--name",
    type=Parsed(acl_user, "name"),
    default=ACL_USER,
    metavar="USER",
    help=f"the ACL user's name (default {ACL_USER})",
)
def print_acl_rules(namespaces: tuple[str, ...], name: str) -> int:
    """Print the ``ACL SETUSER`` line for the namespaces; a bad namespace is one line."""
    try:
        rules = acl_rules(*namespaces)
    except InvalidArgument as exc:
        raise CliError(str(exc)) from None
    print(f"ACL SETUSER {name} on >PASSWORD {rules}")
    return Exit.OK
