"""``cancel-bus cancel``: a run (by its id or the start of one), or a session's active run, from
any node; and the cancel options and outcome lines cancel-where shares."""

from __future__ import annotations

from collections.abc import Callable

import click
from pydantic import BaseModel

from cancel_bus import CancelMode, Outcome

from ..display import json_text, span, status_of
from ..schemas import CancelAnswer, CancelBody, CancelOutcome, SelectorCancel
from .base import EXIT_HELP, Exit, model_of, out, usage_error
from .client import NodeClient
from .options import Run, client_command
from .params import ID, Within, number
from .runs import by_prefix, no_run

OUTCOME_EXIT = {Outcome.NOT_FOUND: Exit.NOT_FOUND, Outcome.ALREADY_FINISHED: Exit.FINISHED}
CANCEL_OPTIONS = {"mode": "--mode", "reason": "--reason", "timeout": "--timeout"}


def cancel_options(runs: str, body: type[BaseModel]) -> Callable[[Run], Run]:
    """--mode, --reason, --no-wait and --timeout, as the node's ``body`` takes them."""
    timeout = Within.of(body, "timeout", number(float))
    options = (
        click.option(
            "--mode",
            default=CancelMode.CHECKPOINT.value,
            type=click.Choice([mode.value for mode in CancelMode]),
            help="checkpoint (default): at its next checkpoint; immediate: also interrupt what "
            "it awaits; after_turn: once its turn ends",
        ),
        click.option("--reason", help="recorded with the run"),
        click.option(
            "--no-wait", is_flag=True, help="answer once recorded (stopping), without waiting"
        ),
        click.option(
            "--timeout",
            type=timeout,
            default=5.0,
            metavar="SECONDS",
            help=f"seconds to wait for {runs} to stop ({timeout}, default 5)",
        ),
    )

    def add(run: Run) -> Run:
        for option in reversed(options):
            run = option(run)
        return run

    return add


def not_confirmed(body: CancelBody | SelectorCancel) -> str:
    """What ``stopping`` means for this cancel: it was recorded, and waited for or not."""
    if not body.wait:
        return "recorded; not waited for (--no-wait)"
    return f"recorded; not confirmed within {body.timeout:g} s"


def outcome_line(answer: CancelOutcome, not_found: str, body: CancelBody) -> str:
    """``cancelled: run 93ff... stopped 1.07 ms after the request``, and so on."""
    outcome, run = answer.outcome.value, answer.run
    if run is None:
        return f"{outcome}: {not_found}"
    what = f"run {run.run_id}"
    requested = run.cancel_requested_at
    if answer.outcome is Outcome.CANCELLED and requested and run.finished_at:
        return f"{outcome}: {what} stopped {span(run.finished_at - requested)} after the request"
    if answer.outcome is Outcome.STOPPING:
        return f"{outcome}: {what}: the cancel is {not_confirmed(body)}"
    if answer.outcome is Outcome.OWNER_LOST:
        return f"{outcome}: {what}: its node had died; resolved when its lease expired"
    return f"{outcome}: {what} ({status_of(run)})"


@client_command(
    "cancel",
    short_help="cancel a run (or a session's active run) from any node",
    help="Cancel a run, RUN_ID (its id or the start of one), or a session's active run "
    "(--session). Waits up to --timeout for the owner to confirm.",
    epilog=EXIT_HELP,
)
@click.argument("run_id", metavar="[RUN_ID]", type=ID, required=False)
@click.option(
    "--session",
    nargs=3,
    type=ID,
    metavar="APP USER SESSION",
    help="the active run of this session",
)
@cancel_options("it", CancelBody)
def cancel(
    client: NodeClient,
    as_json: bool,
    run_id: str | None,
    session: tuple[str, str, str] | None,
    mode: str,
    reason: str | None,
    no_wait: bool,
    timeout: float,
) -> int:
    """Cancel the run (its id, else the one run whose id starts so) or the session's active run, and
    show the outcome for it and each run below it."""
    if (run_id is None) == (session is None):
        raise usage_error("give a RUN_ID or --session APP USER SESSION (one of them)")
    body = model_of(
        CancelBody, CANCEL_OPTIONS, mode=mode, reason=reason, wait=not no_wait, timeout=timeout
    )
    if session is not None:
        answer = client.cancel_session(*session, body)
        target = "no active run in session " + "/".join(session)
    else:
        assert run_id is not None
        answer = client.cancel(run_id, body)
        target = no_run(run_id)
        if answer.outcome is Outcome.NOT_FOUND:  # perhaps the start of an id
            found = by_prefix(client, run_id)
            if found is not None:
                answer = client.cancel(found.run_id, body)
    if as_json:
        print(json_text(answer))
    else:
        _show(answer, target, body)
    return OUTCOME_EXIT.get(answer.outcome, Exit.OK)


def _show(answer: CancelAnswer, target: str, body: CancelBody) -> None:
    out.print(outcome_line(answer, target, body), soft_wrap=True)
    for below in answer.descendants:  # the runs started below it, deepest first
        out.print(f"  below it: {outcome_line(below, '', body)}", soft_wrap=True)
    if answer.truncated:
        out.print("  its tree is too large for one cancel: runs below it were left out")
