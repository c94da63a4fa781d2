"""``--profile``: py-spy profiles of the paths issue 16 is about, each recorded while its workload
alone runs, in stages of their own after the timed benchmarks (py-spy slows what it samples:
nothing here is a timed figure to publish):

* lifecycle loop, 32 and 1 in flight: one library node process looping ``async with bus.run():
  pass``;
* cross-node cancel: the owner (idle runs, each woken by its cancel callback, then raising at
  its checkpoint: no busy loop to hide the path) and the canceller (``bus.cancel(wait=True)``
  one after another), both recorded at once;
* HTTP cancel: node services A (runs the agent, ``token_interval_ms=0``) and B (serves the
  cancels), while a client starts an agent run on A and cancels it on B, one after another.

Each recording is kept as collapsed stacks (``<name>.pyspy-collapsed.txt``: flamegraph.pl or
speedscope.app read them) with a summary (``<name>.summary.txt``: self time by package and by
function, time within each package) in ``<results>/<time>-profiles/``. The table gives each
process's CPU use while recorded (``/proc``, % of one core: near 100 %, that process — its one
thread holding the GIL — is the bound) and its self time by package. py-spy samples Python
frames only: time in C (a socket's ``send``, uvloop's loop) shows as the Python frame that
called it.
"""

from __future__ import annotations

import shutil
from typing import Any

from ._cluster import CANCEL_TIMEOUT, Bench, new_namespace
from ._pyspy import Recording

SECTION = "profile (py-spy, on-CPU samples; not timed figures)"
AGENT = {"tokens": 100_000, "token_interval_ms": 0, "turns": 1}
CANCELS_PER_SECOND = 800  # idle runs filled per second of recording (more than get cancelled)
WARMUP_CANCELS = 20


async def run(bench: Bench) -> None:
    if bench.py_spy is None:
        raise RuntimeError("the profile benchmark needs --profile (py-spy)")
    seconds = bench.profile.profile_seconds
    async with bench.stage("profile: lifecycles") as (scope, server):
        node = await scope.node(server, new_namespace(), "lifecycle-node")
        await node.call("lifecycles", seconds=0.5, concurrency=8)  # warm-up
        for in_flight in (32, 1):
            async with _recording(bench, f"lifecycles-{in_flight}", node.pid) as recording:
                done = await node.call(
                    "lifecycles", seconds=seconds, concurrency=in_flight, within=seconds + 60
                )
            note = f"{done['count'] / done['seconds']:,.0f} lifecycles/s while profiled"
            _rows(bench, f"lifecycle loop, {in_flight} in flight", [recording], note)
    async with bench.stage("profile: cross-node cancel") as (scope, server):
        owner, canceller = await scope.nodes(server, new_namespace(), ["owner", "canceller"])
        count = int(CANCELS_PER_SECOND * seconds)
        filled = await owner.call(
            "fill", count=count, concurrency=32, return_ids=True, within=60 + count / 100
        )
        runs: list[list[str]] = filled["runs"]
        warm = runs[:WARMUP_CANCELS]
        await canceller.call("cancel_each", runs=warm, timeout=CANCEL_TIMEOUT, seconds=seconds)
        async with (
            _recording(bench, "cancel-owner", owner.pid) as on_owner,
            _recording(bench, "cancel-canceller", canceller.pid) as on_canceller,
        ):
            done = await canceller.call(
                "cancel_each",
                runs=runs[WARMUP_CANCELS:],
                timeout=CANCEL_TIMEOUT,
                seconds=seconds,
                within=seconds + 60,
            )
        cancelled = done["outcomes"].get("cancelled", 0)
        note = f"{cancelled / done['seconds']:,.0f} cancels/s one at a time while profiled"
        _rows(bench, "cross-node cancel", [on_owner, on_canceller], note)
    async with bench.stage("profile: HTTP cancel") as (scope, server):
        namespace = new_namespace()
        service_a = await scope.service(server, namespace, "service-a")
        service_b = await scope.service(server, namespace, "service-b")
        client = await scope.worker("http-client")
        cycle: dict[str, Any] = {"start_url": service_a.url, "cancel_url": service_b.url}
        await client.call("http_cycle", **cycle, agent=AGENT, seconds=1.0)  # warm-up
        assert service_a.process is not None and service_b.process is not None
        async with (
            _recording(bench, "http-service-a", service_a.process.pid) as on_a,
            _recording(bench, "http-service-b", service_b.process.pid) as on_b,
        ):
            done = await client.call(
                "http_cycle", **cycle, agent=AGENT, seconds=seconds, within=seconds + 60
            )
        note = f"{done['count'] / seconds:,.0f} start + cancel cycles/s while profiled"
        _rows(bench, "HTTP start + cancel", [on_a, on_b], note)


def _recording(bench: Bench, name: str, pid: int) -> Recording:
    assert bench.py_spy is not None
    return Recording(bench.py_spy, name, pid, bench.log_dir)


def _rows(bench: Bench, label: str, recordings: list[Recording], workload: str) -> None:
    """A row per recorded process; its files copied to the run's profile folder."""
    folder = bench.artifacts
    for recording in recordings:
        summary = recording.summary()
        title = f"{label}: {recording.name} ({workload})"
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
            shutil.copy(recording.out, folder / recording.out.name)
            (folder / f"{recording.name}.summary.txt").write_text(summary.text(title))
        note = (
            f"({workload}; {summary.samples:,} samples, active {100 * summary.active:.0f} % of "
            f"the time; self: {summary.shares(summary.own, 6)}; "
            f"top functions: {summary.shares(summary.functions, 4)})"
        )
        name = f"{label}: {recording.name}, CPU"
        bench.report.figure(SECTION, name, recording.cpu_share, "% of a core", note=note)
