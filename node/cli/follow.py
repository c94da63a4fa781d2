"""``cancel-bus follow``: a run's live output, from any node, until it ends; the exit code says
how it ended (0 succeeded, 6 failed, 7 cancelled; 130 when Ctrl-C stops following first)."""

from __future__ import annotations

import json
import sys
import time
from contextlib import closing

import click

from cancel_bus import RunInfo, RunStatus

from ..display import jsonable, session_of, span, status_of, with_iso_times
from .base import EXIT_HELP, CliError, Exit, say
from .client import AppEvent, Draining, Finished, NodeClient, Output, StreamEvent
from .options import client_command
from .params import ID
from .runs import resolve

FINAL_EXIT = {
    RunStatus.SUCCEEDED: Exit.OK,
    RunStatus.FAILED: Exit.FAILED,
    RunStatus.CANCELLED: Exit.CANCELLED,
}
RETRIES = 5  # streams in a row a draining node may end at once before following gives up
RETRY_PAUSE = 1.0  # seconds before following again (a load balancer moves on meanwhile)


class Shown:
    """What ``follow`` shows of a stream: each event as a line of JSON, or for a person, the
    run's output as it comes, its own events on lines of their own, and how it ended."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.introduced = False
        self.mid_line = False  # the output so far does not end its line

    def event(self, event: StreamEvent) -> None:
        """Show one event of the stream: a line of JSON; or the run's output as it comes, its
        introduction (once, while it is active), and its own events on lines of their own."""
        if self.as_json:
            data = with_iso_times(jsonable(event.body))
            self._write(json.dumps({"event": event.event, "id": event.id, "data": data}) + "\n")
            return
        body = event.body
        if isinstance(body, Output):
            self._write(body.text)
            self.mid_line = not body.text.endswith("\n")
        elif isinstance(body, RunInfo) and not self.introduced and body.is_active:
            self.line(
                f"run {body.run_id}: {status_of(body)} on {body.owner or '-'} "
                f"({session_of(body)}); its output from now on (Ctrl-C stops following, "
                "not the run):"
            )
        elif isinstance(body, AppEvent):
            data = " ".join(f"{key}={json.dumps(value)}" for key, value in body.root.items())
            self.line(f"[{event.event}] {data}".strip())
        self.introduced = self.introduced or isinstance(body, RunInfo)

    def ended(self, finished: Finished, run: RunInfo | None) -> None:
        """The line that says how the run ended and after how long, with its cancel reason or error
        (none with ``--json``)."""
        if self.as_json:
            return
        if run is None:  # its record expired meanwhile
            self.line(f"{finished.status.value}: the run ended")
            return
        ran = span((run.finished_at or run.created_at) - (run.started_at or run.created_at))
        why = f"; reason: {run.cancel_reason}" if run.cancel_reason else ""
        why += f"; error: {run.error}" if run.error else ""
        self.line(f"{status_of(run)}: run {run.run_id} ended after {ran}{why}")

    def line(self, text: str) -> None:
        """A line of its own, after the output so far."""
        self.end_line()
        self._write(text + "\n")

    def end_line(self) -> None:
        """End the line the output so far left open, if it did."""
        if self.mid_line:
            self._write("\n")
            self.mid_line = False

    def _write(self, text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()


@client_command(
    "follow",
    short_help="a run's live output, from any node, until it ends",
    help="Show the output of a run, RUN_ID (its id or the start of one), as it comes, and its "
    "events (tool calls...), until it ends; the exit code says how it ended. Ctrl-C stops "
    "following (exit code 130), not the run. A node that drains stops streaming: follow asks "
    "--url again (behind a load balancer, another node). --json: one JSON object a line, each "
    "event as the node sends it ({event, id, data}).",
    epilog=EXIT_HELP,
)
@click.argument("run_id", metavar="RUN_ID", type=ID)
def follow(client: NodeClient, as_json: bool, run_id: str) -> int:
    """Follow the run until it ends; the exit code says how it ended (130: Ctrl-C stopped following
    first)."""
    run = resolve(client, run_id)
    shown = Shown(as_json)
    try:
        finished, final = _followed(client, run.run_id, shown)
    except KeyboardInterrupt:
        shown.end_line()
        say(f"cancel-bus: stopped following run {run.run_id} (the run itself is not cancelled)")
        return Exit.INTERRUPTED
    shown.ended(finished, final)
    return FINAL_EXIT.get(finished.status, Exit.ERROR)


def _followed(client: NodeClient, run_id: str, shown: Shown) -> tuple[Finished, RunInfo | None]:
    """Follow the run's streams until it ends: how it ended, and its final record."""
    drained = 0  # streams in a row that a draining node ended before the run said anything
    while True:
        finished, final, relayed, draining = None, None, False, False
        with closing(client.follow(run_id)) as events:
            for event in events:
                shown.event(event)
                body = event.body
                if isinstance(body, Draining):
                    draining = True
                    break
                if isinstance(body, Finished):
                    finished = body
                elif isinstance(body, RunInfo):
                    final = body
                else:
                    relayed = True
        if finished is not None:
            return finished, final if final is not None and not final.is_active else None
        if not draining:
            raise CliError(f"{client.url} ended the stream of run {run_id} before the run ended")
        drained = 0 if relayed else drained + 1
        if drained > RETRIES:
            raise CliError(
                f"{client.url} is draining and no other node took up run {run_id} after "
                f"{RETRIES} tries: the run goes on; follow it through another node (--url)"
            )
        if not shown.as_json:
            shown.line(f"({client.url} stopped streaming the run: it drains; following again)")
        time.sleep(RETRY_PAUSE)
