"""The cancel path between nodes on a real Redis server (foundation behaviours 1-6, 10, 11)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from cancel_bus import (
    CancelBus,
    CancelMode,
    Outcome,
    RunCancelled,
    RunExists,
    RunHandle,
    RunStatus,
    SessionBusy,
)

from ..conftest import BusFactory
from ..helpers import WAIT, GatedRun, LoopingRun, eventually, keys_of, redis_of


async def test_cancel_from_another_node_stops_run_at_checkpoint(make_bus: BusFactory) -> None:
    a, b = await make_bus(), await make_bus()
    run = await LoopingRun(a, app_name="app", user_id="u1", session_id="s1").start()

    result = await b.cancel(run.run_id, reason="user clicked stop", requested_by="u1", timeout=WAIT)

    assert result.outcome is Outcome.CANCELLED
    info = result.run
    assert info is not None
    assert info.status is RunStatus.CANCELLED and info.end_reason == "cancelled"
    assert info.owner == a.node_id
    assert info.cancel_reason == "user clicked stop" and info.requested_by == "u1"
    assert info.output.startswith("c0 ")
    assert info.cancel_requested_at is not None and info.cancel_delivered_at is not None
    assert info.cancel_observed_at is not None and info.finished_at is not None
    assert (
        info.cancel_requested_at
        <= info.cancel_delivered_at
        <= info.cancel_observed_at
        <= info.finished_at
    )
    await run.done()
    assert run.handle is not None and run.handle.final_status is RunStatus.CANCELLED
    events = await b.events(run.run_id)
    assert [e.type for e in events] == [
        "run.started",
        "run.cancel_requested",
        "run.cancel_delivered",
        "run.cancel_observed",
        "run.finished",
    ]
    # one time per phase: each event is at the moment the record names
    final = await b.get_run(run.run_id)
    assert final is not None
    recorded = [
        final.started_at,
        final.cancel_requested_at,
        final.cancel_delivered_at,
        final.cancel_observed_at,
        final.finished_at,
    ]
    assert [e.at for e in events] == pytest.approx(recorded, abs=1e-6)


async def test_cancel_on_the_owner_node_uses_the_local_path(make_bus: BusFactory) -> None:
    a = await make_bus()
    run = await LoopingRun(a).start()
    result = await a.cancel(run.run_id, timeout=WAIT)
    assert result.outcome is Outcome.CANCELLED
    assert a.stats.cancels_delivered == 1 and a.stats.messages_rejected == 0
    await run.done()


async def test_cancel_without_wait_answers_stopping_then_run_stops(make_bus: BusFactory) -> None:
    a, b = await make_bus(), await make_bus()
    run = await LoopingRun(a).start()
    result = await b.cancel(run.run_id, wait=False)
    assert result.outcome is Outcome.STOPPING
    assert result.run is not None and result.run.stopping
    await run.done()
    final = await b.get_run(run.run_id)
    assert final is not None and final.status is RunStatus.CANCELLED


async def test_cancel_unknown_run_is_not_found(make_bus: BusFactory) -> None:
    b = await make_bus()
    result = await b.cancel("no-such-run", timeout=1)
    assert result.outcome is Outcome.NOT_FOUND and result.run is None


async def test_cancel_finished_run_reports_final_state_and_never_overwrites(
    make_bus: BusFactory,
) -> None:
    a, b = await make_bus(), await make_bus()
    async with a.run() as run:
        run.emit("done")
    result = await b.cancel(run.run_id, timeout=1)
    assert result.outcome is Outcome.ALREADY_FINISHED
    assert result.run is not None and result.run.status is RunStatus.SUCCEEDED
    again = await b.get_run(run.run_id)
    assert again is not None and again.status is RunStatus.SUCCEEDED
    assert again.cancel_requested_at is None and again.output == "done"


async def test_cancel_queued_run_needs_no_owner_and_claim_then_raises(
    make_bus: BusFactory,
) -> None:
    a, b = await make_bus(), await make_bus()
    queued = await a.enqueue(app_name="app", user_id="u1", session_id="s1")
    assert queued.status is RunStatus.QUEUED and queued.owner is None

    result = await b.cancel(queued.run_id, reason="changed my mind", timeout=1)
    assert result.outcome is Outcome.CANCELLED
    assert result.run is not None and result.run.status is RunStatus.CANCELLED
    assert result.run.owner is None

    with pytest.raises(RunCancelled) as caught:
        async with a.run(queued.run_id):
            pytest.fail("a cancelled queued run must not start")
    assert caught.value.request is not None
    assert caught.value.request.reason == "changed my mind"


async def test_queued_run_is_claimed_by_any_node(make_bus: BusFactory) -> None:
    a, b = await make_bus(), await make_bus()
    queued = await a.enqueue()
    async with b.run(queued.run_id) as run:
        run.emit("hi")
        info = await a.get_run(run.run_id)
        assert info is not None and info.status is RunStatus.RUNNING and info.owner == b.node_id
    final = await a.get_run(queued.run_id)
    assert final is not None and final.status is RunStatus.SUCCEEDED


async def test_repeated_cancels_are_idempotent_and_every_waiter_is_answered(
    make_bus: BusFactory,
) -> None:
    a, b, c = await make_bus(), await make_bus(), await make_bus()
    run = await GatedRun(a, then=RunHandle.checkpoint).start()
    first = asyncio.create_task(b.cancel(run.run_id, reason="first", requested_by="b"))
    await eventually(lambda: _stopping(b, run.run_id))
    second = asyncio.create_task(c.cancel(run.run_id, reason="second", requested_by="c"))
    third = asyncio.create_task(b.cancel(run.run_id, reason="third"))
    await eventually(lambda: _waiting_nodes(b, run.run_id, 2))
    run.release()
    results = await asyncio.gather(first, second, third)

    assert [r.outcome for r in results] == [Outcome.CANCELLED] * 3
    for result in results:
        assert result.run is not None
        assert result.run.cancel_reason == "first" and result.run.requested_by == "b"
    events = [e.type for e in await b.events(run.run_id)]
    assert events.count("run.cancel_requested") == 1
    await run.done()


async def test_success_after_accepted_cancel_is_recorded_cancelled(make_bus: BusFactory) -> None:
    a, b = await make_bus(), await make_bus()
    run = await GatedRun(a, before="partial").start()  # no checkpoint: the body completes
    pending = await b.cancel(run.run_id, wait=False)
    assert pending.outcome is Outcome.STOPPING
    run.release()
    await run.done()
    final = await b.get_run(run.run_id)
    assert final is not None
    assert final.status is RunStatus.CANCELLED and final.end_reason == "completed"
    assert final.output == "partial"


@pytest.mark.parametrize("cancel_first", [True, False])
async def test_cancel_finish_race_has_exactly_one_terminal_state(
    make_bus: BusFactory, cancel_first: bool
) -> None:
    a, b = await make_bus(), await make_bus()
    for _ in range(20):
        run = await GatedRun(a).start()
        if cancel_first:
            cancel = asyncio.create_task(b.cancel(run.run_id, timeout=WAIT))
            run.release()
        else:
            run.release()
            cancel = asyncio.create_task(b.cancel(run.run_id, timeout=WAIT))
        result = await cancel
        await run.done()
        final = await b.get_run(run.run_id)
        assert final is not None and not final.is_active
        events = [e.type for e in await b.events(run.run_id)]
        assert events.count("run.finished") == 1
        if result.outcome is Outcome.CANCELLED:
            assert final.status is RunStatus.CANCELLED
        else:
            assert result.outcome is Outcome.ALREADY_FINISHED
            assert final.status is RunStatus.SUCCEEDED and final.cancel_requested_at is None


async def test_wait_times_out_with_stopping_and_cancel_is_honoured_later(
    make_bus: BusFactory,
) -> None:
    a, b = await make_bus(), await make_bus()
    observed: list[RunCancelled] = []

    def checkpoint(run: RunHandle) -> None:
        try:
            run.checkpoint()
        except RunCancelled as exc:
            observed.append(exc)
            raise

    run = await GatedRun(a, then=checkpoint).start()  # a long step with no checkpoint
    result = await b.cancel(run.run_id, timeout=0.3)
    assert result.outcome is Outcome.STOPPING
    assert result.run is not None and result.run.stopping
    info = await b.get_run(run.run_id)
    assert info is not None and info.status is RunStatus.RUNNING and info.cancel_requested_at

    run.release()
    await run.done()
    assert len(observed) == 1
    final = await b.get_run(run.run_id)
    assert final is not None and final.status is RunStatus.CANCELLED


async def test_immediate_interrupts_a_blocked_await(make_bus: BusFactory) -> None:
    a, b = await make_bus(), await make_bus()
    started = asyncio.Event()
    ids: list[str] = []
    reached_end = False

    async def work() -> None:
        nonlocal reached_end
        async with a.run() as run:
            ids.append(run.run_id)
            run.emit("before the tool")
            started.set()
            await asyncio.sleep(3600)  # a tool call that never returns by itself
            reached_end = True

    task = asyncio.create_task(work())
    await asyncio.wait_for(started.wait(), WAIT)
    result = await b.cancel(ids[0], mode="immediate", timeout=WAIT)
    assert result.outcome is Outcome.CANCELLED
    assert result.run is not None and result.run.output == "before the tool"
    assert result.run.cancel_mode is CancelMode.IMMEDIATE
    await asyncio.wait_for(task, WAIT)  # the task ends normally: our CancelledError was absorbed
    assert not reached_end
    assert not task.cancelled()


async def test_foreign_cancelled_error_is_never_swallowed(make_bus: BusFactory) -> None:
    a, b = await make_bus(), await make_bus()
    started = asyncio.Event()
    ids: list[str] = []

    async def work() -> None:
        async with a.run() as run:
            ids.append(run.run_id)
            started.set()
            await asyncio.sleep(3600)

    task = asyncio.create_task(work())
    await asyncio.wait_for(started.wait(), WAIT)
    task.cancel()  # somebody else's cancellation (e.g. the server shutting down)
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, WAIT)
    final = await b.get_run(ids[0])
    assert final is not None and final.status is RunStatus.FAILED
    assert final.error is not None and "cancelled" in final.error


async def test_foreign_cancel_during_our_immediate_cancel_still_propagates(
    make_bus: BusFactory,
) -> None:
    a = await make_bus()
    started = asyncio.Event()
    ids: list[str] = []

    async def work() -> None:
        async with a.run() as run:
            ids.append(run.run_id)
            started.set()
            await asyncio.sleep(3600)

    task = asyncio.create_task(work())
    await asyncio.wait_for(started.wait(), WAIT)
    handle = a.local_runs()[0]
    pending = await a.cancel(ids[0], mode="immediate", wait=False)  # ours: task.cancel() issued
    assert pending.outcome is Outcome.STOPPING
    assert handle.cancel_requested is not None
    task.cancel()  # and a foreign one before the task runs again
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, WAIT)
    final = await a.get_run(ids[0])
    assert final is not None and final.status is RunStatus.CANCELLED


async def test_after_turn_lets_the_turn_finish(make_bus: BusFactory) -> None:
    a, b = await make_bus(), await make_bus()
    cancel_sent = asyncio.Event()
    started = asyncio.Event()
    ids: list[str] = []
    turns_completed = 0

    async def work() -> None:
        nonlocal turns_completed
        async with a.run() as run:
            ids.append(run.run_id)
            delivered = asyncio.Event()
            run.add_cancel_callback(lambda _: delivered.set())
            for turn in range(3):
                for chunk in range(5):
                    run.emit(f"t{turn}c{chunk} ")
                    run.checkpoint()  # after_turn does not stop here
                    if turn == 0 and chunk == 1:
                        started.set()
                        await cancel_sent.wait()
                        await asyncio.wait_for(delivered.wait(), WAIT)
                turns_completed += 1
                run.turn_boundary()

    task = asyncio.create_task(work())
    await asyncio.wait_for(started.wait(), WAIT)
    cancel = asyncio.create_task(b.cancel(ids[0], mode=CancelMode.AFTER_TURN, timeout=WAIT))
    await eventually(lambda: _stopping(b, ids[0]))
    cancel_sent.set()
    result = await cancel
    await asyncio.wait_for(task, WAIT)
    assert result.outcome is Outcome.CANCELLED
    assert turns_completed == 1
    assert result.run is not None and result.run.output.endswith("t0c4 ")


async def test_stronger_mode_escalates_a_pending_after_turn(make_bus: BusFactory) -> None:
    a, b = await make_bus(), await make_bus()
    run = await LoopingRun(a).start()
    soft = await b.cancel(run.run_id, mode="after_turn", wait=False)
    assert soft.outcome is Outcome.STOPPING  # the loop never reaches a turn boundary
    hard = await b.cancel(run.run_id, mode="checkpoint", timeout=WAIT)
    assert hard.outcome is Outcome.CANCELLED
    assert hard.run is not None and hard.run.cancel_mode is CancelMode.CHECKPOINT
    events = [e.type for e in await b.events(run.run_id)]
    assert events.count("run.cancel_requested") == 1 and "run.cancel_escalated" in events
    await run.done()


async def test_one_active_run_per_session_and_session_cancel_from_any_node(
    make_bus: BusFactory,
) -> None:
    a, b = await make_bus(), await make_bus()
    run = await LoopingRun(a, app_name="app", user_id="u1", session_id="s1").start()
    with pytest.raises(SessionBusy) as caught:
        async with b.run(app_name="app", user_id="u1", session_id="s1"):
            pass
    assert caught.value.active_run_id == run.run_id

    result = await b.cancel_session("app", "u1", "s1", reason="new message", timeout=WAIT)
    assert result.outcome is Outcome.CANCELLED
    assert result.run is not None and result.run.run_id == run.run_id
    await run.done()

    assert (await b.cancel_session("app", "u1", "s1", timeout=1)).outcome is Outcome.NOT_FOUND
    async with b.run(app_name="app", user_id="u1", session_id="s1") as second:
        assert second.run_id != run.run_id  # the session is free again


async def test_run_ids_are_never_reused(make_bus: BusFactory) -> None:
    a, b = await make_bus(), await make_bus()
    async with a.run("job-1"):
        pass
    with pytest.raises(RunExists):
        async with b.run("job-1"):
            pytest.fail("a finished id must not start again")
    running = await LoopingRun(a, run_id="job-2").start()
    with pytest.raises(RunExists):
        async with b.run("job-2"):
            pass
    running.finish.set()
    await running.done()
    final = await b.get_run("job-1")
    assert final is not None and final.status is RunStatus.SUCCEEDED


async def test_failed_run_is_recorded_and_reraised(make_bus: BusFactory) -> None:
    a = await make_bus()
    with pytest.raises(ZeroDivisionError):
        async with a.run() as run:
            run.emit("so far")
            _ = 1 / 0
    final = await a.get_run(run.run_id)
    assert final is not None and final.status is RunStatus.FAILED
    assert final.error == "ZeroDivisionError: division by zero" and final.output == "so far"


async def test_waiting_run_is_cancelled_directly_and_resume_raises(make_bus: BusFactory) -> None:
    a, b = await make_bus(), await make_bus()
    async with a.run() as run:
        await run.pause()
        info = await b.get_run(run.run_id)
        assert info is not None and info.status is RunStatus.WAITING
        result = await b.cancel(run.run_id, reason="user left", timeout=WAIT)
        assert result.outcome is Outcome.CANCELLED  # nothing was executing
        with pytest.raises(RunCancelled):
            await run.resume()
    final = await b.get_run(run.run_id)
    assert final is not None and final.status is RunStatus.CANCELLED
    assert final.cancel_reason == "user left"


async def test_list_runs_and_nodes_cluster_wide(make_bus: BusFactory) -> None:
    a, b = await make_bus(), await make_bus()
    run_a = await LoopingRun(a, app_name="app", user_id="u1", session_id="s1").start()
    run_b = await LoopingRun(b, app_name="app", user_id="u2", session_id="s1").start()
    async with a.run():
        pass
    active = await b.list_runs()
    assert {r.run_id for r in active} == {run_a.run_id, run_b.run_id}
    assert [r.run_id for r in await b.list_runs(node_id=a.node_id)] == [run_a.run_id]
    assert [r.run_id for r in await a.list_runs(user_id="u2")] == [run_b.run_id]
    assert len(await a.list_runs(status="succeeded")) == 1
    assert len(await a.list_runs(status="all")) == 3
    assert len(await a.list_runs(status="all", limit=2)) == 2
    nodes = {n.node_id: n for n in await a.list_nodes()}
    assert set(nodes) == {a.node_id, b.node_id}
    assert nodes[a.node_id].active_runs == 1 and not nodes[a.node_id].expired
    for run in (run_a, run_b):
        run.finish.set()
        await run.done()


async def test_wait_for_a_run_from_another_node(make_bus: BusFactory) -> None:
    a, b = await make_bus(), await make_bus()
    run = await LoopingRun(a).start()
    waiter = asyncio.create_task(b.wait(run.run_id, timeout=WAIT))
    await eventually(lambda: _waiting_nodes(b, run.run_id, 1))
    run.finish.set()
    final = await waiter
    assert final is not None and final.status is RunStatus.SUCCEEDED
    assert await b.wait("unknown-run", timeout=1) is None


async def _stopping(bus: CancelBus, run_id: str) -> bool:
    info = await bus.get_run(run_id)
    return info is not None and info.stopping


async def _waiting_nodes(bus: CancelBus, run_id: str, count: int) -> bool:
    """``count`` nodes are recorded as waiting for the run."""
    return int(await redis_of(bus).scard(keys_of(bus).waiters(run_id))) >= count  # type: ignore[misc]


async def test_cancel_callbacks_fire_on_delivery_and_escalation(make_bus: BusFactory) -> None:
    a, b = await make_bus(), await make_bus()
    run = await LoopingRun(a).start()
    assert run.handle is not None
    seen: list[CancelMode] = []
    delivered = asyncio.Event()

    def callback(request: object) -> None:
        seen.append(request.mode)  # type: ignore[attr-defined]
        delivered.set()

    def broken(request: object) -> None:
        raise RuntimeError("an adapter bug must not stop the delivery")

    run.handle.add_cancel_callback(broken)
    run.handle.add_cancel_callback(callback)
    await b.cancel(run.run_id, mode="after_turn", wait=False)
    await asyncio.wait_for(delivered.wait(), WAIT)
    await b.cancel(run.run_id, mode="immediate", timeout=WAIT)
    late: list[CancelMode] = []
    run.handle.add_cancel_callback(lambda request: late.append(request.mode))
    assert seen == [CancelMode.AFTER_TURN, CancelMode.IMMEDIATE]
    assert late == [CancelMode.IMMEDIATE]  # registered after the fact: called at once
    await run.done()


async def test_an_immediate_cancel_that_beats_the_registration_still_interrupts(
    make_bus: BusFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = await make_bus(), await make_bus()
    register = a._node.calls.start_run

    async def cancelled_in_between(run_id: str, *args: Any, **kwargs: Any) -> Any:
        """The run is recorded, then the cancel's message reaches the owner before the
        registration's answer does."""
        answer = await register(run_id, *args, **kwargs)
        await b.cancel(run_id, mode="immediate", wait=False)
        await eventually(lambda: _remembered(a, run_id))
        return answer

    monkeypatch.setattr(a._node.calls, "start_run", cancelled_in_between)

    async def work() -> None:
        async with a.run("early-bird"):
            await asyncio.sleep(3600)  # interrupted by the cancel that came first

    await asyncio.wait_for(work(), WAIT)
    final = await b.get_run("early-bird")
    assert final is not None and final.status is RunStatus.CANCELLED
    assert final.end_reason == "cancelled" and final.cancel_mode is CancelMode.IMMEDIATE


async def _remembered(bus: CancelBus, run_id: str) -> bool:
    return run_id in bus._node.local._early


async def test_list_runs_of_every_status_most_recent_first(make_bus: BusFactory) -> None:
    a, b = await make_bus(), await make_bus()
    older = await LoopingRun(a).start()  # active, created first
    async with a.run() as ended:  # created and finished after it
        pass
    newest = await LoopingRun(a).start()
    runs = await b.list_runs(status="all", limit=3)
    assert [r.run_id for r in runs] == [newest.run_id, ended.run_id, older.run_id]
    assert [r.run_id for r in await b.list_runs(status="all", limit=1)] == [newest.run_id]
    newest.finish.set()
    await newest.done()
    assert [r.run_id for r in await b.list_runs(status="all", limit=2)] == [
        newest.run_id,  # its end is now the most recent change
        ended.run_id,
    ]
    by_node = await b.list_runs(node_id=a.node_id)
    assert [r.run_id for r in by_node] == [older.run_id]
    older.finish.set()
    await older.done()
