"""The ``cancel-bus`` command: serve a node, demo a local cluster, inspect and cancel runs.

Client commands talk HTTP to ``--url`` (default: the local node) with ``--token``; ``--json``
prints machine-readable output (timestamps in ISO 8601). Errors are one line on stderr; the
exit codes are in :class:`Exit`.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import operator
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from datetime import time as dt_time
from enum import IntEnum
from typing import Any, ClassVar, NoReturn, get_args
from urllib.parse import quote, urlsplit

import httpx
import uvicorn
from pydantic import BaseModel, ValidationError
from rich.console import Console
from rich.live import Live

from cancel_bus import (
    CancelBusError,
    CancelMode,
    InvalidArgument,
    RunInfo,
    Tombstone,
    __version__,
    acl_rules,
)

from .display import (
    as_json,
    local_time,
    nodes_table,
    outcome_counts,
    run_details,
    runs_table,
    selector_of,
    span,
    status_of,
    tombstones_table,
)
from .queries import WINDOW, RunQuery, StatusFilter
from .schemas import (
    CancelAnswer,
    CancelBody,
    EventList,
    NodeList,
    Problem,
    RunList,
    SelectorAnswer,
    SelectorCancel,
    TombstoneList,
)
from .server import DrainingServer, PortInUse
from .settings import Settings

DEFAULT_URL = "http://127.0.0.1:8080"
HTTP_TIMEOUT = 10.0  # seconds for a node's answer (beyond what a cancel waits on purpose)
MAX_HTTP_TIMEOUT = 3600.0
MAX_WATCH = 86400.0  # runs --watch: the longest pause between refreshes
out = Console(highlight=False, markup=False)  # what it shows is data, never markup


class Exit(IntEnum):
    """The exit codes of ``cancel-bus``."""

    OK = 0  # cancel: cancelled, stopping or owner_lost
    ERROR = 1  # the node is unreachable, answered an error or not as a node; a bad config; "no"
    USAGE = 2  # a bad command line
    FINISHED = 3  # cancel: the run had already finished
    NOT_FOUND = 4  # no such run (or id prefix, tombstone); no active run in the session or match
    AMBIGUOUS = 5  # an id prefix that several runs start with


EXIT_HELP = """exit codes:
  0  done (cancel: cancelled, stopping or owner_lost)
  1  error: the node is unreachable, answered an error, or did not answer (in time, or as a
     cancel-bus node), or a bad configuration; or the question of cancel-where answered no
  2  a bad command line
  3  cancel: the run had already finished
  4  not found: no such run (or id prefix, or tombstone), no active run in the session, no
     active run that matches (and no tombstone laid)
  5  an id prefix that several runs start with"""
OUTCOME_EXIT = {"not_found": Exit.NOT_FOUND, "already_finished": Exit.FINISHED}
PREVIEW_ROWS = 50  # the matched runs cancel-where shows before it asks


class CliError(Exception):
    """A failure to report as one line, with its exit code."""

    def __init__(self, message: str, code: Exit = Exit.ERROR) -> None:
        super().__init__(message)
        self.code = code


class Parser(argparse.ArgumentParser):
    """argparse, with a bad command line reported in one line (exit code 2)."""

    def error(self, message: str) -> NoReturn:
        _say(f"{self.prog}: {message} (see {self.prog} --help)")
        sys.exit(Exit.USAGE)


def _say(message: str) -> None:
    """One line on stderr, whatever the message holds."""
    sys.stderr.write(" ".join(message.split()) + "\n")


# -- serve ------------------------------------------------------------------------------------


def serve(args: argparse.Namespace) -> int:
    for flag, key in (
        ("redis_url", "REDIS_URL"),
        ("node_id", "NODE_ID"),
        ("host", "HOST"),
        ("port", "PORT"),
        ("namespace", "NAMESPACE"),
    ):
        value = getattr(args, flag)
        if value is not None:
            os.environ[f"CANCEL_BUS_{key}"] = str(value)
    if args.insecure_no_auth:
        os.environ["CANCEL_BUS_INSECURE_NO_AUTH"] = "true"
    from .app import create_app  # noqa: PLC0415 (settings read the environment set above)
    from .embedded import ServerError  # noqa: PLC0415
    from .service import DataDirBusy  # noqa: PLC0415
    from .settings import ENV_PREFIX, Settings  # noqa: PLC0415

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
            node.claim_data_dir()  # before the port: a second node here says whom to join
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
    return 0


def _hint_the_cli() -> None:
    """Where this very command is, when a shell would not find it by name."""
    here = shutil.which(sys.argv[0]) or sys.argv[0]
    if os.path.basename(here) == "cancel-bus" and shutil.which("cancel-bus") != here:
        activate = os.path.join(os.path.dirname(here), "activate")
        out.print(
            f"the CLI: {here} --help (or `source {activate}` for cancel-bus on PATH)",
            soft_wrap=True,
        )


# -- demo -------------------------------------------------------------------------------------


def demo(args: argparse.Namespace) -> int:
    from .demo import NotReady, run_demo  # noqa: PLC0415
    from .embedded import ServerError  # noqa: PLC0415

    if args.nodes < 2:
        raise CliError("a demo of a cross-node cancel needs at least 2 nodes", Exit.USAGE)
    try:
        return run_demo(args.nodes, args.exit)
    except (NotReady, ServerError, httpx.HTTPError) as exc:
        raise CliError(f"demo: {exc}") from None


# -- the HTTP client ----------------------------------------------------------------------------


def _ask(
    args: argparse.Namespace,
    method: str,
    path: str,
    answer: type[BaseModel],
    *,
    ok: tuple[int, ...] = (200,),
    waits: float = 0.0,
    **kwargs: Any,
) -> dict[str, Any]:
    """The node's answer (a status in ``ok``), as ``answer`` describes it; any other status is
    a one-line error with the node's message. ``waits``: the seconds the node takes on purpose
    (a cancel's timeout), on top of ``--http-timeout``."""
    response = _request(args, method, path, waits, **kwargs)
    if response.status_code not in ok:
        raise _refused(args, response)
    return _decoded(args, response, answer)


def _ask_if_found(
    args: argparse.Namespace, method: str, path: str, answer: type[BaseModel], **kwargs: Any
) -> dict[str, Any] | None:
    """:func:`_ask`, with None for the node's 404 (a stray page's 404 is an error)."""
    response = _request(args, method, path, 0.0, **kwargs)
    if response.status_code == 404:
        _decoded(args, response, Problem)
        return None
    if response.status_code != 200:
        raise _refused(args, response)
    return _decoded(args, response, answer)


def _request(
    args: argparse.Namespace, method: str, path: str, waits: float, **kwargs: Any
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    timeout = args.http_timeout + waits
    try:
        with httpx.Client(base_url=args.url, headers=headers, timeout=timeout) as client:
            return client.request(method, path, **kwargs)
    except httpx.TimeoutException:
        raise CliError(f"{args.url} did not answer within {timeout:g} s") from None
    except httpx.HTTPError as exc:
        raise CliError(f"cannot reach {args.url}: {exc or type(exc).__name__}") from None


def _refused(args: argparse.Namespace, response: httpx.Response) -> CliError:
    problem = _decoded(args, response, Problem)
    return CliError(f"{args.url} answered HTTP {response.status_code}: {problem['detail']}")


def _decoded(
    args: argparse.Namespace, response: httpx.Response, answer: type[BaseModel]
) -> dict[str, Any]:
    """The JSON body, checked against the API's model of it: each field the commands read is
    there, of its type. Anything else comes from a server that is no cancel-bus node (a wrong
    ``--url``, a proxy's error page): the one place such an answer is caught."""
    try:
        body = response.json()
        answer.model_validate(body)  # a ValidationError is a ValueError, as bad JSON is
    except ValueError as exc:
        if isinstance(exc, ValidationError):
            first = exc.errors()[0]
            why = f"{'.'.join(map(str, first['loc'])) or 'body'}: {first['msg']}"
        else:
            kind = response.headers.get("content-type", "no content type")
            why = f"{kind}, not JSON: {response.text[:60]!r}"
        request = response.request
        raise CliError(
            f"{args.url} did not answer as a cancel-bus node (HTTP {response.status_code} to "
            f"{request.method} {request.url.path}: {why})"
        ) from None
    decoded: dict[str, Any] = body
    return decoded


def _run_path(run_id: str, suffix: str = "") -> str:
    return f"/v1/runs/{quote(run_id, safe='')}{suffix}"


def _resolve(args: argparse.Namespace, ref: str) -> dict[str, Any]:
    """The run whose id is ``ref``, or the one run whose id starts with it."""
    run = _ask_if_found(args, "GET", _run_path(ref), RunInfo)
    if run is not None:
        return run
    found = _by_prefix(args, ref)
    if found is None:
        raise CliError(_no_run(ref), Exit.NOT_FOUND)
    return found


def _by_prefix(args: argparse.Namespace, prefix: str) -> dict[str, Any] | None:
    """The one run whose id starts with ``prefix`` (among the most recent), if any."""
    params = {"status": "all", "id_prefix": prefix, "limit": 6}
    matches = _ask(args, "GET", "/v1/runs", RunList, params=params)["runs"]
    if len(matches) > 1:
        ids = ", ".join(run["run_id"] for run in matches[:5])
        more = ", ..." if len(matches) > 5 else ""
        raise CliError(f"{prefix} is the start of several run ids: {ids}{more}", Exit.AMBIGUOUS)
    found: dict[str, Any] | None = matches[0] if matches else None
    return found


def _no_run(ref: str) -> str:
    return f"no run {ref} (nor one whose id starts so, of the {WINDOW:,} most recent)"


# -- client commands --------------------------------------------------------------------------


def runs(args: argparse.Namespace) -> int:
    params: dict[str, Any] = {"status": args.status, "limit": args.limit}
    for flag, name in (
        ("node", "node_id"),
        ("app", "app_name"),
        ("user", "user_id"),
        ("session", "session_id"),
        ("parent", "parent"),
        ("phase", "phase"),
        ("id", "id_prefix"),
        ("older_than", "min_age"),
        ("newer_than", "max_age"),
    ):
        if getattr(args, flag) is not None:
            params[name] = getattr(args, flag)
    if args.watch is None:
        answer = _ask(args, "GET", "/v1/runs", RunList, params=params)
        if args.json:
            print(as_json(answer["runs"]))
        else:
            out.print(runs_table(answer["runs"], answer["at"], out.width))
            if answer["more"]:
                out.print(f"(more match: --limit above {args.limit})", style="dim")
        return 0
    return _watch(args, params)


def _watch(args: argparse.Namespace, params: dict[str, Any]) -> int:
    """``runs --watch``: the table again every few seconds, in place; Ctrl-C ends it."""
    refreshes = 0
    try:
        with Live(console=out, auto_refresh=False) as live:
            while args.count is None or refreshes < args.count:
                answer = _ask(args, "GET", "/v1/runs", RunList, params=params)
                title = (
                    f"{len(answer['runs'])}{'+' if answer['more'] else ''} run(s), "
                    f"{args.status}, at {time.strftime('%H:%M:%S')} (Ctrl-C to stop)"
                )
                table = runs_table(answer["runs"], answer["at"], out.width, title)
                live.update(table, refresh=True)
                refreshes += 1
                if args.count is None or refreshes < args.count:
                    time.sleep(args.watch)
    except KeyboardInterrupt:
        pass
    return 0


def run_details_command(args: argparse.Namespace) -> int:
    run = _resolve(args, args.run_id)
    answer = _ask(args, "GET", _run_path(run["run_id"], "/events"), EventList)
    params = {"status": "all", "parent": run["run_id"], "limit": WINDOW}
    children = _ask(args, "GET", "/v1/runs", RunList, params=params)["runs"]
    if args.json:
        print(as_json({"run": run, "events": answer["events"], "children": children}))
        return 0
    out.print(run_details(run, answer["events"], answer["at"], children))
    return 0


def cancel(args: argparse.Namespace) -> int:
    body = {"mode": args.mode, "wait": not args.no_wait, "timeout": args.timeout}
    body["reason"] = args.reason
    if args.session:
        path = "/v1/sessions/{}/{}/{}/cancel".format(*(quote(p, safe="") for p in args.session))
        target = "no active run in session " + "/".join(args.session)
    elif args.run_id:
        path = _run_path(args.run_id, "/cancel")
        target = _no_run(args.run_id)
    else:
        raise CliError("give a RUN_ID or --session APP USER SESSION", Exit.USAGE)
    answers = (200, 202, 404, 409)
    waits = 0.0 if args.no_wait else args.timeout
    answer = _ask(args, "POST", path, CancelAnswer, ok=answers, waits=waits, json=body)
    if answer["outcome"] == "not_found" and args.run_id:  # perhaps the start of an id
        found = _by_prefix(args, args.run_id)
        if found is not None:
            path = _run_path(found["run_id"], "/cancel")
            answer = _ask(args, "POST", path, CancelAnswer, ok=answers, waits=waits, json=body)
    if args.json:
        print(as_json(answer))
    else:
        out.print(_outcome_line(answer, target, args.timeout), soft_wrap=True)
        for below in answer["descendants"]:  # the runs started below it, deepest first
            out.print(f"  below it: {_outcome_line(below, '', args.timeout)}", soft_wrap=True)
        if answer.get("truncated"):
            out.print("  its tree is too large for one cancel: runs below it were left out")
    return OUTCOME_EXIT.get(answer["outcome"], Exit.OK)


def _outcome_line(answer: dict[str, Any], not_found: str, timeout: float) -> str:
    outcome, run = answer["outcome"], answer["run"]
    if run is None:
        return f"{outcome}: {not_found}"
    what = f"run {run['run_id']}"
    requested = run.get("cancel_requested_at")
    if outcome == "cancelled" and requested and run.get("finished_at"):
        return f"{outcome}: {what} stopped {span(run['finished_at'] - requested)} after the request"
    if outcome == "stopping":
        return f"{outcome}: {what}: the cancel is recorded; not confirmed within {timeout:g} s"
    if outcome == "owner_lost":
        return f"{outcome}: {what}: its node had died; resolved when its lease expired"
    return f"{outcome}: {what} ({status_of(run)})"


SELECTOR_FLAGS = (("app", "app_name"), ("user", "user_id"), ("session", "session_id"))


def cancel_where(args: argparse.Namespace) -> int:
    """Preview the runs a selector matches, ask, then cancel them (``--yes``: without asking;
    ``--dry-run``: only the preview)."""
    if args.json and not (args.yes or args.dry_run):
        raise CliError("--json needs --yes or --dry-run (it asks no question)", Exit.USAGE)
    body = _selector_body(args)
    preview = _ask(args, "POST", "/v1/cancel-where", SelectorAnswer, json={**body, "dry_run": True})
    holds = args.ttl is not None or args.until is not None
    if args.dry_run or not args.yes:
        if args.json:
            print(as_json(preview))
        else:
            _show_preview(args, body, preview)
    if args.dry_run or (preview["matched"] == 0 and not holds):
        return Exit.OK if preview["matched"] else Exit.NOT_FOUND
    if not args.yes and not _confirmed(preview["matched"], args):
        out.print("nothing cancelled")
        return Exit.ERROR
    waits = 0.0 if args.no_wait else args.timeout
    cancelled = {**body, "dry_run": False}
    answer = _ask(args, "POST", "/v1/cancel-where", SelectorAnswer, waits=waits, json=cancelled)
    if args.json:
        print(as_json(answer))
    else:
        _show_cancelled(answer, args.timeout)
    return Exit.OK if answer["matched"] or answer["tombstones"] else Exit.NOT_FOUND


def _selector_body(args: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {
        name: getattr(args, flag)
        for flag, name in (*SELECTOR_FLAGS, ("node", "node_id"))
        if getattr(args, flag) is not None
    }
    if args.meta:
        body["metadata"] = dict(args.meta)
    if args.started_before is not None:
        body["started_before"] = args.started_before
    if args.older_than is not None:
        body["min_age"] = args.older_than
    if args.ttl is not None:
        body["ttl"] = args.ttl
    if args.until is not None:
        body["until"] = args.until
    body.update(mode=args.mode, reason=args.reason, wait=not args.no_wait, timeout=args.timeout)
    return body


def _show_preview(args: argparse.Namespace, body: dict[str, Any], preview: dict[str, Any]) -> None:
    """The count, then the matched runs as ``runs`` shows them (those among the most recent
    active runs; any other by its id)."""
    matched, ids = preview["matched"], preview["run_ids"]
    out.print(f"{matched} active run(s) match {_described(body)}", soft_wrap=True)
    if not ids:
        return
    params = {"status": "active", "limit": WINDOW} | {
        name: body[name]
        for name in ("app_name", "user_id", "session_id", "node_id")
        if name in body
    }
    listed = _ask(args, "GET", "/v1/runs", RunList, params=params)
    wanted = set(ids)
    shown = [run for run in listed["runs"] if run["run_id"] in wanted][:PREVIEW_ROWS]
    out.print(runs_table(shown, listed["at"], out.width))
    known = {run["run_id"] for run in shown}
    rest = [run_id for run_id in ids if run_id not in known]
    if rest:
        more = f" (and {len(rest) - PREVIEW_ROWS} more)" if len(rest) > PREVIEW_ROWS else ""
        out.print("also: " + ", ".join(rest[:PREVIEW_ROWS]) + more, soft_wrap=True)


def _described(body: dict[str, Any]) -> str:
    criteria = {
        key: value
        for key, value in body.items()
        if key in ("app_name", "user_id", "session_id", "node_id", "metadata", "started_before")
    }
    text = selector_of(criteria)
    if "min_age" in body:
        text = f"{text} started {span(body['min_age'])} ago or earlier".strip()
    return text


def _confirmed(matched: int, args: argparse.Namespace) -> bool:
    """Ask on the terminal (or read the answer from stdin): anything but yes is no."""
    hold = ""
    if args.ttl is not None:
        hold = f", and cancel matching runs started in the next {span(args.ttl)}"
    elif args.until is not None:
        hold = f", and cancel matching runs started until {local_time(args.until)}"
    out.print(f"Cancel {matched} run(s) and the runs below them{hold}? [y/N] ", end="")
    answer = sys.stdin.readline()
    if not sys.stdin.isatty():
        out.print(answer.strip())  # as a terminal would have echoed it
    return answer.strip().lower() in ("y", "yes")


def _show_cancelled(answer: dict[str, Any], timeout: float) -> None:
    """A line of counts, a line per run, a line per tombstone."""
    results = answer["results"]
    below = [descendant for result in results for descendant in result["descendants"]]
    line = f"{answer['matched']} run(s) matched: {outcome_counts(results)}"
    if below:
        line += f"; {len(below)} run(s) below them: {outcome_counts(below)}"
    out.print(line, soft_wrap=True)
    for result in results:
        after = result["stopped_after"]
        stopped = f" stopped {span(after)} after the request" if after is not None else ""
        if result["outcome"] == "stopping":
            stopped = f": recorded, not confirmed within {timeout:g} s"
        out.print(f"  {result['outcome']}: run {result['run_id']}{stopped}", soft_wrap=True)
    for tombstone in answer["tombstones"]:
        expires = tombstone["expires_at"]
        out.print(
            f"tombstone {tombstone['tombstone_id']}: runs of {selector_of(tombstone['selector'])}"
            f" started in the next {span(expires - answer['at'])} (until "
            f"{local_time(expires)[11:19]}) are cancelled at their start; "
            f"cancel-bus tombstones rm {tombstone['tombstone_id']} lifts it",
            soft_wrap=True,
        )


def tombstones(args: argparse.Namespace) -> int:
    if args.action is None:
        answer = _ask(args, "GET", "/v1/tombstones", TombstoneList)
        if args.json:
            print(as_json(answer["tombstones"]))
        elif answer["tombstones"]:
            out.print(tombstones_table(answer["tombstones"], answer["at"]))
        else:
            out.print("no tombstone holds runs")
        return Exit.OK
    if args.tombstone_id is None:
        raise CliError("tombstones rm needs a TOMBSTONE_ID", Exit.USAGE)
    path = f"/v1/tombstones/{quote(args.tombstone_id, safe='')}"
    removed = _ask_if_found(args, "DELETE", path, Tombstone)
    if removed is None:
        raise CliError(f"no live tombstone {args.tombstone_id}", Exit.NOT_FOUND)
    if args.json:
        print(as_json(removed))
    else:
        selector = selector_of(removed["selector"])
        out.print(f"removed tombstone {removed['tombstone_id']} ({selector})", soft_wrap=True)
    return Exit.OK


def nodes(args: argparse.Namespace) -> int:
    answer = _ask(args, "GET", "/v1/nodes", NodeList)
    if args.json:
        print(as_json(answer["nodes"]))
    else:
        out.print(nodes_table(answer["nodes"], answer["at"]))
    return 0


def print_acl_rules(args: argparse.Namespace) -> int:
    try:
        print(acl_rules(*args.namespaces))
    except InvalidArgument as exc:
        raise CliError(str(exc)) from None
    return 0


# -- parser -----------------------------------------------------------------------------------


def _http_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise argparse.ArgumentTypeError(f"{value!r} is not an http(s) URL, e.g. {DEFAULT_URL}")
    return value


def _seconds(value: str) -> float:
    """``90``, ``90s``, ``5m``, ``2h``, ``1d``."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    number, unit = (value[:-1], value[-1]) if value[-1:] in units else (value, "s")
    try:
        seconds = float(number) * units[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a duration (90s, 5m, 2h)") from None
    if not 0 <= seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"{value!r} is not a duration (90s, 5m, 2h)")
    return seconds


def _time(value: str) -> float:
    """An ISO 8601 time (``2026-05-01T14:30:00Z``; without a zone: local), or a local clock
    time today (``14:30``, ``14:30:05``): seconds since the epoch."""
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        pass
    try:
        clock = dt_time.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a time (2026-05-01T14:30:00Z, or 14:30 today)"
        ) from None
    return datetime.combine(datetime.now().date(), clock).timestamp()


def _metadata_item(value: str) -> tuple[str, str | int | float | bool]:
    """``KEY=TEXT`` (a string), or ``KEY:=JSON`` (a number or true/false)."""
    key, typed, raw = value.partition(":=")
    if not typed:
        key, equals, raw = value.partition("=")
        if not equals or not key:
            raise argparse.ArgumentTypeError(f"{value!r} is not KEY=VALUE (or KEY:=NUMBER)")
        return key, raw
    try:
        parsed = json.loads(raw)
    except ValueError:
        parsed = None
    if not key or isinstance(parsed, dict | list) or parsed is None:
        raise argparse.ArgumentTypeError(f"{value!r}: KEY:= takes a number, true or false")
    return key, parsed


def _number(kind: type[int] | type[float]) -> Callable[[str], float]:
    """A finite number of this kind (``nan``, ``inf`` and ``1e400`` are none)."""
    what = "a whole number" if kind is int else "a number"

    def parse(value: str) -> float:
        try:
            number = kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not {what}") from None
        if not math.isfinite(number):
            raise argparse.ArgumentTypeError(f"{value!r} is not {what}")
        return number

    return parse


def _plain(number: float) -> str:
    return f"{number:g}"


def _duration(seconds: float) -> str:
    """``7d``, ``5m``, ``90s``: as ``_seconds`` reads them."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


class Within:
    """An argparse ``type=``: a value ``parse`` reads, within ``limits`` (pydantic's names: gt,
    ge, lt, le). Built from the node's own model of a field (:meth:`of`), it refuses as a bad
    command line (exit code 2) what the node would refuse (HTTP 422)."""

    CHECKS: ClassVar[dict[str, tuple[Callable[[float, float], bool], str]]] = {
        "gt": (operator.gt, "above"),
        "ge": (operator.ge, "at least"),
        "lt": (operator.lt, "below"),
        "le": (operator.le, "at most"),
    }

    def __init__(
        self,
        parse: Callable[[str], float],
        limits: dict[str, float],
        show: Callable[[float], str] = _plain,
    ) -> None:
        self.parse, self.limits, self.show = parse, limits, show

    @classmethod
    def of(
        cls,
        model: type[BaseModel],
        field: str,
        parse: Callable[[str], float],
        show: Callable[[float], str] = _plain,
    ) -> Within:
        limits = {
            name: getattr(constraint, name)
            for constraint in model.model_fields[field].metadata
            for name in cls.CHECKS
            if getattr(constraint, name, None) is not None
        }
        return cls(parse, limits, show)

    def __call__(self, value: str) -> float:
        number = self.parse(value)  # finite, or an ArgumentTypeError
        if not all(self.CHECKS[name][0](number, bound) for name, bound in self.limits.items()):
            raise argparse.ArgumentTypeError(f"{value!r} is out of range ({self})")
        return number

    def __str__(self) -> str:
        """``0.1-60``, or ``above 0s, at most 7d``."""
        if self.limits.keys() == {"ge", "le"}:
            return f"{self.show(self.limits['ge'])}-{self.show(self.limits['le'])}"
        return ", ".join(
            f"{self.CHECKS[name][1]} {self.show(bound)}" for name, bound in self.limits.items()
        )


def _add_cancel_options(p: argparse.ArgumentParser, runs: str, body: type[BaseModel]) -> None:
    """--mode, --reason, --no-wait and --timeout, as the node's ``body`` takes them."""
    p.add_argument(
        "--mode",
        default="checkpoint",
        choices=[mode.value for mode in CancelMode],
        help="checkpoint (default): at its next checkpoint; immediate: also interrupt what it "
        "awaits; after_turn: once its turn ends",
    )
    p.add_argument("--reason", help="recorded with the run")
    p.add_argument("--no-wait", action="store_true", help="answer once recorded: stopping")
    timeout = Within.of(body, "timeout", _number(float))
    p.add_argument(
        "--timeout",
        type=timeout,
        default=5.0,
        help=f"seconds to wait for {runs} to stop ({timeout}, default 5)",
    )


def _add_selector_commands(commands: Any, client: argparse.ArgumentParser) -> None:
    """cancel-where and tombstones."""
    p = commands.add_parser(
        "cancel-where",
        parents=[client],
        help="cancel every active run that matches (a preview first)",
        description="Cancel every active run that matches all the criteria given, from any "
        "node, with the runs below each. It shows the runs that match and asks first (--yes: "
        "without asking; --dry-run: only the preview); it cancels what matches when it runs. "
        "With --ttl or --until, a tombstone also cancels matching runs started until then (see "
        "tombstones). A user token's selector is its own runs.",
        epilog=EXIT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--app", help="runs of this app")
    p.add_argument("--user", help="runs of this user")
    p.add_argument("--session", help="runs of this session")
    p.add_argument("--node", help="runs owned by this node")
    p.add_argument(
        "--meta",
        type=_metadata_item,
        action="append",
        metavar="KEY=VALUE",
        help="runs whose metadata has KEY=VALUE (a string; KEY:=5 or KEY:=true for a number "
        "or a boolean); repeat for several",
    )
    started = p.add_mutually_exclusive_group()
    started.add_argument(
        "--started-before",
        type=_time,
        metavar="TIME",
        help="runs started before TIME (2026-05-01T14:30:00Z, or 14:30 today)",
    )
    started.add_argument(
        "--older-than",
        type=Within.of(SelectorCancel, "min_age", _seconds, _duration),
        metavar="AGE",
        help="runs started AGE ago or more (5m)",
    )
    hold = p.add_mutually_exclusive_group()
    ttl = Within.of(SelectorCancel, "ttl", _seconds, _duration)
    hold.add_argument(
        "--ttl",
        type=ttl,
        metavar="DURATION",
        help=f"also cancel matching runs started in the next DURATION (60s, 5m; {ttl})",
    )
    hold.add_argument(
        "--until", type=_time, metavar="TIME", help="also cancel matching runs started until TIME"
    )
    _add_cancel_options(p, "them", SelectorCancel)
    act = p.add_mutually_exclusive_group()
    act.add_argument("--yes", action="store_true", help="cancel without asking")
    act.add_argument("--dry-run", action="store_true", help="only show what matches")
    p.set_defaults(func=cancel_where)

    p = commands.add_parser(
        "tombstones",
        parents=[client],
        help="the tombstones of selector cancels; tombstones rm ID lifts one",
        description="The live tombstones (an ops token: all; a user token: those it laid): "
        "each cancels the runs its selector matches that start before it expires.",
    )
    p.add_argument("action", nargs="?", choices=["rm"], help="rm: lift the tombstone ID")
    p.add_argument("tombstone_id", nargs="?", metavar="ID", help="the tombstone to lift")
    p.set_defaults(func=tombstones)


def _client_options() -> Parser:
    """The options of every command that asks a node."""
    client = Parser(add_help=False)
    client.add_argument(
        "--url",
        type=_http_url,
        default=os.environ.get("CANCEL_BUS_URL", DEFAULT_URL),
        help=f"the node to ask (CANCEL_BUS_URL; default {DEFAULT_URL})",
    )
    client.add_argument(
        "--token",
        default=os.environ.get("CANCEL_BUS_TOKEN"),
        help="bearer token (CANCEL_BUS_TOKEN), if the node has API tokens",
    )
    client.add_argument(
        "--json", action="store_true", help="JSON output for scripts (ISO 8601 times)"
    )
    http_timeout = Within(_number(float), {"gt": 0, "le": MAX_HTTP_TIMEOUT})
    client.add_argument(
        "--http-timeout",
        type=http_timeout,
        default=HTTP_TIMEOUT,
        metavar="SECONDS",
        help=f"how long to wait for the node's answer ({http_timeout}, default "
        f"{HTTP_TIMEOUT:g}); a cancel that waits for runs to stop waits its --timeout more",
    )
    return client


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="cancel-bus",
        description="Cancel long-running work from any node of a cluster.",
        epilog=EXIT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"cancel-bus {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = commands.add_parser(
        "serve",
        help="run a node (no Redis URL: an embedded server)",
        description="Run a node: the HTTP API, the dashboard at /, API docs at /docs. Settings "
        "come from CANCEL_BUS_* variables (README, Configuration); these flags override a few. "
        "Ctrl-C (SIGTERM) drains: runs get CANCEL_BUS_DRAIN_TIMEOUT to finish, then are "
        "cancelled; a second Ctrl-C cancels them at once.",
    )
    p.add_argument("--host", help="address to listen on (CANCEL_BUS_HOST; default 127.0.0.1)")
    port = Within.of(Settings, "port", _number(int))
    p.add_argument(
        "--port", type=port, help=f"port to listen on ({port}; CANCEL_BUS_PORT; default 8080)"
    )
    p.add_argument("--redis-url", help="Redis URL (CANCEL_BUS_REDIS_URL; none: embedded server)")
    p.add_argument("--node-id", help="this node's id (CANCEL_BUS_NODE_ID; default host-pid-random)")
    p.add_argument("--namespace", help="key prefix shared by the cluster (CANCEL_BUS_NAMESPACE)")
    p.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="without API tokens, listen beyond loopback all the same (anyone may cancel)",
    )
    p.set_defaults(func=serve)

    p = commands.add_parser(
        "demo",
        help="a local cluster: cancel a run on node 1 via node 2",
        description="Start an embedded server and N nodes, cancel a run of node 1 through node "
        "2, then keep the cluster up until Ctrl-C (or SIGTERM): its processes stop with it.",
    )
    p.add_argument("--nodes", type=int, default=3, help="how many nodes (default 3, at least 2)")
    p.add_argument("--exit", action="store_true", help="stop after the demo instead of waiting")
    p.set_defaults(func=demo)

    client = _client_options()

    p = commands.add_parser(
        "runs",
        parents=[client],
        help="list runs across the cluster",
        description="Runs across the cluster, the most recent first (an active run by its "
        "start, a finished one by its end). Session, parent, phase, id and age filters look "
        f"through the {WINDOW:,} most recent runs.",
    )
    p.add_argument(
        "--status",
        default="active",
        choices=get_args(StatusFilter),
        help="active (default), finished, all, or one status",
    )
    p.add_argument("--node", help="runs owned by this node")
    p.add_argument("--app", help="runs of this app")
    p.add_argument("--user", help="runs of this user")
    p.add_argument("--session", help="runs of this session")
    p.add_argument("--parent", metavar="RUN_ID", help="runs started as children of this run")
    p.add_argument("--phase", help="runs in this phase, or kind of phase (tool: tool:search)")
    p.add_argument("--id", help="runs whose id starts so")
    p.add_argument(
        "--older-than",
        type=Within.of(RunQuery, "min_age", _seconds, _duration),
        metavar="AGE",
        help="started AGE ago or more (90s, 5m, 2h)",
    )
    p.add_argument(
        "--newer-than",
        type=Within.of(RunQuery, "max_age", _seconds, _duration),
        metavar="AGE",
        help="started AGE ago or less",
    )
    limit = Within.of(RunQuery, "limit", _number(int))
    p.add_argument("--limit", type=limit, default=100, help=f"at most ({limit}, default 100)")
    p.add_argument(
        "--watch",
        type=Within(_number(float), {"gt": 0, "le": MAX_WATCH}),
        nargs="?",
        const=2.0,
        metavar="SECONDS",
        help="show the list again every SECONDS (default 2) until Ctrl-C",
    )
    p.add_argument(
        "--count",
        type=Within(_number(int), {"ge": 1}),
        help="with --watch: stop after COUNT refreshes",
    )
    p.set_defaults(func=runs)

    p = commands.add_parser(
        "run",
        parents=[client],
        help="one run: details, cancel phases, event timeline, output",
        description="One run, by its id or the start of it (unique among the recent runs).",
    )
    p.add_argument("run_id", metavar="RUN_ID", help="a run id, or the start of one")
    p.set_defaults(func=run_details_command)

    p = commands.add_parser(
        "cancel",
        parents=[client],
        help="cancel a run (or a session's active run) from any node",
        description="Cancel a run by its id (or the start of one), or a session's active run. "
        "Waits up to --timeout for the owner to confirm.",
        epilog=EXIT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run_id", nargs="?", metavar="RUN_ID", help="a run id, or the start of one")
    p.add_argument("--session", nargs=3, metavar=("APP", "USER", "SESSION"), help="a session")
    _add_cancel_options(p, "it", CancelBody)
    p.set_defaults(func=cancel)

    _add_selector_commands(commands, client)

    p = commands.add_parser(
        "nodes",
        parents=[client],
        help="the live nodes and their leases (needs an ops token)",
        description="The live nodes: lease state (late: a heartbeat missed, it may be dying), "
        "heartbeat, lease left, the last probe of its own channel (latency, when), active "
        "runs.",
    )
    p.set_defaults(func=nodes)

    p = commands.add_parser(
        "acl-rules",
        help="the Redis ACL rules of a user for these namespaces (and nothing else)",
        description="Print the rules of ACL SETUSER for a user confined to these namespaces.",
    )
    p.add_argument("namespaces", nargs="+", metavar="NAMESPACE", help="a namespace it may use")
    p.set_defaults(func=print_acl_rules)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "json", False) and getattr(args, "watch", None) is not None:
        _say("cancel-bus runs: --watch shows a table: give it without --json")
        return Exit.USAGE
    try:
        code: int = args.func(args)
    except CliError as exc:
        _say(f"cancel-bus: {exc}")
        return exc.code
    except KeyboardInterrupt:
        return 130  # Ctrl-C before serving or between steps: quietly
    return code


if __name__ == "__main__":
    sys.exit(main())
