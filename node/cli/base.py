"""What every command shares: the exit codes, the one-line error, the console, and click
commands whose bad command lines are reported in one line."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from enum import IntEnum
from typing import Any, TypeVar

import click
from pydantic import BaseModel, ValidationError
from rich.console import Console

PROG = "cancel-bus"
out = Console(highlight=False, markup=False)  # what it shows is data, never markup
M = TypeVar("M", bound=BaseModel)


class Exit(IntEnum):
    """The exit codes of ``cancel-bus``."""

    OK = 0  # cancel: cancelled, stopping or owner_lost; follow: the run succeeded
    ERROR = 1  # the node is unreachable, answered an error or not as a node; a bad config; "no"
    USAGE = 2  # a bad command line
    FINISHED = 3  # cancel: the run had already finished
    NOT_FOUND = 4  # no such run (or id prefix, tombstone); no active run in the session or match
    AMBIGUOUS = 5  # an id prefix that several runs start with
    FAILED = 6  # follow: the run failed
    CANCELLED = 7  # follow: the run was cancelled
    INTERRUPTED = 130  # Ctrl-C (128 + SIGINT); follow: stopped following, the run goes on


EXIT_HELP = """\b
Exit codes:
  0    done (cancel: cancelled, stopping or owner_lost; follow: the run succeeded)
  1    error: the node is unreachable, answered an error, or did not answer (in time, or
       as a cancel-bus node), or a bad configuration; or cancel-where's question answered no
  2    a bad command line
  3    cancel: the run had already finished
  4    not found: no such run (or id prefix, or tombstone), no active run in the session,
       no active run that matches (and no tombstone laid)
  5    an id prefix that several runs start with
  6    follow: the run failed
  7    follow: the run was cancelled
  130  Ctrl-C (follow: stopped following; the run goes on)"""


class CliError(Exception):
    """A failure to report as one line, with its exit code."""

    def __init__(self, message: str, code: Exit = Exit.ERROR) -> None:
        super().__init__(message)
        self.code = code


def say(message: str) -> None:
    """One line on stderr, whatever the message holds."""
    sys.stderr.write(" ".join(message.split()) + "\n")


def usage_line(error: click.UsageError) -> str:
    """``cancel-bus runs: --limit: '0' is out of range (1-1000) (see cancel-bus runs --help)``."""
    path = error.ctx.command_path if error.ctx is not None else PROG
    param = error.param if isinstance(error, click.BadParameter) else None
    if param is None or isinstance(error, click.MissingParameter):
        message = error.format_message()
    else:
        option = isinstance(param, click.Option)
        hint = "/".join(param.opts) if option else param.human_readable_name.strip("[].")
        message = f"{hint}: {error.message}"
    return f"{path}: {message} (see {path} --help)"


class Command(click.Command):
    """A command whose usage errors name it (click leaves some without their command)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """click's parsing; a usage error raised without a context gets this command's, so its one
        line names the command."""
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            exc.ctx = exc.ctx or ctx
            raise


class Group(Command, click.Group):
    """The ``cancel-bus`` group: its commands listed in the order they were added."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        """The commands in the order they were added (click sorts them by name)."""
        return list(self.commands)


def usage_error(message: str) -> click.UsageError:
    """A bad command line found after parsing, named after the running command."""
    return click.UsageError(message, click.get_current_context(silent=True))


def given(name: str) -> bool:
    """Whether the running command's option ``name`` was on the command line."""
    source = click.get_current_context().get_parameter_source(name)
    return source is click.core.ParameterSource.COMMANDLINE


def exclusive(**options: object) -> None:
    """At most one of these options is given (by parameter name; None or False: not given)."""
    present = [
        f"--{name.replace('_', '-')}"
        for name, value in options.items()
        if value is not None and value is not False  # 0 is given: no == here
    ]
    if len(present) > 1:
        raise usage_error(f"{present[1]} is not allowed with {present[0]}")


def model_of(model: type[M], options: Mapping[str, str], **fields: Any) -> M:
    """The node's ``model`` of the fields given (None: not given), checked as the node checks
    it: what it refuses is a bad command line that names the option (``options``: field →
    option) and says why, before anything is sent."""
    try:
        return model(**{name: value for name, value in fields.items() if value is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else ""
        where = options.get(field, field)
        raise usage_error(f"{where}: {first['msg']}" if where else first["msg"]) from None
