"""How the CLI shows runs, nodes and times to a person (``3 s ago``, ``17.4 ms``, local clock
times, ids never cut), and the ISO 8601 timestamps of its ``--json`` output."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel
from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from cancel_bus import RunEvent, RunInfo, Tombstone

from .schemas import NodeView

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
SLOWEST_SHOWN = 5  # code sites where a run went longest without a checkpoint
CANCEL_PHASES = (
    ("delivered", "cancel_delivered_at"),
    ("observed", "cancel_observed_at"),
    ("finished", "finished_at"),
)
GAP = 2  # columns between a table's columns
REPLACED = frozenset({"interrupt", "rollback"})  # causes whose requester replaced the run


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
    """``5 min ago``: the :func:`span` from ``at`` to ``now`` (0 if ``at`` is later)."""
    return f"{span(max(0.0, now - at))} ago"


def local_time(at: float) -> str:
    """The local clock time, to the millisecond: ``2026-05-01 14:03:07.412``."""
    return datetime.fromtimestamp(at).astimezone().strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def clock(at: float) -> str:
    """The local clock time, to the second: ``14:03:07``."""
    return local_time(at)[11:19]


def iso(at: float) -> str:
    """ISO 8601 in UTC, to the microsecond: ``2026-05-01T12:03:07.412345Z``."""
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def with_iso_times(value: Any) -> Any:
    """``value`` (an API answer as JSON) with every timestamp field as an ISO 8601 string."""
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


def jsonable(value: BaseModel | Sequence[BaseModel] | Mapping[str, Any]) -> Any:
    """Models (or lists, or dicts of them) as the API sends them."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, Mapping):
        return {key: jsonable(item) for key, item in value.items()}
    return [jsonable(item) for item in value]


def json_text(value: BaseModel | Sequence[BaseModel] | Mapping[str, Any], indent: int = 2) -> str:
    """Models (or lists, or dicts of them) as indented JSON, times in ISO 8601: what ``--json``
    prints."""
    return json.dumps(with_iso_times(jsonable(value)), indent=indent)


def status_of(run: RunInfo) -> str:
    """``running``, ``stopping``, or a final status with its end reason when it says more."""
    if run.stopping:
        return "stopping"
    if run.end_reason in (None, "completed", run.status.value):
        return run.status.value
    return f"{run.status.value} ({run.end_reason})"


def session_of(run: RunInfo) -> str:
    """``app / user / session``, the parts the run has; ``-`` if none."""
    parts = (run.app_name, run.user_id, run.session_id)
    return " / ".join(part for part in parts if part) or "-"


def grid(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    width: int,
    title: str | None = None,
    labels: Sequence[str] | None = None,
) -> RenderableType:
    """A table whose cells are never cut: when it would not fit ``width`` columns, each row on
    two lines, its first two cells, then the others, each after its label (its header unless
    ``labels`` says otherwise; ``-`` cells left out). Print it with ``crop=False``."""
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows, strict=True)]
    if sum(widths) + GAP * (len(widths) - 1) <= width:
        table = _table(title)
        for header in headers:
            table.add_column(header, no_wrap=True)
        for row in rows:
            table.add_row(*row)
        return table
    named = labels or headers[2:]
    lines = [Text(title, style="bold")] if title else []
    for first, second, *rest in rows:
        # ids whole on one line, however narrow the terminal (printed uncropped): it wraps them
        lines.append(Text(f"{first}  {second}", style="bold", no_wrap=True, overflow="ignore"))
        details = [
            f"{label} {cell}".strip()
            for label, cell in zip(named, rest, strict=True)
            if cell != "-"
        ]
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


def runs_table(
    runs: Sequence[RunInfo], now: float, width: int, title: str | None = None
) -> RenderableType:
    """Full run ids, status, owner, phase, session, age (and end, if one ended)."""
    headers = ["run", "status", "owner", "phase", "app / user / session", "started"]
    ended = any(run.finished_at for run in runs)
    rows = [
        [
            run.run_id,
            status_of(run),
            run.owner or "-",
            run.phase or "-",
            session_of(run),
            ago(run.created_at, now),
            *([ago(run.finished_at, now) if run.finished_at else "-"] if ended else []),
        ]
        for run in runs
    ]
    if ended:
        headers.append("ended")
    labels = ["on", "phase", "", "started", "ended"][: len(headers) - 2]
    return grid(headers, rows, width, title, labels)


def nodes_table(nodes: Sequence[NodeView], now: float, width: int) -> RenderableType:
    """Full node ids, lease state, heartbeat, lease left, last probe, runs, uptime, version."""
    headers = ["node", "lease", "heartbeat", "lease left", "probe", "runs", "up", "version"]
    rows = [
        [
            node.node_id,
            "late: lease expiring" if node.state == "late" else node.state,
            f"{span(node.heartbeat_age)} ago",
            "-" if node.state == "expired" else span(node.lease_left),
            probe_of(node, now),
            str(node.active_runs),
            span(max(0.0, now - node.started_at)),
            node.version,
        ]
        for node in nodes
    ]
    return grid(headers, rows, width)


def probe_of(node: NodeView, now: float) -> str:
    """The last probe of the node's own channel: its latency and when it came back."""
    if node.probe_at is None or node.probe_latency_ms is None:
        return "-"
    return f"{span(node.probe_latency_ms / 1000)}, {ago(node.probe_at, now)}"


def selector_of(selector: Mapping[str, Any]) -> str:
    """``app=shop user=alice meta.tier=gold started<14:03:07``."""
    short = {"app_name": "app", "user_id": "user", "session_id": "session", "node_id": "node"}
    parts = []
    for key, value in selector.items():
        if key == "metadata":
            parts += [f"meta.{name}={json.dumps(item)}" for name, item in value.items()]
        elif key == "started_before":
            parts.append(f"started<{clock(value)}")
        else:
            parts.append(f"{short.get(key, key)}={value}")
    return " ".join(parts)


def tombstones_table(tombstones: Sequence[Tombstone], now: float, width: int) -> RenderableType:
    """Full tombstone ids, the runs each holds, mode, who laid it, reason, when it expires."""
    headers = ["tombstone", "holds runs of", "mode", "by", "reason", "expires"]
    rows = [
        [
            tombstone.tombstone_id,
            selector_of(tombstone.selector),
            tombstone.mode.value,
            tombstone.requested_by or "-",
            tombstone.reason or "-",
            f"in {span(max(0.0, tombstone.expires_at - now))} ({clock(tombstone.expires_at)})",
        ]
        for tombstone in tombstones
    ]
    return grid(headers, rows, width)


def outcome_counts(outcomes: Sequence[str]) -> str:
    """``3 cancelled, 1 stopping``."""
    counts: dict[str, int] = {}
    for outcome in outcomes:
        counts[outcome] = counts.get(outcome, 0) + 1
    return ", ".join(f"{n} {outcome}" for outcome, n in counts.items()) or "none"


def run_details(
    run: RunInfo, events: Sequence[RunEvent], now: float, children: Sequence[RunInfo] = ()
) -> RenderableType:
    """The run's fields (its parent and children, a leak after its end, where it went longest
    without a checkpoint), its cancel phase by phase, its event timeline and its output."""
    fields = Table(show_header=False, box=None, pad_edge=False)
    fields.add_column(style="bold", no_wrap=True)
    fields.add_column(overflow="fold")
    for name, value in _fields(run, now):
        fields.add_row(name, value)
    for child in children:
        fields.add_row("child", f"{child.run_id} ({status_of(child)})")
    for name, value in _checks(run):
        fields.add_row(name, value)
    timeline = _table("timeline")
    for name in ("event", "at", "+ ms"):
        timeline.add_column(name, no_wrap=True)
    timeline.add_column("data", overflow="fold")
    start = events[0].at if events else 0.0
    for event in events:
        data = " ".join(f"{key}={json.dumps(value)}" for key, value in event.data.items())
        timeline.add_row(
            event.type, local_time(event.at)[11:], f"{(event.at - start) * 1000:.1f}", data
        )
    if run.is_active:
        note = f"\noutput: recorded when the run ends (live: cancel-bus follow {run.run_id})"
        return Group(fields, timeline, Text(note, style="bold"))
    size = f"{len(run.output)} chars" + (", truncated" if run.output_truncated else "")
    output = Text(f"\noutput ({size}):\n", style="bold")
    return Group(fields, timeline, output, Text(_shorten(run.output)))


def _fields(run: RunInfo, now: float) -> list[tuple[str, str]]:
    rows = [
        ("run", run.run_id),
        ("status", status_of(run)),
        ("owner", run.owner or "-"),
        *([("parent", run.parent)] if run.parent else []),
        ("session", session_of(run)),
        ("created", f"{local_time(run.created_at)} ({ago(run.created_at, now)})"),
    ]
    if run.finished_at:
        began = run.started_at or run.created_at
        ran = f"{local_time(run.finished_at)} (ran {span(run.finished_at - began)})"
        rows.append(("finished", ran))
    if run.phase:
        rows.append(("phase", run.phase))
    if run.interrupted:  # double texting: the run it interrupted to start
        rows.append(("replaced", run.interrupted))
    requested = run.cancel_requested_at
    if requested:
        mode = run.cancel_mode.value if run.cancel_mode else "?"
        cause = run.cancel_cause.value if run.cancel_cause else "user"
        asked = f"requested {local_time(requested)}, {mode} by {run.requested_by or '?'}"
        rows.append(("cancel", f"{asked} ({cause})"))
        if cause in REPLACED and run.requested_by:  # double texting: the run that replaced it
            rows.append(("replaced by", run.requested_by))
        if run.cancel_reason:
            rows.append(("reason", run.cancel_reason))
        phases = []
        for name, field in CANCEL_PHASES:
            at: float | None = getattr(run, field)
            phases.append(f"{name} +{span(at - requested)}" if at else f"{name} …")
        rows.append(("then", " → ".join(phases)))
    if run.error:
        rows.append(("error", run.error))
    if run.metadata:
        rows.append(("metadata", json.dumps(run.metadata)))
    return rows


def _checks(run: RunInfo) -> list[tuple[str, str]]:
    """What the run's code did after its end (a leak), and its slowest checkpoint sites."""
    rows = []
    if run.leaked_after_cancel:
        leak = Leak.model_validate(run.leaked_after_cancel)
        calls = ", ".join(f"{n} {call}" for call, n in leak.calls.items())
        first = f"; first: {leak.first_call} at {leak.first_site or '?'}"
        rows.append(("leaked", calls + (first if leak.first_call else "")))
    slowest = sorted((run.slowest_checkpoints or {}).items(), key=lambda kv: -kv[1])
    for site, ms in slowest[:SLOWEST_SHOWN]:
        rows.append(("no checkpoint", f"{span(ms / 1000)} after {site}"))
    return rows


class Leak(BaseModel):
    """A run's ``leaked_after_cancel``: what its code did through its handle after its end."""

    calls: dict[str, int] = {}
    first_call: str | None = None
    first_site: str | None = None


def _shorten(text: str, limit: int = 400) -> str:
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text) - limit} more chars)"
