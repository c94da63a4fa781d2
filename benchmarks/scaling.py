"""(7) Scaling: the cross-node cancel (observed and confirmed) as the cluster grows.

* Nodes: N owner nodes (1, 2, 4, 8) sharing 100 idle active runs, plus the canceller node; the
  measured run (a tight checkpoint loop) is started on each owner in turn.
* Active runs: one owner holding 100 / 10k / 100k idle active runs (with a session key, no
  metadata), plus the canceller. At the largest count: Redis memory per active run and per
  finished (retained) run (data memory before / after starting them / after they ended), and
  the owner's RSS per active run.
* The burst (issue 16, target 5): at the largest count, after the measurement, every idle run
  of the owner is released in the same event-loop turn, so all of them end at once (a burst of
  finishes through the batcher). Target: the owner keeps its lease (its ``leases_lost`` counter
  does not move) and every run is recorded as it ended, ``succeeded`` (none ``owner_lost``, read
  back from Redis). Also noted: ``finishes_deferred`` (finishes that waited in the outbox), the
  owner's worst event-loop lag, the script calls Redis ran meanwhile (``INFO commandstats``: how
  many, how long in all) and the longest command (``SLOWLOG`` of those over 1 ms, by client and
  script): batches are bounded.

Each configuration gets a fresh Redis server and fresh processes, and its own paired floor.
Flatness is judged on the observed p50 (as a ratio to its floor) against the 1-node / 100-run
configuration of the same series.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from redis.asyncio import Redis

from cancel_bus._keys import KeySpace
from node.embedded import EmbeddedServer

from ._cluster import (
    Bench,
    PairedFloor,
    Scope,
    cancel_sample,
    new_namespace,
    paired_rounds,
    redis_memory,
    script_name,
)
from ._harness import Worker, rss_bytes
from ._report import Row
from .throughput import script_stats

SECTION = "scaling (cross-node cancel)"
MEMORY = "memory (idle active runs with a session key, then the same runs finished)"
BURST = "burst: one owner's idle runs all end at once"
SLOWLOG_MAX = 100_000  # entries kept while the burst is logged
SLOW_US = 1000  # the commands logged during the burst: those of 1 ms or more
READ_CHUNK = 2_000  # run records read back per pipeline
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


async def _fill(owner: Worker, count: int, return_ids: bool = False) -> list[list[str]]:
    """Start ``count`` idle runs on ``owner``: their ``[namespace, run id]`` if ``return_ids``."""
    if count == 0:
        return []
    filled: dict[str, Any] = await owner.call(
        "fill",
        count=count,
        concurrency=FILL_CONCURRENCY,
        return_ids=return_ids,
        within=60 + count / 200,
    )
    runs: list[list[str]] = filled["runs"]
    return runs


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
    namespace = new_namespace()
    owner, canceller = await scope.nodes(server, namespace, ["owner-1", "canceller"])
    largest = runs == max(bench.profile.run_counts)  # fixed costs are noise below that
    memory_before, rss_before = await redis_memory(redis), rss_bytes(owner.pid)
    run_ids = [run_id for _, run_id in await _fill(owner, runs, return_ids=largest)]
    memory_active, rss_active = await redis_memory(redis), rss_bytes(owner.pid)
    row = await _measure(bench, server, f"1 node, {runs:,} active runs", [owner], canceller)
    if largest:
        await _burst(bench, redis, KeySpace(namespace), owner, canceller, run_ids)
    else:
        await owner.call("release_all", timeout=60 + runs / 200, within=90 + runs / 200)
    memory_finished = await redis_memory(redis)
    if largest:
        _memory(bench, runs, memory_active - memory_before, memory_finished - memory_before)
        name = f"owner RSS per active run ({runs:,} active)"
        bench.report.figure(MEMORY, name, (rss_active - rss_before) / runs, "B")
    return row


async def _burst(
    bench: Bench,
    redis: Redis,
    keys: KeySpace,
    owner: Worker,
    canceller: Worker,
    run_ids: list[str],
) -> None:
    """Release every idle run of ``owner`` at once; check its lease and the records."""
    runs = len(run_ids)
    canceller_before: dict[str, int] = await canceller.call("stats")
    await redis.config_set("slowlog-max-len", SLOWLOG_MAX)
    await redis.config_set("slowlog-log-slower-than", SLOW_US)
    await redis.slowlog_reset()
    scripts = await script_stats(redis)
    try:
        burst: dict[str, Any] = await owner.call(
            "release_all", timeout=60 + runs / 200, within=90 + runs / 200
        )
        settled = await _settled(redis, keys, timeout=30.0)
        calls_after, busy_after = await script_stats(redis)
        calls, busy = calls_after - scripts[0], busy_after - scripts[1]
        log: list[dict[str, Any]] = await redis.slowlog_get(-1)
    finally:
        await redis.config_set("slowlog-log-slower-than", 10_000)
        await redis.slowlog_reset()
    canceller_after: dict[str, int] = await canceller.call("stats")
    records = await _records(redis, keys, run_ids)
    before, after = burst["stats_before"], burst["stats"]
    moved = {key: after[key] - before[key] for key in after if after[key] != before[key]}
    lost = moved.get("leases_lost", 0)
    deferred = moved.get("finishes_deferred", 0)
    succeeded = records.get("succeeded/completed", 0)
    owner_lost = sum(k for kind, k in records.items() if kind.endswith("/owner_lost"))
    report = bench.report
    recorded = ", ".join(f"{kind} {k:,}" for kind, k in sorted(records.items()))
    others = {k: v for k, v in moved.items() if k not in ("leases_lost", "finishes_deferred")}
    row = report.figure(
        BURST,
        f"{runs:,} runs ending at once: recorded succeeded",
        succeeded,
        "runs",
        note=(
            f"(records: {recorded}; owner leases_lost {lost}, finishes_deferred {deferred}"
            f"{', other counters ' + str(others) if others else ''}; canceller leases_lost "
            f"{canceller_after['leases_lost'] - canceller_before['leases_lost']}; "
            f"{'all' if settled else 'NOT all'} runs left the active index)"
        ),
    )
    row.expect("the owner kept its lease (leases_lost 0)", lost == 0)
    row.expect(f"all {runs:,} recorded succeeded, none owner_lost", succeeded == runs)
    name = f"{runs:,} runs ending at once: seconds until every run's scope exited"
    report.figure(BURST, name, burst["seconds"], "s")
    report.figure(BURST, "owner finishes deferred (waited in the outbox)", deferred, "")
    name = "owner event loop's worst lag meanwhile (a 5 ms timer, how late it woke)"
    note = "(the lease: 10 s, renewed every 3.3 s, the bus's defaults; on this event loop)"
    report.figure(BURST, name, 1000 * burst["max_lag_s"], "ms", note=note)
    name = "script calls (EVALSHA) Redis ran meanwhile, every client (INFO commandstats)"
    note = (
        f"({runs / max(calls, 1):,.0f} runs per call; Redis busy with them {busy / 1e6:.2f} s, "
        f"{busy / max(calls, 1) / 1000:.2f} ms per call on average)"
    )
    report.figure(BURST, name, calls, "", note=note)
    _slowlog_rows(bench, log, owner_lost)


def _slowlog_rows(bench: Bench, log: list[dict[str, Any]], owner_lost: int) -> None:
    """The commands that took Redis ``SLOW_US`` or more during the burst (``SLOWLOG``; a command
    a script runs is logged on its own too, from no client: left out, its script has its time)."""
    report = bench.report
    calls = [
        (
            _text(entry.get("client_name")).removeprefix("cancel-bus.") or "-",
            _command(_text(entry.get("command"))),
            int(entry["duration"]),  # microseconds
        )
        for entry in log
        if _text(entry.get("client_address")) != "?:0"
    ]
    longest = max(calls, key=lambda call: call[2], default=("", "", 0))
    by_kind = Counter(f"{client} {command}" for client, command, _ in calls)
    kinds = ", ".join(f"{kind} x{k}" for kind, k in by_kind.most_common(8)) or "none"
    note = f"({longest[0]}: {longest[1]}; took {SLOW_US / 1000:g} ms or more: {kinds})"
    name = "the longest command Redis ran meanwhile (SLOWLOG, any client)"
    report.figure(BURST, name, longest[2] / 1000, "ms", note=note)
    if owner_lost:
        report.figure(BURST, "runs recorded owner_lost", owner_lost, "runs")


def _command(text: str) -> str:
    """A logged command's name, a script call as its script's name."""
    words = text.split(" ", 2)
    if words[0].upper() == "EVALSHA" and len(words) > 1:
        return script_name(words[1])
    return words[0].upper()


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value or "")


async def _settled(redis: Redis, keys: KeySpace, timeout: float) -> bool:
    """Wait until no run is active in the namespace (a deferred finish lands late)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while await redis.zcard(keys.active) > 0:
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.1)
    return True


async def _records(redis: Redis, keys: KeySpace, run_ids: list[str]) -> Counter[str]:
    """How the runs are recorded: ``status/end_reason`` -> count."""
    counts: Counter[str] = Counter()
    for first in range(0, len(run_ids), READ_CHUNK):
        pipe = redis.pipeline(transaction=False)
        for run_id in run_ids[first : first + READ_CHUNK]:
            pipe.hmget(keys.run(run_id), ["status", "end_reason"])
        for status, reason in await pipe.execute():
            counts[f"{status or 'missing'}/{reason or '-'}"] += 1
    return counts


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
