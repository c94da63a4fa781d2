"""(2)-(4) One cancel at a time, of a run in a tight checkpoint loop (``checkpoint()``, then
``await asyncio.sleep(0)``), so what is measured is the bus, not the agent:

* cross-node: ``bus.cancel(wait=True)`` on node B for a run on node A (two processes);
* same-node: the same call on node A itself (the local fast path: no pub/sub hop to the owner);
* cross-node, idle run: the run awaits an event its cancel callback sets (no busy loop, as a run
  awaiting a stream does), then checkpoints.

Observed: the owner's run sees the cancel at a checkpoint — when ``checkpoint()`` raised
(A's ``time.time_ns()``, taken where the run catches ``RunCancelled``) minus just before the
call (the caller's ``time.time_ns()``). Confirmed: the cancelling caller gets ``cancelled``
back — the call's duration (``perf_counter_ns``), checked to be ``cancelled`` and the run
recorded ``cancelled``. Each round takes one sample of each kind and one floor hop from B to A
(PUBLISH on B, A's waker task wakes), so all see the same machine; p50 is divided by the hop's
p50, p99 by its p99.

Targets: issue 16 (p50: observed ≤ 1.5x, confirmed ≤ 3x the paired floor) and issue 5 (p99:
observed ≤ 3x, confirmed ≤ 6x).
"""

from __future__ import annotations

from ._cluster import Bench, PairedFloor, cancel_sample, new_namespace, paired_rounds

SECTION = "cancel latency (library, node processes A and B, one cancel at a time)"
FLOOR = "hop:cancel"


async def run(bench: Bench) -> None:
    profile, report = bench.profile, bench.report
    async with bench.stage("cancel") as (scope, server):
        a, b = await scope.nodes(server, new_namespace(), ["node-a", "node-b"])
        floor = await PairedFloor(server, b, a).start()

        async def take(_: int) -> dict[str, tuple[int, int]]:
            return {
                "cross": await cancel_sample(a, b),
                "same": await cancel_sample(a, a),
                "idle": await cancel_sample(a, b, idle=True),
            }

        rounds = await paired_rounds(floor, profile.warmup, profile.n, take)
    hops, observed, confirmed = rounds.hops, rounds.observed, rounds.confirmed
    report.set_floor(FLOOR, report.latency(SECTION, "floor: pub/sub hop B -> A (paired)", hops))
    row = report.latency(SECTION, "cross-node cancel, observed", observed["cross"], floor=FLOOR)
    row.expect("p50 ≤ 1.5x floor (issue 16)", row.ratios["p50"] <= 1.5)
    row.expect("p99 ≤ 3.0x floor", row.ratios["p99"] <= 3.0)
    row = report.latency(SECTION, "cross-node cancel, confirmed", confirmed["cross"], floor=FLOOR)
    row.expect("p50 ≤ 3x floor (issue 16)", row.ratios["p50"] <= 3.0)
    row.expect("p99 ≤ 6x floor", row.ratios["p99"] <= 6.0)
    report.latency(SECTION, "same-node cancel, observed", observed["same"], floor=FLOOR)
    report.latency(SECTION, "same-node cancel, confirmed", confirmed["same"], floor=FLOOR)
    report.latency(SECTION, "cross-node, idle run: observed", observed["idle"], floor=FLOOR)
    report.latency(SECTION, "cross-node, idle run: confirmed", confirmed["idle"], floor=FLOOR)
