"""checkpoint() is a local attribute test: no I/O, no allocation (behaviour 15)."""

from __future__ import annotations

import time
import tracemalloc

import pytest

from cancel_bus import RunCancelled

from ..conftest import BusFactory
from ..faultproxy import FaultProxy
from ..helpers import LoopingRun

CALLS = 1_000_000


async def test_checkpoint_does_no_io_and_allocates_nothing(
    make_bus: BusFactory, proxy: FaultProxy
) -> None:
    bus = await make_bus(url=proxy.url, lease_ttl=30)
    async with bus.run() as run:
        proxy.refuse()  # Redis is unreachable: any I/O would fail or stall
        checkpoint = run.checkpoint
        t0 = time.perf_counter()
        for _ in range(CALLS):
            checkpoint()
        elapsed = time.perf_counter() - t0
        assert elapsed < 5.0, f"{CALLS} checkpoints took {elapsed:.2f}s"

        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        for _ in range(100_000):
            checkpoint()
            run.turn_boundary()
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        run_module = tracemalloc.Filter(True, "*cancel_bus/_run.py")
        grown = [
            stat
            for stat in after.filter_traces([run_module]).compare_to(
                before.filter_traces([run_module]), "lineno"
            )
            if stat.size_diff > 0
        ]
        assert grown == []
        proxy.heal()


async def test_checkpoint_raises_once_a_cancel_is_delivered(make_bus: BusFactory) -> None:
    a = await make_bus()
    run = await LoopingRun(a).start()
    assert run.handle is not None
    run.handle.checkpoint()  # nothing pending: returns
    await a.cancel(run.run_id, wait=False)
    with pytest.raises(RunCancelled):
        run.handle.checkpoint()
    await run.done()
