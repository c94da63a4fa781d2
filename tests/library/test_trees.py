"""Cancel trees on a real server: a run started inside another run's code, or given a parent, on
any node, is cancelled with it — deepest first, one answer per run of the tree — and never
starts once its parent's cancel is accepted."""

from __future__ import annotations

import asyncio

import pytest

from cancel_bus import CancelBus, InvalidArgument, Outcome, RunCancelled, RunStatus, StopCause
from cancel_bus._scripts import MAX_DESCENDANTS

from ..conftest import BusFactory
from ..faultproxy import FaultProxy
from ..helpers import WAIT, GatedRun, LoopingRun, crash, eventually


async def test_a_tree_across_nodes_is_cancelled_deepest_first(make_bus: BusFactory) -> None:
    a, b, c, d = [await make_bus() for _ in range(4)]
    children: list[LoopingRun] = []

    async def root_code() -> None:
        async with a.run(app_name="app", user_id="u", session_id="s") as root:
            child = await LoopingRun(b).start()  # started in the root's task: its child
            children.append(child)
            grandchild = await LoopingRun(c, parent=child.run_id).start()  # given explicitly
            children.append(grandchild)
            while True:
                root.checkpoint()
                await asyncio.sleep(0.002)

    root_task = asyncio.create_task(root_code())
    await eventually(lambda: _holds(children, 2))
    child, grandchild = children
    root_id = (await d.get_run(child.run_id)).parent  # type: ignore[union-attr]
    assert root_id is not None
    assert (await d.get_run(grandchild.run_id)).parent == child.run_id  # type: ignore[union-attr]

    result = await d.cancel(root_id, reason="stop it all", timeout=WAIT)
    assert result.outcome is Outcome.CANCELLED
    assert [r.run.run_id for r in result.descendants if r.run] == [
        grandchild.run_id,
        child.run_id,
    ]  # deepest first
    assert [r.outcome for r in result.descendants] == [Outcome.CANCELLED] * 2
    for below in result.descendants:
        assert below.run is not None and below.run.status is RunStatus.CANCELLED
        assert below.run.cancel_cause is StopCause.PARENT
        assert below.run.cancel_reason == "stop it all"
    assert result.run is not None and result.run.cancel_cause is StopCause.USER
    await asyncio.wait_for(root_task, WAIT)
    for run in children:
        await run.done()


async def test_a_queued_or_late_child_never_starts(make_bus: BusFactory) -> None:
    a, b = await make_bus(), await make_bus()
    root = await LoopingRun(a).start()
    queued = await b.enqueue(parent=root.run_id)
    result = await b.cancel(root.run_id, timeout=WAIT)
    assert result.outcome is Outcome.CANCELLED
    assert [(r.outcome, r.run.run_id if r.run else None) for r in result.descendants] == [
        (Outcome.CANCELLED, queued.run_id)
    ]
    with pytest.raises(RunCancelled):
        async with b.run(queued.run_id):
            pass
    root_two = await GatedRun(a).start()
    await b.cancel(root_two.run_id, wait=False)  # accepted; the root is busy, not stopped yet
    with pytest.raises(RunCancelled) as caught:
        async with b.run(parent=root_two.run_id):
            pass
    assert caught.value.request is not None and caught.value.request.cause is StopCause.PARENT
    late = await b.list_runs(status=RunStatus.CANCELLED, limit=1)
    assert late[0].parent == root_two.run_id and late[0].started_at is None
    born = await b.enqueue(parent=root_two.run_id)
    assert born.status is RunStatus.CANCELLED
    root_two.release()
    await root_two.done()


async def test_the_root_answers_stopping_until_every_descendant_stopped(
    make_bus: BusFactory,
) -> None:
    a, b = await make_bus(), await make_bus()
    root = await LoopingRun(a).start()
    stubborn = await GatedRun(b, parent=root.run_id).start()  # no checkpoint while gated
    result = await a.cancel(root.run_id, timeout=0.5)
    assert result.outcome is Outcome.STOPPING  # the root stopped; its child has not
    assert result.run is not None and result.run.status is RunStatus.CANCELLED
    assert [r.outcome for r in result.descendants] == [Outcome.STOPPING]
    stubborn.release()
    await stubborn.done()
    final = await a.get_run(stubborn.run_id)
    assert final is not None and final.status is RunStatus.CANCELLED  # honoured when it could


async def test_a_child_on_a_dead_owner_is_resolved_owner_lost(
    make_bus: BusFactory, proxy: FaultProxy
) -> None:
    a = await make_bus(lease_ttl=1.2)
    doomed = await make_bus(url=proxy.url, lease_ttl=1.2)
    root = await LoopingRun(a).start()
    child = await LoopingRun(doomed, parent=root.run_id).start()
    await crash(doomed, proxy)  # its lease runs out; a live node resolves its runs
    result = await a.cancel(root.run_id, timeout=WAIT)
    assert [r.outcome for r in result.descendants] == [Outcome.OWNER_LOST]
    lost = result.descendants[0].run
    assert lost is not None and lost.status is RunStatus.CANCELLED  # a cancel was pending
    assert result.outcome is Outcome.CANCELLED  # every descendant stopped or reported lost
    assert child.task is not None
    child.task.cancel()


async def test_detached_runs_and_explicit_parents(make_bus: BusFactory) -> None:
    a = await make_bus()
    async with a.run() as outer:
        async with a.run(detached=True) as detached:
            assert (await a.get_run(detached.run_id)).parent is None  # type: ignore[union-attr]
        async with a.run() as inner:
            assert (await a.get_run(inner.run_id)).parent == outer.run_id  # type: ignore[union-attr]
    with pytest.raises(InvalidArgument):
        a.run(parent="p1", detached=True)
    with pytest.raises(InvalidArgument):
        a.run(parent="not an id")
    result = await a.cancel(outer.run_id, timeout=WAIT)  # a finished root: nothing below
    assert result.outcome is Outcome.ALREADY_FINISHED
    assert [r.outcome for r in result.descendants] == [Outcome.ALREADY_FINISHED]


async def _holds(runs: list[LoopingRun], count: int) -> bool:
    return len(runs) >= count


async def test_runs_nested_in_one_task_are_each_recorded_cancelled_by_an_immediate_cancel(
    make_bus: BusFactory,
) -> None:
    a, b = await make_bus(), await make_bus()
    ids: list[str] = []
    inner_open = asyncio.Event()

    async def nested() -> None:
        async with a.run() as outer:
            ids.append(outer.run_id)
            async with a.run() as inner:  # the same task: its child
                ids.append(inner.run_id)
                inner_open.set()
                await asyncio.sleep(3600)

    task = asyncio.create_task(nested())
    await asyncio.wait_for(inner_open.wait(), WAIT)
    result = await b.cancel(ids[0], mode="immediate", timeout=WAIT)
    assert result.outcome is Outcome.CANCELLED
    await asyncio.wait_for(task, WAIT)  # the outer scope swallowed the last of the two
    for run_id in ids:
        record = await b.get_run(run_id)
        assert record is not None and record.status is RunStatus.CANCELLED
        assert record.error is None and record.end_reason == "cancelled"


async def test_a_runs_children_are_read_from_any_node(make_bus: BusFactory) -> None:
    a, b, c = await make_bus(), await make_bus(), await make_bus()
    root = await LoopingRun(a).start()
    first = await LoopingRun(b, parent=root.run_id).start()
    second = await LoopingRun(a, parent=root.run_id).start()
    grandchild = await LoopingRun(b, parent=first.run_id).start()
    assert [run.run_id for run in await c.children(root.run_id)] == [first.run_id, second.run_id]
    assert [run.run_id for run in await c.children(first.run_id)] == [grandchild.run_id]
    assert await c.children(grandchild.run_id) == []
    assert (await c.cancel(root.run_id, timeout=WAIT)).outcome is Outcome.CANCELLED
    ended = await c.children(root.run_id)  # still readable once they ended
    assert [run.status for run in ended] == [RunStatus.CANCELLED] * 2
    for run in (root, first, second, grandchild):
        await run.done()


async def test_a_live_child_behind_many_ended_ones_is_still_cancelled(
    make_bus: BusFactory,
) -> None:
    a, b = await make_bus(), await make_bus()
    root = await LoopingRun(a).start()

    async def short_child() -> None:
        async with a.run(parent=root.run_id):
            pass

    for _ in range(3):  # more ended children than the cap on the runs a cancel lists
        await asyncio.gather(*(short_child() for _ in range(MAX_DESCENDANTS // 2)))
    live = await LoopingRun(b, parent=root.run_id).start()
    result = await b.cancel(root.run_id, timeout=WAIT)
    assert result.outcome is Outcome.CANCELLED and not result.truncated
    assert result.descendants[0].run is not None  # the active ones first
    assert result.descendants[0].run.run_id == live.run_id
    assert result.descendants[0].outcome is Outcome.CANCELLED
    assert len(result.descendants) == MAX_DESCENDANTS
    await live.done()
    await root.done()


async def test_a_tree_too_large_for_one_cancel_says_so(make_bus: BusFactory) -> None:
    a = await make_bus()
    root = await LoopingRun(a).start()
    gate, all_started = asyncio.Event(), asyncio.Event()
    ids: list[str] = []
    count = MAX_DESCENDANTS + 1

    async def idle_child() -> None:
        async with a.run(parent=root.run_id) as run:
            ids.append(run.run_id)
            if len(ids) == count:
                all_started.set()
            await gate.wait()

    children = [asyncio.create_task(idle_child()) for _ in range(count)]
    await asyncio.wait_for(all_started.wait(), 60)
    result = await a.cancel(root.run_id, mode="immediate", timeout=WAIT)
    assert result.truncated and len(result.descendants) == MAX_DESCENDANTS
    assert {r.outcome for r in result.descendants} == {Outcome.CANCELLED}
    listed = {r.run.run_id for r in result.descendants if r.run is not None}
    (left_out,) = set(ids) - listed
    record = await a.get_run(left_out)  # not cancelled: the answer said so
    assert record is not None and record.status is RunStatus.RUNNING
    gate.set()
    await asyncio.wait_for(asyncio.gather(*children, return_exceptions=True), WAIT)
    await root.done()


@pytest.mark.parametrize("signing_key", [None, "signing-key-" + "k" * 20])
async def test_a_descendants_unheard_cancel_is_counted(
    make_bus: BusFactory, proxy: FaultProxy, signing_key: str | None
) -> None:
    a = await make_bus(url=proxy.url, sweep_interval=3600, signing_key=signing_key)
    b, c = await make_bus(signing_key=signing_key), await make_bus(signing_key=signing_key)
    root = await LoopingRun(c).start()
    child = await LoopingRun(a, parent=root.run_id).start()
    proxy.refuse()  # the child's owner hears nothing; the root's owner listens
    await eventually(lambda: _deaf(a))
    result = await b.cancel(root.run_id, wait=False)
    assert result.outcome is Outcome.STOPPING
    assert b.stats.cancels_unheard == 1  # the child's cancel; the root's was heard
    await root.done()
    proxy.heal()
    await child.done()  # delivered by the resubscribe sweep


async def _deaf(bus: CancelBus) -> bool:
    return not bus.ready
