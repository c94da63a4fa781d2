"""The lease's own logic, with a stand-in for Redis (the scripts are tested in test_scripts)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from cancel_bus._lease import REAP_BUDGET, Lease
from cancel_bus._store import RunStore

from .helpers import WAIT


class EndlessReaping:
    """A store whose expired nodes never run out of runs to reap (say, one with 100,000)."""

    def __init__(self) -> None:
        self.calls = 0

    async def reap(self, budget: int, auth: str) -> tuple[int, int, bool]:
        self.calls += 1
        await asyncio.sleep(0.005)  # one script's round trip
        return budget, 0, True


class Holder:
    def __init__(self) -> None:
        self.reaped = 0

    async def lease_renewed(self, recorded_runs: int) -> None: ...

    async def lease_lost(self, why: str) -> None: ...

    async def lease_missing(self) -> None: ...

    def count_reaped(self, runs: int, nodes: int) -> None:
        self.reaped += runs


async def test_reaping_yields_to_the_next_heartbeat() -> None:
    # a dead node with more runs than one beat can reap must not hold up the reaper's own
    # heartbeat until its lease runs out: each beat reaps for half an interval at most
    store, holder = EndlessReaping(), Holder()
    lease = Lease(
        cast(RunStore, store),
        lease_ttl=0.3,
        version="test",
        auth=lambda: "",
        holder=cast(Any, holder),
    )
    await asyncio.wait_for(lease.reap(), WAIT)
    assert 1 <= store.calls <= lease.interval / 2 / 0.005 + 1
    assert holder.reaped == store.calls * REAP_BUDGET
