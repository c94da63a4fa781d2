"""``cancel-bus cancel-where`` (every active run a selector matches: a preview, a question, the
cancels, perhaps a tombstone) and ``cancel-bus tombstones`` (list them, lift one)."""

from __future__ import annotations

import sys

import click

from cancel_bus import Outcome

from ..display import clock, json_text, local_time, outcome_counts, runs_table, selector_of, span
from ..display import tombstones_table as tombstones_view
from ..queries import WINDOW, RunQuery
from ..schemas import SelectorAnswer, SelectorCancel
from .base import EXIT_HELP, CliError, Exit, exclusive, model_of, out, usage_error
from .cancel import CANCEL_OPTIONS, cancel_options, not_confirmed
from .client import NodeClient
from .options import client_command
from .params import ID, METADATA, TIME, Within, duration, seconds

PREVIEW_ROWS = 50  # the matched runs cancel-where shows before it asks
CRITERIA = {
    "app_name": "--app",
    "user_id": "--user",
    "session_id": "--session",
    "node_id": "--node",
    "metadata": "--meta",
    "started_before": "--started-before",
    "min_age": "--older-than",
}
LISTED = ("app_name", "user_id", "session_id", "node_id")  # the criteria a list of runs takes
TTL = Within.of(SelectorCancel, "ttl", seconds, duration)


@client_command(
    "cancel-where",
    short_help="cancel every active run that matches (a preview first)",
    help="Cancel every active run that matches all the criteria given (at least one), from any "
    "node, with the runs below each. It shows the runs that match and asks first (--yes: "
    "without asking; --dry-run: only the preview); it cancels what matches when it runs. With "
    "--ttl or --until, a tombstone also cancels matching runs started until then (see "
    "tombstones). A user token's selector is its own runs.",
    epilog=EXIT_HELP,
)
@click.option("--app", metavar="APP", help="runs of this app")
@click.option("--user", metavar="USER", help="runs of this user")
@click.option("--session", metavar="SESSION", help="runs of this session")
@click.option("--node", metavar="NODE", help="runs owned by this node")
@click.option(
    "--meta",
    type=METADATA,
    multiple=True,
    metavar="KEY=VALUE",
    help="runs whose metadata has KEY=VALUE (a string; KEY:=5 or KEY:=true for a number or a "
    "boolean); repeat for several",
)
@click.option(
    "--started-before",
    type=TIME,
    metavar="TIME",
    help="runs started before TIME (2026-05-01T14:30:00Z, or 14:30 today)",
)
@click.option(
    "--older-than",
    type=Within.of(SelectorCancel, "min_age", seconds, duration),
    metavar="AGE",
    help="runs started AGE ago or more (5m)",
)
@click.option(
    "--ttl",
    type=TTL,
    metavar="DURATION",
    help=f"also cancel matching runs started in the next DURATION (60s, 5m; {TTL})",
)
@click.option(
    "--until", type=TIME, metavar="TIME", help="also cancel matching runs started until TIME"
)
@cancel_options("them", SelectorCancel)
@click.option("--yes", is_flag=True, help="cancel without asking")
@click.option("--dry-run", is_flag=True, help="only show what matches")
def cancel_where(
    client: NodeClient,
    as_json: bool,
    app: str | None,
    user: str | None,
    session: str | None,
    node: str | None,
    meta: tuple[tuple[str, str | int | float | bool], ...],
    started_before: float | None,
    older_than: float | None,
    ttl: float | None,
    until: float | None,
    mode: str,
    reason: str | None,
    no_wait: bool,
    timeout: float,
    yes: bool,
    dry_run: bool,
) -> int:
    """Preview the runs a selector matches, ask, then cancel them."""
    exclusive(started_before=started_before, older_than=older_than)
    exclusive(ttl=ttl, until=until)
    exclusive(yes=yes, dry_run=dry_run)
    if as_json and not (yes or dry_run):
        raise usage_error("--json needs --yes or --dry-run (it asks no question)")
    criteria = {
        "app_name": app,
        "user_id": user,
        "session_id": session,
        "node_id": node,
        "metadata": dict(meta) or None,
        "started_before": started_before,
        "min_age": older_than,
    }
    if all(value is None for value in criteria.values()):
        raise usage_error(f"give at least one of {', '.join(CRITERIA.values())}")
    body = model_of(
        SelectorCancel,
        {**CRITERIA, **CANCEL_OPTIONS, "ttl": "--ttl", "until": "--until"},
        **criteria,
        ttl=ttl,
        until=until,
        mode=mode,
        reason=reason,
        wait=not no_wait,
        timeout=timeout,
        dry_run=True,
    )
    preview = client.cancel_where(body)
    if dry_run or not yes:
        if as_json:
            print(json_text(preview))
        else:
            _show_preview(client, body, preview)
    holds = ttl is not None or until is not None
    if dry_run or (preview.matched == 0 and not holds):
        return Exit.OK if preview.matched else Exit.NOT_FOUND
    if not yes and not _confirmed(preview.matched, body):
        out.print("nothing cancelled")
        return Exit.ERROR
    answer = client.cancel_where(body.model_copy(update={"dry_run": False}))
    if as_json:
        print(json_text(answer))
    else:
        _show_cancelled(answer, body)
    return Exit.OK if answer.matched or answer.tombstones else Exit.NOT_FOUND


def _show_preview(client: NodeClient, body: SelectorCancel, preview: SelectorAnswer) -> None:
    """The count, then the matched runs as ``runs`` shows them (those among the most recent
    active runs; any other by its id)."""
    out.print(f"{preview.matched} active run(s) match {_described(body)}", soft_wrap=True)
    if not preview.run_ids:
        return
    listed = client.runs(
        RunQuery(status="active", limit=WINDOW, **body.model_dump(include=set(LISTED)))
    )
    wanted = set(preview.run_ids)
    shown = [run for run in listed.runs if run.run_id in wanted][:PREVIEW_ROWS]
    out.print(runs_table(shown, listed.at, out.width), crop=False)
    known = {run.run_id for run in shown}
    rest = [run_id for run_id in preview.run_ids if run_id not in known]
    if rest:
        more = f" (and {len(rest) - PREVIEW_ROWS} more)" if len(rest) > PREVIEW_ROWS else ""
        out.print("also: " + ", ".join(rest[:PREVIEW_ROWS]) + more, soft_wrap=True)


def _described(body: SelectorCancel) -> str:
    """``app=demo user=bob started 5 min ago or earlier``."""
    shown = set(CRITERIA) - {"min_age"}
    text = selector_of(body.model_dump(include=shown, exclude_none=True))
    if body.min_age is not None:
        text = f"{text} started {span(body.min_age)} ago or earlier".strip()
    return text


def _confirmed(matched: int, body: SelectorCancel) -> bool:
    """Ask on the terminal (or read the answer from stdin): anything but yes is no."""
    hold = ""
    if body.ttl is not None:
        hold = f", and cancel matching runs started in the next {span(body.ttl)}"
    elif body.until is not None:
        hold = f", and cancel matching runs started until {local_time(body.until)}"
    out.print(f"Cancel {matched} run(s) and the runs below them{hold}? [y/N] ", end="")
    answer = sys.stdin.readline()
    if not sys.stdin.isatty():
        out.print(answer.strip())  # as a terminal would have echoed it
    return answer.strip().lower() in ("y", "yes")


def _show_cancelled(answer: SelectorAnswer, body: SelectorCancel) -> None:
    """A line of counts, a line per run, a line per tombstone."""
    below = [descendant for result in answer.results for descendant in result.descendants]
    line = f"{answer.matched} run(s) matched: "
    line += outcome_counts([result.outcome.value for result in answer.results])
    if below:
        line += f"; {len(below)} run(s) below them: "
        line += outcome_counts([run.outcome.value for run in below])
    out.print(line, soft_wrap=True)
    for result in answer.results:
        after = result.stopped_after
        stopped = f" stopped {span(after)} after the request" if after is not None else ""
        if result.outcome is Outcome.STOPPING:
            stopped = f": the cancel is {not_confirmed(body)}"
        out.print(f"  {result.outcome.value}: run {result.run_id}{stopped}", soft_wrap=True)
    for tombstone in answer.tombstones:
        expires = tombstone.expires_at
        out.print(
            f"tombstone {tombstone.tombstone_id}: runs of {selector_of(tombstone.selector)} "
            f"started in the next {span(expires - answer.at)} (until {clock(expires)}) are "
            f"cancelled at their start; cancel-bus tombstones rm {tombstone.tombstone_id} lifts it",
            soft_wrap=True,
        )


@client_command(
    "tombstones",
    short_help="the tombstones of selector cancels; tombstones rm ID lifts one",
    help="The live tombstones (an ops token: all; a user token: those it laid): each cancels "
    "the runs its selector matches that start before it expires. tombstones rm ID lifts the "
    "tombstone ID.",
)
@click.argument("action", metavar="[rm ID]", nargs=-1, type=ID)
def tombstones(client: NodeClient, as_json: bool, action: tuple[str, ...]) -> int:
    """List the live tombstones, or lift one (``rm ID``)."""
    if not action:
        answer = client.tombstones()
        if as_json:
            print(json_text(answer.tombstones))
        elif answer.tombstones:
            out.print(tombstones_view(answer.tombstones, answer.at, out.width), crop=False)
        else:
            out.print("no tombstone holds runs")
        return Exit.OK
    if action[0] != "rm" or len(action) > 2:
        raise usage_error(f"{' '.join(action)!r}: tombstones takes nothing (a list), or rm ID")
    if len(action) == 1:
        raise usage_error("tombstones rm needs a TOMBSTONE_ID")
    removed = client.remove_tombstone(action[1])
    if removed is None:
        raise CliError(f"no live tombstone {action[1]}", Exit.NOT_FOUND)
    if as_json:
        print(json_text(removed))
    else:
        selector = selector_of(removed.selector)
        out.print(f"removed tombstone {removed.tombstone_id} ({selector})", soft_wrap=True)
    return Exit.OK
