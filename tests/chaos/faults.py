"""The fault catalogue: every kind of fault the suite injects, how long, on which topology.

Node faults strike one node (the checker may blame them for what happens to that node's runs);
Redis faults strike every node at once and may never cost a run its life: a stalled Redis is
nobody's death (issue #12).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from .harness import LEASE_TTL, REDIS, SENTINEL_DOWN_AFTER_MS, TOPOLOGIES, Cluster, Topology, Worker

Inject = Callable[[Cluster, Worker, float], Awaitable[None]]

STALLS = ("redis_sigstop", "client_pause_all", "client_pause_write", "debug_sleep")
STALL_FACTORS = (0.3, 0.65, 1.5)  # x the lease
# On the sentinel topology a stall of the primary must stay well under SENTINEL_DOWN_AFTER_MS,
# or the sentinels fail it over: the failover is a fault of its own, injected cleanly.
SENTINEL_STALL_FACTORS = (0.3, 0.65)


@dataclass(frozen=True)
class FaultKind:
    name: str
    node_level: bool  # strikes the node it is given (else Redis as a whole)
    length: float  # seconds, as planned (0: a single blow)
    inject: Inject
    topologies: tuple[Topology, ...] = TOPOLOGIES


def _stall(how: str, factor: float) -> FaultKind:
    async def inject(cluster: Cluster, _: Worker, seconds: float) -> None:
        await cluster.redis_stall(how, seconds)

    on = TOPOLOGIES if factor in SENTINEL_STALL_FACTORS else ("proxied",)
    return FaultKind(f"{how}_{factor}x", False, factor * LEASE_TTL, inject, on)


CATALOGUE: tuple[FaultKind, ...] = (
    FaultKind("client_kill", True, 0.0, lambda c, w, _: c.client_kill(w)),
    FaultKind("proxy_reset", True, 0.0, lambda c, w, _: c.proxy_reset(w), ("proxied",)),
    FaultKind("latency_50ms", True, 3.0, Cluster.latency, ("proxied",)),
    FaultKind("partition", True, LEASE_TTL * 1.5, Cluster.partition, ("proxied",)),
    FaultKind("sigkill", True, 0.5, Cluster.sigkill),  # down for 0.5 s, then restarted
    FaultKind("sigstop", True, LEASE_TTL * 1.5, Cluster.sigstop),
    FaultKind(
        "redis_restart_data_loss", False, 0.0, lambda c, _w, _s: c.redis_restart(), ("proxied",)
    ),
    *(_stall(how, factor) for how in STALLS for factor in STALL_FACTORS),
    FaultKind(  # length: until the sentinels notice; the fault ends when the replica is back
        "sentinel_failover",
        False,
        SENTINEL_DOWN_AFTER_MS / 1000,
        lambda c, _w, _s: c.failover(),
        ("sentinel",),
    ),
)
DATA_LOSS = ("redis_restart_data_loss", "sentinel_failover")  # writes may be lost


def fault_kinds(topology: Topology) -> list[FaultKind]:
    return [kind for kind in CATALOGUE if topology in kind.topologies]


async def strike(cluster: Cluster, kind: FaultKind, worker: Worker) -> None:
    """Log the fault, inject it, and note when it was over."""
    fault = cluster.record(kind.name, worker.name if kind.node_level else REDIS, kind.length)
    await kind.inject(cluster, worker, kind.length)
    cluster.fault_over(fault)
