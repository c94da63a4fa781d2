"""The options of every command that asks a node (--url, --token, --http-timeout, --json),
taken before the command or after it, and the :class:`NodeClient` they make."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from .base import Command, given, usage_error
from .client import HTTP_TIMEOUT, NodeClient
from .params import DEFAULT_URL, URL, Within, number

MAX_HTTP_TIMEOUT = 3600.0
Run = Callable[..., int]


def client_options(*, before: bool) -> list[click.Option]:
    """The options, as a command takes them (with their environment variables and defaults),
    or ``before`` it, on ``cancel-bus`` itself (None unless given: the command's own win)."""
    http_timeout = Within(number(float), {"gt": 0, "le": MAX_HTTP_TIMEOUT})

    def default(value: object) -> Any:
        return None if before else value

    def env(name: str) -> str | None:
        return None if before else name

    return [
        click.Option(
            ["--url"],
            type=URL,
            metavar="URL",
            envvar=env("CANCEL_BUS_URL"),
            default=default(DEFAULT_URL),
            help=f"the node to ask (CANCEL_BUS_URL; default {DEFAULT_URL})",
        ),
        click.Option(
            ["--token"],
            metavar="TOKEN",
            envvar=env("CANCEL_BUS_TOKEN"),
            help="bearer token (CANCEL_BUS_TOKEN), if the node has API tokens",
        ),
        click.Option(
            ["--http-timeout"],
            type=http_timeout,
            default=default(HTTP_TIMEOUT),
            metavar="SECONDS",
            help=f"how long to wait for the node's answer ({http_timeout}, default "
            f"{HTTP_TIMEOUT:g}); a cancel that waits for runs to stop waits its --timeout more",
        ),
        click.Option(
            ["--json", "as_json"],
            is_flag=True,
            default=default(False),
            help="JSON output for scripts (ISO 8601 times)",
        ),
    ]


class ClientCommand(Command):
    """A command that asks a node."""


def client_command(name: str, **attrs: Any) -> Callable[[Run], ClientCommand]:
    """A command that asks a node: ``run(client, as_json, **its own options)``, with the
    client options (given after the command, else before it, else from the environment)."""

    def decorate(run: Run) -> ClientCommand:
        def callback(
            url: str, token: str | None, http_timeout: float, as_json: bool, **params: Any
        ) -> int:
            timeout = _chosen("http_timeout", http_timeout)
            with NodeClient(_chosen("url", url), _chosen("token", token), timeout) as client:
                return run(client, bool(_chosen("as_json", as_json)), **params)

        own = list(reversed(getattr(run, "__click_params__", [])))
        params = [*own, *client_options(before=False)]
        return ClientCommand(name, callback=callback, params=params, **attrs)

    return decorate


def _chosen(name: str, value: Any) -> Any:
    """The option as given after the command, else before it, else its default."""
    ctx = click.get_current_context()
    before = ctx.parent.params.get(name) if ctx.parent is not None else None
    return value if given(name) or before is None else before


def check_before(ctx: click.Context, command: click.Command | None) -> None:
    """Client options given before a command that asks no node are a bad command line."""
    if isinstance(command, ClientCommand):
        return
    for option in client_options(before=True):
        if option.name is not None and ctx.params.get(option.name) not in (None, False):
            name = ctx.invoked_subcommand
            raise usage_error(f"{option.opts[0]} is for the commands that ask a node, not {name}")
