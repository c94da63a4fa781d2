"""(7) Scaling: the cross-node cancel (observed and confirmed) as the cluster grows.

* Nodes: N owner nodes (1, 2, 4, 8) sharing 100 idle active runs, plus the canceller node; the
  measured run (a tight checkpoint loop) is started on each owner in turn.
* Active runs: one owner holding 100 / 10k / 100k idle active runs (with a session key, no
  metadata), plus the canceller. At the largest count: Redis memory per active run and per
  finished (retained) run (data memory before / after starting them / after they ended), and
  the owner's RSS per active run.

Each configuration gets a fresh Redis server and fresh processes, and its own paired floor.
Flatness is judged on the observed p50 (as a ratio to its floor) against the 1-node / 100-run
configuration of the same series.
"""

from __future__ import annotations

from node.embedded import EmbeddedServer

from ._cluster import (
    Bench,
    PairedFloor,
    Scope,
    cancel_sample,
    new_namespace,
    paired_rounds,
    redis_memory,
)
from ._harness import Worker, rss_bytes
from ._report import Row

SECTION = "scaling (cross-node cancel)"
MEMORY = "memory (idle active runs with a session key, then the same runs finished)"
BASE_RUNS = 100
FLAT = 1.3
FILL_CONCURRENCY = 32


async def run(bench: Bench) -> None:
    profile = bench.profile
    by_nodes: dict[int, Row] = {}
    for count in profile.node_counts:
        async with bench.stage(f"scaling: {count} node(s)") as (scope, server):
            by_nodes[count] = await _nodes(bench, scope, server, count)
    by_runs: dict[int, Row] = {}
    for runs in profile.run_counts:
        async with bench.stage(f"scaling: {runs:,} active runs") as (scope, server):
            by_runs[runs] = await _runs(bench, scope, server, runs)
    _flatness(bench, by_nodes, "nodes")
    _flatness(bench, by_runs, "active runs")


async def _measure(
    bench: Bench, server: EmbeddedServer, label: str, owners: list[Worker], canceller: Worker
) -> Row:
    """Samples rotate over the owners; a floor hop (canceller -> first owner) precedes each."""
    profile, report = bench.profile, bench.report
    floor = await PairedFloor(server, canceller, owners[0]).start()

    async def take(i: int) -> dict[str, tuple[int, int]]:
        return {"cross": await cancel_sample(owners[i % len(owners)], canceller)}

    rounds = await paired_rounds(floor, profile.warmup, profile.scaling_n, take)
    key = f"hop:{label}"
    report.set_floor(key, report.latency(SECTION, f"{label}: floor hop (paired)", rounds.hops))
    row = report.latency(SECTION, f"{label}: observed", rounds.observed["cross"], floor=key)
    report.latency(SECTION, f"{label}: confirmed", rounds.confirmed["cross"], floor=key)
    return row


async def _fill(owner: Worker, count: int) -> None:
    if count > 0:
        await owner.call(
            "fill",
            count=count,
            concurrency=FILL_CONCURRENCY,
            return_ids=False,
            within=60 + count / 200,
        )


async def _nodes(bench: Bench, scope: Scope, server: EmbeddedServer, count: int) -> Row:
    names = [f"owner-{i + 1}" for i in range(count)]
    *owners, canceller = await scope.nodes(server, new_namespace(), [*names, "canceller"])
    for i, owner in enumerate(owners):
        share = BASE_RUNS // count + (1 if i < BASE_RUNS % count else 0)
        await _fill(owner, share)
    label = f"{count} node{'s' if count > 1 else ''}, {BASE_RUNS} active runs"
    return await _measure(bench, server, label, owners, canceller)


async def _runs(bench: Bench, scope: Scope, server: EmbeddedServer, runs: int) -> Row:
    redis = await scope.client(server)
    owner, canceller = await scope.nodes(server, new_namespace(), ["owner-1", "canceller"])
    memory_before, rss_before = await redis_memory(redis), rss_bytes(owner.pid)
    await _fill(owner, runs)
    memory_active, rss_active = await redis_memory(redis), rss_bytes(owner.pid)
    row = await _measure(bench, server, f"1 node, {runs:,} active runs", [owner], canceller)
    await owner.call("release_all", timeout=60 + runs / 200, within=90 + runs / 200)
    memory_finished = await redis_memory(redis)
    if runs == max(bench.profile.run_counts):  # fixed costs are noise below that
        _memory(bench, runs, memory_active - memory_before, memory_finished - memory_before)
        name = f"owner RSS per active run ({runs:,} active)"
        bench.report.figure(MEMORY, name, (rss_active - rss_before) / runs, "B")
    return row


def _memory(bench: Bench, runs: int, active: int, finished: int) -> None:
    report = bench.report
    per_active = active / runs
    row = report.figure(MEMORY, f"Redis memory per active run ({runs:,} active)", per_active, "B")
    row.expect("≤ 1 KB per active run", per_active <= 1024)
    name = f"Redis memory per finished run, retained ({runs:,})"
    report.figure(MEMORY, name, finished / runs, "B")


def _flatness(bench: Bench, rows: dict[int, Row], what: str) -> None:
    """The observed p50 of the largest configuration against the smallest, both as ratios to
    their paired floors (so that a slower machine at one moment does not count)."""
    base_key, last_key = min(rows), max(rows)
    if base_key == last_key:
        return
    base, last = rows[base_key], rows[last_key]
    assert base.stats is not None and last.stats is not None
    ratio = last.ratios["p50"] / base.ratios["p50"]
    absolute = last.stats["p50"] / base.stats["p50"]
    row = bench.report.figure(
        SECTION,
        f"observed p50 ÷ floor at {last_key:,} {what}, against {base_key:,}",
        ratio,
        "x",
        note=f"(absolute p50: {absolute:.2f}x)",
    )
    row.expect(f"≤ {FLAT}x", ratio <= FLAT)
