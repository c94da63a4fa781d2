"""(8) The hot path: ``checkpoint()`` on a live run (no cancel pending) against an empty method
call, in ns per call. Each sample is the best of 5 timings of a loop of calls (as ``timeit``),
minus the same loop without the call; the variants are taken interleaved, ``repeats`` times,
in one node process."""

from __future__ import annotations

from ._cluster import Bench, new_namespace

SECTION = "hot path (ns per call, loop overhead subtracted)"
BEST_OF = 5


async def run(bench: Bench) -> None:
    profile, report = bench.profile, bench.report
    async with bench.stage("hot path") as (scope, server):
        node = await scope.node(server, new_namespace(), "node-a")
        samples = await node.call(
            "hot_path",
            calls=profile.hot_calls,
            repeats=profile.hot_repeats,
            best_of=BEST_OF,
            within=600.0,
        )
    loop = samples.pop("loop")
    net = {
        name: [x - base for x, base in zip(xs, loop, strict=True)] for name, xs in samples.items()
    }
    empty = report.latency(SECTION, "empty method call", net["empty_method"], unit="ns")
    report.set_floor("empty_method", empty)
    for name in ("checkpoint", "turn_boundary"):
        row = report.latency(SECTION, f"{name}()", net[name], unit="ns", floor="empty_method")
        if name == "checkpoint":
            row.expect("p50 ≤ 2x an empty method call", row.ratios["p50"] <= 2.0)
    report.latency(SECTION, "the bare loop (subtracted above)", loop, unit="ns", floor=None)
