"""The fault catalogue: every kind of fault the suite injects, how long, on which topology.

Node faults strike one node (the checker may blame them for what happens to that node's runs);
Redis faults strike every node at once and may never cost a run its life while they last less
than a node rides out (0.85 of a lease): a stalled Redis is nobody's death. Redis's error replies
are faults too — real ones (out of memory, a busy script, a snapshot that cannot be written) and,
through a node's proxy, every reply code of the library's classification table, one per strike.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from cancel_bus._redis import REPLY_CODES

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


def _error_replies() -> FaultKind:
    """One node's proxy answers every command with an error reply: a code of the table, a
    different one at each strike (the order follows the run's seed)."""
    codes = sorted(REPLY_CODES)

    async def inject(cluster: Cluster, worker: Worker, seconds: float) -> None:
        code = random.Random(len(cluster.fault_log)).choice(codes)
        await cluster.answer_error(worker, seconds, f"{code} chaos says no")

    return FaultKind("error_replies", True, LEASE_TTL * 0.5, inject, ("proxied",))


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
    FaultKind("loop_blocked", True, LEASE_TTL * 0.5, Cluster.loop_blocked),
    _error_replies(),
    FaultKind(
        "all_partitioned",
        False,
        LEASE_TTL * 1.5,
        lambda c, _w, s: c.all_partitioned(s),
        ("proxied",),
    ),
    FaultKind("redis_oom", False, LEASE_TTL, lambda c, _w, s: c.redis_oom(s)),
    FaultKind("redis_busy_script", False, LEASE_TTL * 0.4, lambda c, _w, s: c.redis_busy(s)),
    FaultKind("redis_misconf", False, LEASE_TTL * 0.4, lambda c, _w, s: c.redis_misconf(s)),
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
