"""(6) Throughput.

* Run lifecycles per second per node process: ``async with bus.run(): pass`` (``start_run`` then
  ``finish_run``, two scripts) in a loop, with 1 lifecycle in flight (no pipelining: every call
  waits for its reply) and with 32 in flight (calls overlap on pooled connections; redis-py does
  not pipeline them and the library has no batch API). Divided by PINGs/s from one process with
  the same number in flight.
* Cancels per second cluster-wide at a p99 bound: 2 owner nodes hold idle runs that stop as soon
  as a cancel reaches them; 2 other nodes send open-loop cancels at a fixed total rate, each
  waiting for its confirmation, latency counted from when the cancel was due. The rate steps up
  until p99 passes the bound.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass
from typing import Any

from ._cluster import Bench, new_namespace
from ._harness import Worker
from ._report import Row

SECTION = "throughput"
IN_FLIGHT = (1, 32)
P99_BOUND_MS = 20.0
FILL_CONCURRENCY = 32
CANCEL_TIMEOUT = 10.0
NODE_NAMES = ["owner-1", "owner-2", "canceller-1", "canceller-2"]  # owners first


@dataclass(frozen=True)
class Lifecycles:
    """What one node's lifecycle loop did."""

    count: int
    seconds: float
    latency_ns: list[int]

    @property
    def rate(self) -> float:
        return self.count / self.seconds


@dataclass(frozen=True)
class CancelStep:
    """One step of the cancel load: every cancel's latency, the rate achieved, what failed."""

    latency_ns: list[int]
    achieved: float
    outcomes: dict[str, int]

    @property
    def failed(self) -> int:
        return sum(k for outcome, k in self.outcomes.items() if outcome != "cancelled")

    @property
    def note(self) -> str:
        failed = f"; not confirmed: {self.failed}" if self.failed else ""
        return f"achieved {self.achieved:,.0f}/s{failed}"


async def run(bench: Bench) -> None:
    report, seconds = bench.report, bench.profile.lifecycle_seconds
    async with bench.stage("throughput: lifecycles") as (scope, server):
        node = await scope.node(server, new_namespace(), "node-a")
        await lifecycles(node, 0.5, 8)  # warm-up
        for in_flight in IN_FLIGHT:
            result = await lifecycles(node, seconds, in_flight)
            how = "no pipelining" if in_flight == 1 else "concurrent"
            name = f"run lifecycles/s, one node, {in_flight} in flight ({how})"
            row = report.figure(SECTION, name, result.rate, "/s", floor=f"ping_rate_{in_flight}")
            row.expect("≥ 2,000/s per node process", result.rate >= 2000)
            name = f"one lifecycle, {in_flight} in flight"
            report.latency(SECTION, name, result.latency_ns, floor="ping")
    async with bench.stage("throughput: cancels/s") as (scope, server):
        nodes = await scope.nodes(server, new_namespace(), NODE_NAMES)
        best = 0.0
        for rate in bench.profile.cancel_rates:
            step = await cancel_step(bench, nodes, rate)
            name = f"cancel confirmed at {rate:,}/s offered"
            if not within_bound(report.latency(SECTION, name, step.latency_ns), step):
                break
            best = max(best, step.achieved)
    name = f"cancels/s cluster-wide with p99 ≤ {P99_BOUND_MS:.0f} ms (2 owners, 2 cancellers)"
    row = report.figure(SECTION, name, best, "/s", floor="ping_rate_32")
    row.expect("≥ 2,000/s", best >= 2000)


async def lifecycles(node: Worker, seconds: float, in_flight: int) -> Lifecycles:
    """``in_flight`` lifecycle loops on ``node`` for ``seconds``."""
    result: dict[str, Any] = await node.call(
        "lifecycles", seconds=seconds, concurrency=in_flight, within=seconds + 60
    )
    return Lifecycles(result["count"], result["seconds"], result["latency_ns"])


def within_bound(row: Row, step: CancelStep) -> bool:
    """Note the step on its row; whether its p99 kept the bound with every cancel confirmed."""
    row.note = step.note
    return row.stats is not None and row.stats["p99"] <= P99_BOUND_MS and not step.failed


async def cancel_step(bench: Bench, nodes: list[Worker], rate: float) -> CancelStep:
    """Fill the owners (the first half of ``nodes``) with idle runs for one step, then the
    cancellers (the second half) cancel them all at ``rate`` per second."""
    half = len(nodes) // 2
    owners, cancellers = nodes[:half], nodes[half:]
    per_owner = int(rate * bench.profile.cancel_step_seconds) // len(owners)
    filled = await asyncio.gather(
        *(
            owner.call(
                "fill",
                count=per_owner,
                concurrency=FILL_CONCURRENCY,
                return_ids=True,
                within=60 + per_owner / 100,
            )
            for owner in owners
        )
    )
    runs = [run for group in zip(*(f["runs"] for f in filled), strict=True) for run in group]
    shares = [runs[i :: len(cancellers)] for i in range(len(cancellers))]
    results = await asyncio.gather(
        *(
            canceller.call(
                "cancel_load",
                runs=share,
                rate=rate / len(cancellers),
                timeout=CANCEL_TIMEOUT,
                within=len(share) / rate * len(cancellers) + CANCEL_TIMEOUT + 30,
            )
            for canceller, share in zip(cancellers, shares, strict=True)
        )
    )
    latencies = [x for result in results for x in result["latency_ns"]]
    outcomes: Counter[str] = Counter()
    for result in results:
        outcomes.update(result["outcomes"])
    achieved = len(latencies) / max(result["seconds"] for result in results)
    return CancelStep(latencies, achieved, dict(outcomes))
