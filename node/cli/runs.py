"""``cancel-bus runs`` (a list, or a live view) and ``cancel-bus run`` (one run), and how a run
is found by its id or the start of one."""

from __future__ import annotations

import time
from typing import get_args

import click
from rich.live import Live

from cancel_bus import RunInfo

from ..display import json_text, run_details, runs_table
from ..queries import WINDOW, RunQuery, StatusFilter
from .base import CliError, Exit, model_of, out, usage_error
from .client import NodeClient
from .options import client_command
from .params import ID, Within, duration, number, seconds

MAX_WATCH = 86400.0  # runs --watch: the longest pause between refreshes
PREFIX_SHOWN = 5  # the ids an ambiguous prefix error names
RUN_FILTERS = {
    "node_id": "--node",
    "app_name": "--app",
    "user_id": "--user",
    "session_id": "--session",
    "parent": "--parent",
    "phase": "--phase",
    "id_prefix": "--id",
    "min_age": "--older-than",
    "max_age": "--newer-than",
    "limit": "--limit",
}
LIMIT = Within.of(RunQuery, "limit", number(int))


def no_run(ref: str) -> str:
    """The error for a run id (or start of one) ``ref`` that names no run."""
    return f"no run {ref} (nor one whose id starts so, of the {WINDOW:,} most recent)"


def by_prefix(client: NodeClient, prefix: str) -> RunInfo | None:
    """The one run whose id starts with ``prefix`` (among the most recent), if any."""
    matches = client.runs_starting(prefix, PREFIX_SHOWN + 1)
    if len(matches) > 1:
        ids = ", ".join(run.run_id for run in matches[:PREFIX_SHOWN])
        more = ", ..." if len(matches) > PREFIX_SHOWN else ""
        raise CliError(f"{prefix} is the start of several run ids: {ids}{more}", Exit.AMBIGUOUS)
    return matches[0] if matches else None


def resolve(client: NodeClient, ref: str) -> RunInfo:
    """The run whose id is ``ref``, or the one run whose id starts with it."""
    found = client.run(ref) or by_prefix(client, ref)
    if found is None:
        raise CliError(no_run(ref), Exit.NOT_FOUND)
    return found


@client_command(
    "runs",
    short_help="list runs across the cluster",
    help="Runs across the cluster, the most recent first (an active run by its start, a "
    "finished one by its end). Session, parent, phase, id and age filters look through the "
    f"{WINDOW:,} most recent runs.",
)
@click.option(
    "--status",
    default="active",
    type=click.Choice(get_args(StatusFilter)),
    help="active (default), finished, all, or one status",
)
@click.option("--node", metavar="NODE", help="runs owned by this node")
@click.option("--app", metavar="APP", help="runs of this app")
@click.option("--user", metavar="USER", help="runs of this user")
@click.option("--session", metavar="SESSION", help="runs of this session")
@click.option("--parent", metavar="RUN_ID", help="runs started as children of this run")
@click.option(
    "--phase", metavar="PHASE", help="runs in this phase, or kind of phase (tool: tool:search)"
)
@click.option("--id", "id_prefix", metavar="PREFIX", help="runs whose id starts so")
@click.option(
    "--older-than",
    type=Within.of(RunQuery, "min_age", seconds, duration),
    metavar="AGE",
    help="started AGE ago or more (90s, 5m, 2h)",
)
@click.option(
    "--newer-than",
    type=Within.of(RunQuery, "max_age", seconds, duration),
    metavar="AGE",
    help="started AGE ago or less",
)
@click.option(
    "--limit", type=LIMIT, default=100, metavar="N", help=f"at most ({LIMIT}, default 100)"
)
@click.option(
    "--watch",
    type=Within(number(float), {"gt": 0, "le": MAX_WATCH}),
    is_flag=False,
    flag_value=2.0,
    metavar="[SECONDS]",
    help="show the list again every SECONDS (default 2) until Ctrl-C",
)
@click.option(
    "--count",
    type=Within(number(int), {"ge": 1}),
    metavar="N",
    help="with --watch: stop after N refreshes",
)
def runs(
    client: NodeClient,
    as_json: bool,
    status: StatusFilter,
    node: str | None,
    app: str | None,
    user: str | None,
    session: str | None,
    parent: str | None,
    phase: str | None,
    id_prefix: str | None,
    older_than: float | None,
    newer_than: float | None,
    limit: int,
    watch: float | None,
    count: int | None,
) -> int:
    """List the runs that match (a table, or JSON), or show the table again every ``--watch``
    seconds."""
    query = model_of(
        RunQuery,
        RUN_FILTERS,
        status=status,
        node_id=node,
        app_name=app,
        user_id=user,
        session_id=session,
        parent=parent,
        phase=phase,
        id_prefix=id_prefix,
        min_age=older_than,
        max_age=newer_than,
        limit=limit,
    )
    if watch is not None:
        if as_json:
            raise usage_error("--watch shows a table: give it without --json")
        return _watch(client, query, watch, count)
    answer = client.runs(query)
    if as_json:
        print(json_text(answer.runs))
    else:
        out.print(runs_table(answer.runs, answer.at, out.width), crop=False)
        if answer.more:
            out.print(f"(more match: --limit above {limit})", style="dim")
    return Exit.OK


def _watch(client: NodeClient, query: RunQuery, every: float, count: int | None) -> int:
    """The table again every ``every`` seconds, in place; Ctrl-C ends it."""
    refreshes = 0
    try:
        with Live(console=out, auto_refresh=False) as live:
            while count is None or refreshes < count:
                answer = client.runs(query)
                title = (
                    f"{len(answer.runs)}{'+' if answer.more else ''} run(s), {query.status}, "
                    f"at {time.strftime('%H:%M:%S')} (Ctrl-C to stop)"
                )
                live.update(runs_table(answer.runs, answer.at, out.width, title), refresh=True)
                refreshes += 1
                if count is None or refreshes < count:
                    time.sleep(every)
    except KeyboardInterrupt:
        pass
    return Exit.OK


@client_command(
    "run",
    short_help="one run: details, cancel phases, event timeline, output",
    help="One run, RUN_ID: its id, or the start of one (unique among the recent runs).",
)
@click.argument("run_id", metavar="RUN_ID", type=ID)
def run(client: NodeClient, as_json: bool, run_id: str) -> int:
    """Show one run: its fields, events and children (or the three as JSON)."""
    found = resolve(client, run_id)
    answer = client.events(found.run_id)
    children = client.children(found.run_id)
    if as_json:
        print(json_text({"run": found, "events": answer.events, "children": children}))
    else:
        out.print(run_details(found, answer.events, answer.at, children))
    return Exit.OK
