"""How the CLI shows runs, nodes and times to a person (``3 s ago``, ``17.4 ms``, local clock
times), and the ISO 8601 timestamps of its ``--json`` output."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

# the fields that hold a timestamp (seconds since the epoch, on the Redis server clock)
TIME_FIELDS = frozenset(
    {
        "at",
        "created_at",
        "started_at",
        "finished_at",
        "cancel_requested_at",
        "cancel_delivered_at",
        "cancel_observed_at",
        "last_heartbeat",
        "lease_expires_at",
        "probe_at",
        "expires_at",
    }
)
ACTIVE = ("queued", "running", "waiting")
SLOWEST_SHOWN = 5  # code sites where a run went longest without a checkpoint
CANCEL_PHASES = (
    ("delivered", "cancel_delivered_at"),
    ("observed", "cancel_observed_at"),
    ("finished", "finished_at"),
)


def span(seconds: float) -> str:
    """``0.26 ms``, ``17 ms``, ``3.2 s``, ``45 s``, ``5 min``, ``3 h``, ``2 d``."""
    if seconds < 1:
        return f"{seconds * 1000:.{2 if seconds < 0.01 else 0}f} ms"
    if seconds < 120:
        return f"{seconds:.{1 if seconds < 10 else 0}f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} d"


def ago(at: float, now: float) -> str:
    return f"{span(max(0.0, now - at))} ago"


def local_time(at: float) -> str:
    """The local clock time, to the millisecond: ``2026-05-01 14:03:07.412``."""
    return datetime.fromtimestamp(at).astimezone().strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def iso(at: float) -> str:
    """ISO 8601 in UTC, to the microsecond: ``2026-05-01T12:03:07.412345Z``."""
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def with_iso_times(value: Any) -> Any:
    """``value`` (an API answer) with every timestamp field as an ISO 8601 string."""
    if isinstance(value, dict):
        return {
            key: iso(item)
            if key in TIME_FIELDS and isinstance(item, int | float)
            else with_iso_times(item)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [with_iso_times(item) for item in value]
    return value


def as_json(value: Any) -> str:
    return json.dumps(with_iso_times(value), indent=2)


def status_of(run: dict[str, Any]) -> str:
    """``running``, ``stopping``, or a final status with its end reason when it says more."""
    if run["stopping"]:
        return "stopping"
    reason = run.get("end_reason")
    if reason in (None, "completed", run["status"]):
        return str(run["status"])
    return f"{run['status']} ({reason})"


def session_of(run: dict[str, Any]) -> str:
    parts = (run.get("app_name"), run.get("user_id"), run.get("session_id"))
    return " / ".join(part for part in parts if part) or "-"


def runs_table(
    runs: list[dict[str, Any]], now: float, width: int, title: str | None = None
) -> RenderableType:
    """Full run ids (never cut), status, owner, phase, session, age: a table, or two lines a
    run when the table would not fit ``width`` columns."""
    headers = ["run", "status", "owner", "phase", "app / user / session", "started"]
    ended = any(run.get("finished_at") for run in runs)
    rows = [
        [
            run["run_id"],
            status_of(run),
            run.get("owner") or "-",
            run.get("phase") or "-",
            session_of(run),
            ago(run["created_at"], now),
            *([ago(run["finished_at"], now) if run.get("finished_at") else "-"] if ended else []),
        ]
        for run in runs
    ]
    if ended:
        headers.append("ended")
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows, strict=True)]
    if sum(widths) + 2 * (len(widths) - 1) > width:
        return _run_lines(rows, title)
    table = _table(title)
    for header in headers:
        table.add_column(header, no_wrap=True)
    for row in rows:
        table.add_row(*row)
    return table


def _run_lines(rows: list[list[str]], title: str | None) -> Group:
    """A narrow terminal: the id and status on one line, the rest on the next."""
    lines = [Text(title, style="bold")] if title else []
    for run_id, status, owner, phase, session, started, *ended in rows:
        lines.append(Text(f"{run_id}  {status}", style="bold"))
        details = [f"on {owner}", f"phase {phase}", session, f"started {started}"]
        details += [f"ended {when}" for when in ended if when != "-"]
        lines.append(Text("  " + " · ".join(details)))
    return Group(*lines)


def _table(title: str | None = None) -> Table:
    return Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        show_edge=False,
        collapse_padding=True,
    )


def nodes_table(nodes: list[dict[str, Any]], now: float) -> Table:
    table = _table()
    for name in ("node", "lease", "heartbeat", "lease left", "probe", "runs", "up", "version"):
        table.add_column(name, no_wrap=True)
    for node in nodes:
        state = "late: lease expiring" if node["state"] == "late" else node["state"]
        table.add_row(
            node["node_id"],
            state,
            f"{span(node['heartbeat_age'])} ago",
            "-" if node["state"] == "expired" else span(node["lease_left"]),
            probe_of(node, now),
            str(node["active_runs"]),
            span(max(0.0, now - node["started_at"])),
            node["version"],
        )
    return table


def probe_of(node: dict[str, Any], now: float) -> str:
    """The last probe of the node's own channel: its latency and when it came back."""
    if node.get("probe_at") is None or node.get("probe_latency_ms") is None:
        return "-"
    return f"{span(node['probe_latency_ms'] / 1000)}, {ago(node['probe_at'], now)}"


def selector_of(selector: dict[str, Any]) -> str:
    """``app=shop user=alice meta.tier=gold started<14:03:07``."""
    short = {"app_name": "app", "user_id": "user", "session_id": "session", "node_id": "node"}
    parts = []
    for key, value in selector.items():
        if key == "metadata":
            parts += [f"meta.{name}={json.dumps(item)}" for name, item in value.items()]
        elif key == "started_before":
            parts.append(f"started<{local_time(value)[11:19]}")
        else:
            parts.append(f"{short.get(key, key)}={value}")
    return " ".join(parts)


def tombstones_table(tombstones: list[dict[str, Any]], now: float) -> Table:
    table = _table()
    for name in ("tombstone", "holds runs of", "mode", "by", "reason", "expires"):
        table.add_column(name, no_wrap=name != "reason")
    for tombstone in tombstones:
        expires = tombstone["expires_at"]
        table.add_row(
            tombstone["tombstone_id"],
            selector_of(tombstone["selector"]),
            tombstone["mode"],
            tombstone.get("requested_by") or "-",
            tombstone.get("reason") or "-",
            f"in {span(max(0.0, expires - now))} ({local_time(expires)[11:19]})",
        )
    return table


def outcome_counts(outcomes: list[dict[str, Any]]) -> str:
    """``3 cancelled, 1 stopping``."""
    counts: dict[str, int] = {}
    for outcome in outcomes:
        counts[outcome["outcome"]] = counts.get(outcome["outcome"], 0) + 1
    return ", ".join(f"{n} {outcome}" for outcome, n in counts.items()) or "none"


def run_details(
    run: dict[str, Any],
    events: list[dict[str, Any]],
    now: float,
    children: Sequence[dict[str, Any]] = (),
) -> RenderableType:
    """The run's fields (its parent and children, a leak after its end, where it went longest
    without a checkpoint), its cancel phase by phase, its event timeline and its output."""
    fields = Table(show_header=False, box=None, pad_edge=False)
    fields.add_column(style="bold", no_wrap=True)
    fields.add_column(overflow="fold")
    for name, value in _fields(run, now):
        fields.add_row(name, value)
    for child in children:
        fields.add_row("child", f"{child['run_id']} ({status_of(child)})")
    for name, value in _checks(run):
        fields.add_row(name, value)
    timeline = _table("timeline")
    for name in ("event", "at", "+ ms"):
        timeline.add_column(name, no_wrap=True)
    timeline.add_column("data", overflow="fold")
    start = events[0]["at"] if events else 0.0
    for event in events:
        data = " ".join(f"{key}={json.dumps(value)}" for key, value in event["data"].items())
        timeline.add_row(
            event["type"], local_time(event["at"])[11:], f"{(event['at'] - start) * 1000:.1f}", data
        )
    if run["status"] in ACTIVE:
        note = f"\noutput: recorded when the run ends (live: GET /v1/runs/{run['run_id']}/stream)"
        return Group(fields, timeline, Text(note, style="bold"))
    size = f"{len(run['output'])} chars" + (", truncated" if run["output_truncated"] else "")
    output = Text(f"\noutput ({size}):\n", style="bold")
    return Group(fields, timeline, output, Text(_shorten(run["output"])))


def _fields(run: dict[str, Any], now: float) -> list[tuple[str, str]]:
    rows = [
        ("run", run["run_id"]),
        ("status", status_of(run)),
        ("owner", run.get("owner") or "-"),
        *([("parent", run["parent"])] if run.get("parent") else []),
        ("session", session_of(run)),
        ("created", f"{local_time(run['created_at'])} ({ago(run['created_at'], now)})"),
    ]
    if run.get("finished_at"):
        began = run.get("started_at") or run["created_at"]
        rows.append(
            (
                "finished",
                f"{local_time(run['finished_at'])} (ran {span(run['finished_at'] - began)})",
            )
        )
    if run.get("phase"):
        rows.append(("phase", run["phase"]))
    requested = run.get("cancel_requested_at")
    if requested:
        asked = f"{run['cancel_mode']} by {run.get('requested_by') or '?'}"
        cause = run.get("cancel_cause") or "user"
        rows.append(("cancel", f"requested {local_time(requested)}, {asked} ({cause})"))
        if run.get("cancel_reason"):
            rows.append(("reason", run["cancel_reason"]))
        phases = [
            f"{name} +{span(run[key] - requested)}" if run.get(key) else f"{name} …"
            for name, key in CANCEL_PHASES
        ]
        rows.append(("then", " → ".join(phases)))
    if run.get("error"):
        rows.append(("error", run["error"]))
    if run.get("metadata"):
        rows.append(("metadata", json.dumps(run["metadata"])))
    return rows


def _checks(run: dict[str, Any]) -> list[tuple[str, str]]:
    """What the run's code did after its end (a leak), and its slowest checkpoint sites."""
    rows = []
    leak = run.get("leaked_after_cancel")
    if leak:
        calls = ", ".join(f"{n} {call}" for call, n in leak.get("calls", {}).items())
        first = f"; first: {leak['first_call']} at {leak.get('first_site', '?')}"
        rows.append(("leaked", calls + (first if leak.get("first_call") else "")))
    slowest = sorted((run.get("slowest_checkpoints") or {}).items(), key=lambda kv: -kv[1])
    for site, ms in slowest[:SLOWEST_SHOWN]:
        rows.append(("no checkpoint", f"{span(ms / 1000)} after {site}"))
    return rows


def _shorten(text: str, limit: int = 400) -> str:
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text) - limit} more chars)"
