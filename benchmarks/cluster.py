"""Issue 8: one Redis server (1 shard) against a local Redis Cluster of 3 primaries (3 shards, no
replicas, the slots split evenly), serving the same 3 namespaces, chosen so that each lands on
another primary of the cluster (``CLUSTER KEYSLOT`` of the namespace's hash tag).

Both topologies are up at once, each with 4 node processes (owner-1, owner-2, canceller-1,
canceller-2), every node serving the 3 namespaces with a bus each (as a node with
``app_namespaces`` does); the measurements alternate between the topologies, so both see the
same machine:

* cross-node cancel, observed and confirmed: canceller-1 cancels a run in a tight checkpoint
  loop on owner-1, the namespace rotating; each round takes a floor hop (on the single server)
  and one sample on each topology, in alternating order;
* run lifecycles/s: one node with 1 and with 32 in flight (the loops spread over the
  namespaces), then all 4 nodes at once with 32 in flight each, with the CPU time each Redis
  server spent meanwhile (``INFO cpu``);
* cancels/s with p99 ≤ 20 ms: as in ``throughput`` (2 owners, 2 cancellers), the runs spread
  over the namespaces; each rate step runs on both topologies, one after the other.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

from redis.asyncio import Redis

from cancel_bus._keys import KeySpace
from tests.topology import Cluster

from ._cluster import Bench, PairedFloor, cancel_sample, new_namespace, paired_rounds
from ._harness import Worker
from .throughput import NODE_NAMES, P99_BOUND_MS, Lifecycles, cancel_step, lifecycles, within_bound

LATENCY = "cluster: cross-node cancel, 1 shard vs 3 shards (3 namespaces)"
THROUGHPUT = "cluster: throughput, 1 shard vs 3 shards (3 namespaces)"
FLOOR = "hop:cluster"
SHARDS = 3
CANDIDATES = 1000  # namespaces tried to find one per primary (about 6 are needed on average)


@dataclass
class Topology:
    """One topology's node processes (owners first) and a client of each of its servers."""

    label: str
    nodes: list[Worker]
    servers: list[Redis]

    async def cpu_seconds(self) -> list[float]:
        """CPU time (user + system) each server has used so far."""
        infos = [await server.info("cpu") for server in self.servers]
        return [float(info["used_cpu_user"]) + float(info["used_cpu_sys"]) for info in infos]


async def run(bench: Bench) -> None:
    async with bench.stage("cluster: 1 shard vs 3 shards") as (scope, server):
        cluster = await scope.cluster(SHARDS)
        namespaces = await asyncio.to_thread(_one_per_primary, cluster)
        single = Topology(
            "1 shard",
            await scope.nodes(server, namespaces, [f"single-{n}" for n in NODE_NAMES]),
            [await scope.client(server)],
        )
        sharded = Topology(
            f"{SHARDS} shards",
            await scope.nodes(cluster, namespaces, [f"cluster-{n}" for n in NODE_NAMES]),
            [await scope.client(primary) for primary in cluster.primaries],
        )
        topologies = [single, sharded]
        floor = await PairedFloor(server, single.nodes[2], single.nodes[0]).start()
        await _latency(bench, floor, topologies, namespaces)
        await _lifecycles(bench, topologies)
        await _cancel_rates(bench, topologies)


def _one_per_primary(cluster: Cluster) -> list[str]:
    """New namespaces, each served by another primary of ``cluster``."""
    by_port: dict[int, str] = {}
    for _ in range(CANDIDATES):
        namespace = new_namespace()
        by_port.setdefault(cluster.owner(KeySpace(namespace).active).port, namespace)
        if len(by_port) == len(cluster.primaries):
            return list(by_port.values())
    raise RuntimeError(f"no namespace on every primary in {CANDIDATES} tries")


async def _latency(
    bench: Bench, floor: PairedFloor, topologies: list[Topology], namespaces: list[str]
) -> None:
    profile, report = bench.profile, bench.report

    async def take(i: int) -> dict[str, tuple[int, int]]:
        """One sample on each topology, in alternating order, the namespace rotating."""
        namespace = namespaces[i % len(namespaces)]
        order = topologies if i % 2 == 0 else topologies[::-1]
        return {
            t.label: await cancel_sample(t.nodes[0], t.nodes[2], namespace=namespace) for t in order
        }

    rounds = await paired_rounds(floor, profile.warmup, profile.n, take)
    report.set_floor(FLOOR, report.latency(LATENCY, "floor: pub/sub hop (paired)", rounds.hops))
    for what, by_label in (("observed", rounds.observed), ("confirmed", rounds.confirmed)):
        rows = [
            report.latency(
                LATENCY, f"{t.label}: cross-node cancel, {what}", by_label[t.label], floor=FLOOR
            )
            for t in topologies
        ]
        for q in ("p50", "p99"):
            assert rows[0].stats is not None and rows[1].stats is not None
            ratio = rows[1].stats[q] / rows[0].stats[q]
            name = f"{what} {q}: {topologies[1].label} ÷ {topologies[0].label}"
            report.figure(LATENCY, name, ratio, "x")


async def _lifecycles(bench: Bench, topologies: list[Topology]) -> None:
    seconds = bench.profile.lifecycle_seconds
    for topology in topologies:  # warm-up: connections, scripts loaded on every shard
        await asyncio.gather(*(lifecycles(node, 0.5, 8) for node in topology.nodes))
    for in_flight in (1, 32):
        name = f"run lifecycles/s, one node, {in_flight} in flight"
        rates = [(await lifecycles(t.nodes[0], seconds, in_flight)).rate for t in topologies]
        _versus(bench, name, topologies, rates, floor=f"ping_rate_{in_flight}")
    rates = []
    for topology in topologies:
        before = await topology.cpu_seconds()
        runs: list[Lifecycles] = await asyncio.gather(
            *(lifecycles(node, seconds, 32) for node in topology.nodes)
        )
        after = await topology.cpu_seconds()
        rates.append(sum(r.count for r in runs) / max(r.seconds for r in runs))
        busy = [(b - a) / max(r.seconds for r in runs) for a, b in zip(before, after, strict=True)]
        shares = ", ".join(f"{100 * x:.0f} %" for x in busy)
        name = f"{topology.label}: Redis CPU while 4 nodes run lifecycles, busiest server"
        bench.report.figure(THROUGHPUT, name, 100 * max(busy), "% of a core", note=f"({shares})")
    _versus(bench, "run lifecycles/s, 4 nodes at once, 32 in flight each", topologies, rates)


async def _cancel_rates(bench: Bench, topologies: list[Topology]) -> None:
    best = {t.label: 0.0 for t in topologies}
    going = list(topologies)
    for rate in bench.profile.cancel_rates:
        for topology in list(going):
            servers = {f"redis-{i + 1}": s for i, s in enumerate(topology.servers)}
            step = await cancel_step(bench, topology.nodes, rate, servers)
            name = f"{topology.label}: cancel confirmed at {rate:,}/s offered"
            row = bench.report.latency(THROUGHPUT, name, step.latency_ns)
            if within_bound(row, step):
                best[topology.label] = max(best[topology.label], step.offered)
            else:
                going.remove(topology)
    name = f"cancels/s with p99 ≤ {P99_BOUND_MS:.0f} ms (2 owners, 2 cancellers)"
    _versus(bench, name, topologies, list(best.values()), floor="ping_rate_32")


def _versus(
    bench: Bench,
    name: str,
    topologies: list[Topology],
    rates: list[float],
    floor: str | None = None,
) -> None:
    """A rate on each topology, then the last against the first."""
    for topology, rate in zip(topologies, rates, strict=True):
        bench.report.figure(THROUGHPUT, f"{name}: {topology.label}", rate, "/s", floor=floor)
    label = f"{name}: {topologies[-1].label} ÷ {topologies[0].label}"
    bench.report.figure(THROUGHPUT, label, rates[-1] / rates[0] if rates[0] else math.nan, "x")
