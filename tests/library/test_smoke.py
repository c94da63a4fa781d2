from __future__ import annotations

import asyncio

from cancel_bus import Outcome, RunStatus

from ..conftest import BusFactory


async def test_cross_node_cancel(make_bus: BusFactory) -> None:
    a = await make_bus()
    b = await make_bus()
    started = asyncio.Event()

    async def work() -> None:
        async with a.run(app_name="app", user_id="u1", session_id="s1") as run:
            run_ids.append(run.run_id)
            started.set()
            while True:
                run.emit("x")
                run.checkpoint()
                await asyncio.sleep(0.001)

    run_ids: list[str] = []
    task = asyncio.create_task(work())
    await asyncio.wait_for(started.wait(), 5)
    result = await b.cancel(run_ids[0], reason="user", wait=True, timeout=5)
    assert result.outcome is Outcome.CANCELLED, result
    assert result.run is not None and result.run.status is RunStatus.CANCELLED
    assert result.run.output.startswith("x")
    await asyncio.wait_for(task, 5)
