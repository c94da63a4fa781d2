"""The lease's own loop logic, on a real server (its scripts are tested in test_scripts)."""

from __future__ import annotations

import asyncio
import time
import uuid
from types import SimpleNamespace

import pytest
import redis.asyncio as aioredis

from cancel_bus import _lease
from cancel_bus._lease import Lease
from cancel_bus._protocol import Code
from cancel_bus._types import StopCause

from ..helpers import WAIT, calls_on

DEAD_RUNS = 1000


class Holder:
    def __init__(self) -> None:
        self.reaped = 0

    async def lease_renewed(self, recorded_runs: int) -> None: ...

    def lease_lost(self, cause: StopCause, why: str) -> None: ...

    async def lease_missing(self) -> None: ...

    def count_reaped(self, runs: int, nodes: int) -> None:
        self.reaped += runs


async def test_reaping_yields_to_the_next_heartbeat(
    raw_redis: aioredis.Redis, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a dead node with more runs than one beat can reap must not hold up the reaper's own
    # heartbeat until its lease runs out: each beat reaps for half a beat at most
    monkeypatch.setattr(_lease, "REAP_BUDGET", 1)  # a script per run
    store = calls_on(raw_redis, namespace)
    epoch = uuid.uuid4().hex[:16]
    code, _ = await store.register_node("dead", 60, 20, "test", epoch, restore=False)
    assert code is Code.OK
    for i in range(DEAD_RUNS):
        await store.start_run(f"r{i}", "dead", epoch, None, None, False)
    await raw_redis.zadd(store.keys.nodes, {"dead": time.time() - 1})  # its lease expired
    clock = _ScriptClock()  # each reaping script takes 10 ms, whatever the machine's speed
    monkeypatch.setattr(_lease, "time", SimpleNamespace(monotonic=clock, time=time.time))
    reap = store.reap

    async def timed_reap(budget: int) -> tuple[int, int, bool]:
        clock.now += 0.01
        return await reap(budget)

    monkeypatch.setattr(store, "reap", timed_reap)
    holder = Holder()
    lease = Lease(store, node_id="reaper", lease_ttl=1.0, self_fence_after=60, version="test")
    lease.holder = holder

    await asyncio.wait_for(lease.reap(), WAIT)
    assert holder.reaped == 6  # half of a 0.1 s beat, then the one script that crossed it
    async with asyncio.timeout(WAIT):
        while await raw_redis.zcard(store.keys.active):
            await lease.reap()
    assert holder.reaped == DEAD_RUNS


class _ScriptClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now
