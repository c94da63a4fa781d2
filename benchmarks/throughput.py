"""(6) Throughput (issue 16, targets 1 and 2).

* Run lifecycles per second per node process: ``async with bus.run(): pass`` (``start_run`` then
  ``finish_run``) in a loop, with 1 lifecycle in flight (every call waits for its reply) and
  with 32 in flight (the calls one event-loop turn makes leave as one batched script call).
  Divided by PINGs/s (redis-py, unpipelined: each PING waits for its reply) **from the same node
  process** with the same number in flight, measured in rounds that alternate with the
  lifecycle loops (PINGs, lifecycles, PINGs, ...), so both see the same process and moment.
  Target: lifecycles/s at 32 in flight ≥ 1.0x those PINGs/s. The CPU each process used
  meanwhile (the node, Redis, the whole machine) shows what bounds the rate.
* Cancels per second cluster-wide at a p99 bound: 2 owner nodes hold idle runs that stop as soon
  as a cancel reaches them; 2 other nodes send open-loop cancels at a fixed total rate, each
  waiting for its confirmation, latency counted from when the cancel was due. The rate steps up
  until p99 passes the bound (or a cancel is not confirmed). A step within the bound sustained
  its offered rate: every cancel was confirmed within 20 ms of when it was due. Target: ≥ 2,000/s.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from ._cluster import Bench, CpuMeter, new_namespace
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

    offered: float
    latency_ns: list[int]
    achieved: float
    outcomes: dict[str, int]
    cpu: str = ""

    @property
    def failed(self) -> int:
        return sum(k for outcome, k in self.outcomes.items() if outcome != "cancelled")

    @property
    def note(self) -> str:
        failed = f"; not confirmed: {self.failed}" if self.failed else ""
        cpu = f"; {self.cpu}" if self.cpu else ""
        return f"confirmed {self.achieved:,.0f}/s over the step{failed}{cpu}"


@dataclass(frozen=True)
class RateRound:
    """One round in one node process: PINGs for a while, then lifecycles for as long, each
    with the CPU the node process and Redis used meanwhile."""

    pings: int
    ping_cpu: CpuMeter
    lifecycles: Lifecycles
    lifecycle_cpu: CpuMeter
    script_calls: int  # EVALSHA commands Redis received during the lifecycles (batches)


async def run(bench: Bench) -> None:
    report = bench.report
    async with bench.stage("throughput: lifecycles") as (scope, server):
        node = await scope.node(server, new_namespace(), "node-a")
        redis = await scope.client(server)
        await lifecycles(node, 0.5, 8)  # warm-up
        for in_flight in IN_FLIGHT:
            rounds = [
                await _rate_round(bench, node, server.url, redis, in_flight)
                for _ in range(bench.profile.rate_rounds)
            ]
            _lifecycle_rows(bench, in_flight, rounds)
    async with bench.stage("throughput: cancels/s") as (scope, server):
        nodes = await scope.nodes(server, new_namespace(), NODE_NAMES)
        redis = await scope.client(server)
        best = 0.0
        for rate in bench.profile.cancel_rates:
            step = await cancel_step(bench, nodes, rate, {"redis": redis})
            name = f"cancel confirmed at {rate:,}/s offered"
            if not within_bound(report.latency(SECTION, name, step.latency_ns), step):
                break
            best = max(best, step.offered)
    name = f"cancels/s cluster-wide with p99 ≤ {P99_BOUND_MS:.0f} ms (2 owners, 2 cancellers)"
    row = report.figure(SECTION, name, best, "/s", floor="ping_rate_32")
    row.note = "(the highest offered rate whose every cancel was confirmed within the bound)"
    row.expect("≥ 2,000/s", best >= 2000)


async def _rate_round(
    bench: Bench, node: Worker, url: str, redis: Redis, in_flight: int
) -> RateRound:
    seconds = bench.profile.rate_seconds
    async with CpuMeter({"node": node.pid}, {"redis": redis}) as ping_cpu:
        rate: float = await node.call(
            "ping_throughput", url=url, concurrency=in_flight, seconds=seconds, within=seconds + 60
        )
    calls = await script_calls(redis)
    async with CpuMeter({"node": node.pid}, {"redis": redis}) as lifecycle_cpu:
        done = await lifecycles(node, seconds, in_flight)
    calls = await script_calls(redis) - calls
    return RateRound(round(rate * seconds), ping_cpu, done, lifecycle_cpu, calls)


async def script_calls(redis: Redis) -> int:
    """EVALSHA commands the server has run so far (``INFO commandstats``)."""
    return (await script_stats(redis))[0]


async def script_stats(redis: Redis) -> tuple[int, int]:
    """EVALSHA commands the server has run so far, and the microseconds they took."""
    stats: dict[str, Any] = await redis.info("commandstats")
    evalsha = stats.get("cmdstat_evalsha", {})
    return int(evalsha.get("calls", 0)), int(evalsha.get("usec", 0))


def _lifecycle_rows(bench: Bench, in_flight: int, rounds: list[RateRound]) -> None:
    """The rates of all rounds pooled (count ÷ seconds), the lifecycle rate ÷ the PING rate of
    the same process, the CPU each took per operation (what bounds it), and the latency."""
    report = bench.report
    each = bench.profile.rate_seconds
    ping = sum(r.pings for r in rounds) / (each * len(rounds))
    rate = sum(r.lifecycles.count for r in rounds) / sum(r.lifecycles.seconds for r in rounds)
    ratios = ", ".join(f"{r.lifecycles.rate / (r.pings / each):.2f}x" for r in rounds)
    floor = f"ping_rate_{in_flight}:node"
    name = f"PINGs/s from the node's process, {in_flight} in flight (paired floor)"
    ping_row = report.figure(SECTION, name, ping, "/s", note=f"({_cpu_note(rounds, 'ping')})")
    report.set_floor(floor, ping_row)
    if in_flight == 1:
        how = "1 in flight (each call waits for its reply)"
    else:
        how = f"{in_flight} in flight (batched)"
    row = report.figure(
        SECTION,
        f"run lifecycles/s, one node, {how}",
        rate,
        "/s",
        floor=floor,
        note=f"(rounds: {ratios}; {_cpu_note(rounds, 'lifecycle')})",
    )
    if in_flight == 32:
        row.expect("≥ 1.0x the same process's PINGs/s, 32 in flight", rate >= ping)
    count = sum(r.lifecycles.count for r in rounds)
    pings = sum(r.pings for r in rounds)
    for process in ("node", "redis"):
        per = 1e6 * sum(r.lifecycle_cpu.used[process] for r in rounds) / max(count, 1)
        per_ping = 1e6 * sum(r.ping_cpu.used[process] for r in rounds) / max(pings, 1)
        ceiling = f"at 100 % of a core: {1e6 / per:,.0f}/s; " if per else ""
        note = f"({ceiling}per PING meanwhile: {per_ping:.1f} us)"
        name = f"{process} CPU per lifecycle, {in_flight} in flight"
        report.figure(SECTION, name, per, "us", note=note)
    per_lifecycle = sum(r.script_calls for r in rounds) / max(count, 1)
    name = f"script calls (EVALSHA) per lifecycle, {in_flight} in flight"
    note = (
        f"(a lifecycle makes 2 calls: about {2 / per_lifecycle:.1f} calls per batch; "
        "heartbeats included)"
        if per_lifecycle
        else ""
    )
    report.figure(SECTION, name, per_lifecycle, "", note=note)
    latency = [x for r in rounds for x in r.lifecycles.latency_ns]
    report.latency(SECTION, f"one lifecycle, {in_flight} in flight", latency, floor="ping")


def _cpu_note(rounds: list[RateRound], what: str) -> str:
    """CPU use meanwhile (% of a core), pooled over the rounds: the node process, Redis, the
    whole machine (everybody's work)."""
    meters = [r.ping_cpu if what == "ping" else r.lifecycle_cpu for r in rounds]
    elapsed = sum(m.elapsed for m in meters)
    shares = {name: 100 * sum(m.used[name] for m in meters) / elapsed for name in meters[0].used}
    cores = os.cpu_count() or 1
    return (
        f"CPU % of a core: node {shares['node']:.0f}, redis {shares['redis']:.0f}; "
        f"machine {shares['machine']:.0f} of {100 * cores}"
    )


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


async def cancel_step(
    bench: Bench, nodes: list[Worker], rate: float, servers: dict[str, Redis] | None = None
) -> CancelStep:
    """Fill the owners (the first half of ``nodes``) with idle runs for one step, then the
    cancellers (the second half) cancel them all at ``rate`` per second. The CPU each node
    process and each of ``servers`` used meanwhile is noted."""
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
    names = {node.name: node.pid for node in nodes}
    async with CpuMeter(names, servers) as meter:
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
    return CancelStep(rate, latencies, achieved, dict(outcomes), meter.note())
