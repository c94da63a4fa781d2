"""Following a run's relayed output from another node."""

from __future__ import annotations

import asyncio

import pytest

from cancel_bus import RunEvent, RunNotFound

from ..conftest import BusFactory
from ..helpers import WAIT, LoopingRun, redis_of


async def test_follow_from_another_node_sees_output_then_the_end(make_bus: BusFactory) -> None:
    a, b = await make_bus(), await make_bus()
    started = asyncio.Event()
    proceed = asyncio.Event()
    ids: list[str] = []

    async def work() -> None:
        async with a.run(relay=True) as run:
            ids.append(run.run_id)
            run.emit("before")  # emitted before the follower joined: not replayed
            started.set()
            await proceed.wait()
            for i in range(3):
                run.emit(f"chunk{i}")
            run.emit_event("tool_call", {"name": "search"})
            run.phase = "tool:search"

    task = asyncio.create_task(work())
    await asyncio.wait_for(started.wait(), WAIT)
    await a._node.sync.flush(a._node.local.states())
    seen: list[RunEvent] = []

    async def follow() -> None:
        async for event in b.follow(ids[0], poll=0.2):
            seen.append(event)

    follower = asyncio.create_task(follow())
    await _until_following(b, ids[0])
    proceed.set()
    await asyncio.wait_for(task, WAIT)
    await asyncio.wait_for(follower, WAIT)
    texts = [e.data.get("text") for e in seen if e.type == "output"]
    assert texts == ["chunk0", "chunk1", "chunk2"]
    assert [e.type for e in seen][-2:] == ["tool_call", "run.finished"]
    assert seen[-1].data == {"status": "succeeded", "end_reason": "completed"}
    info = await b.get_run(ids[0])
    assert info is not None and info.phase == "tool:search"


async def test_follow_a_finished_run_yields_its_end(make_bus: BusFactory) -> None:
    a = await make_bus()
    async with a.run() as run:
        pass
    events = [e async for e in a.follow(run.run_id)]
    assert [e.type for e in events] == ["run.finished"]
    with pytest.raises(RunNotFound):
        async for _ in a.follow("missing-run"):
            pass


async def _until_following(bus: object, run_id: str) -> None:
    """Until a client blocks on the run's relay stream (XREAD BLOCK shows in CLIENT LIST)."""
    redis = redis_of(bus)  # type: ignore[attr-defined]
    async with asyncio.timeout(WAIT):
        while True:
            clients = await redis.client_list()
            if any(c.get("cmd") == "xread" for c in clients):
                return
            await asyncio.sleep(0.005)


async def test_follow_a_run_without_relay_ends_when_it_ends(make_bus: BusFactory) -> None:
    a, b = await make_bus(), await make_bus()
    run = await LoopingRun(a).start()  # relay off: nothing is relayed, the end still shows

    async def follow() -> list[RunEvent]:
        return [event async for event in b.follow(run.run_id, poll=0.1)]

    follower = asyncio.create_task(follow())
    await _until_following(b, run.run_id)
    run.finish.set()
    await run.done()
    events = await asyncio.wait_for(follower, WAIT)
    assert [e.type for e in events] == ["run.finished"]
    assert events[0].data["status"] == "succeeded"


async def test_follow_from_start_replays_a_finished_relayed_run(make_bus: BusFactory) -> None:
    a = await make_bus()
    async with a.run(relay=True) as run:
        run.emit("one")
        run.emit_event("tool_call", {"name": "x"})
    events = [e async for e in a.follow(run.run_id, from_start=True)]
    assert [e.type for e in events] == ["output", "tool_call", "run.finished"]
