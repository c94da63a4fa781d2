"""trpc-agent's own cancel API across two nodes (two buses, two loops) on a real Redis server,
and the upstream single-node defects the distributed manager fixes."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import AsyncIterator

import pytest
from trpc_agent_sdk import cancel
from trpc_agent_sdk.cancel import SessionKey, _cancel
from trpc_agent_sdk.cancel._session_utils import _CANCELING_SUFFIX
from trpc_agent_sdk.events import AgentCancelledEvent

from cancel_bus import RunStatus
from cancel_bus.integrations import trpc_agent

from ..helpers import WAIT
from .trpc_support import APP, LoopThread, TrpcNode, resolved


@pytest.fixture
async def node_a(redis_url: str, namespace: str) -> AsyncIterator[tuple[TrpcNode, LoopThread]]:
    """The replica that runs the agent, on its own loop."""
    thread = LoopThread()
    node = await thread.call(TrpcNode.start(redis_url, namespace))
    yield node, thread
    await thread.call(node.stop())
    await thread.close()


@pytest.fixture
async def node_b(redis_url: str, namespace: str) -> AsyncIterator[TrpcNode]:
    """The replica that receives the cancel, on the test's loop."""
    node = await TrpcNode.start(redis_url, namespace)
    yield node
    await node.stop()


async def test_cancel_from_another_node_stops_the_run_at_its_checkpoint(
    node_a: tuple[TrpcNode, LoopThread], node_b: TrpcNode
) -> None:
    a, thread = node_a
    started: concurrent.futures.Future[None] = concurrent.futures.Future()
    run = thread.submit(a.run("u1", "s1", "stream", started))
    await resolved(started)

    assert await node_b.runner.cancel_run_async("u1", "s1", timeout=WAIT) is True

    events = await resolved(run)  # already over: cancel_run_async waited for A's cleanup
    assert isinstance(events[-1], AgentCancelledEvent)
    streamed = "".join(e.content.parts[0].text for e in events if e.partial)
    assert streamed.startswith("t0 t1 t2 ")
    saved = await thread.call(a.last_session_text("u1", "s1"))
    assert saved == f"{streamed}\n\n{_CANCELING_SUFFIX}"
    [record] = await node_b.bus.list_runs(status="all", app_name=APP, user_id="u1")
    assert (record.status, record.end_reason, record.owner) == (
        RunStatus.CANCELLED,
        "cancelled",
        a.bus.node_id,
    )
    assert record.cancel_observed_at is not None


async def test_unknown_session_and_finished_run_answer_false(
    node_a: tuple[TrpcNode, LoopThread], node_b: TrpcNode
) -> None:
    a, thread = node_a
    assert await node_b.runner.cancel_run_async("u1", "nobody") is False

    started: concurrent.futures.Future[None] = concurrent.futures.Future()
    events = await thread.call(a.run("u1", "s2", "short", started))
    assert events[-1].content.parts[0].text == "done"
    assert await node_b.runner.cancel_run_async("u1", "s2") is False
    assert await cancel.cancel_run(APP, "u1", "s2") is None


async def test_every_cancel_run_caller_is_told_when_the_run_ends(
    node_a: tuple[TrpcNode, LoopThread], node_b: TrpcNode
) -> None:
    """Upstream, a second cancel_run replaces the first caller's Event, which is never set. The
    run's own cancel Event (get_cancel_event) is set by a cancel from another node."""
    a, thread = node_a
    started: concurrent.futures.Future[None] = concurrent.futures.Future()
    run = thread.submit(a.run("u1", "s3", "hold", started))
    await resolved(started)

    delivered = await thread.call(cancel.get_cancel_event(SessionKey(APP, "u1", "s3")))
    assert delivered is not None and not delivered.is_set()

    remote = [await cancel.cancel_run(APP, "u1", "s3") for _ in range(2)]
    await thread.call(asyncio.wait_for(delivered.wait(), WAIT))  # the agent's Event, on A
    local = [await thread.call(cancel.cancel_run(APP, "u1", "s3")) for _ in range(2)]
    assert all(event is not None and not event.is_set() for event in remote + local)

    thread.loop.call_soon_threadsafe(a.agent.release.set)
    await resolved(run)
    for event in remote:
        assert event is not None
        await asyncio.wait_for(event.wait(), WAIT)
    for event in local:
        assert event is not None
        assert event.is_set()  # set by A's cleanup, on A's loop, before the run returned


async def test_a_run_without_checkpoints_is_shown_stopping_not_cancelled(
    node_a: tuple[TrpcNode, LoopThread], node_b: TrpcNode
) -> None:
    """Upstream reports success and forgets; the bus shows the truth all along."""
    a, thread = node_a
    started: concurrent.futures.Future[None] = concurrent.futures.Future()
    run = thread.submit(a.run("u1", "s4", "hold", started))
    await resolved(started)

    assert await node_b.runner.cancel_run_async("u1", "s4", timeout=0.2) is True
    [record] = await node_b.bus.list_runs(app_name=APP, user_id="u1")
    assert (record.status, record.stopping) == (RunStatus.RUNNING, True)

    thread.loop.call_soon_threadsafe(a.agent.release.set)
    events = await resolved(run)
    assert not any(isinstance(e, AgentCancelledEvent) for e in events)
    final = await node_b.bus.wait(record.run_id, timeout=WAIT)
    assert final is not None
    assert (final.status, final.end_reason, final.stopping) == (
        RunStatus.CANCELLED,
        "completed",
        False,
    )


async def test_a_finished_runs_cleanup_leaves_the_newer_run_of_its_key_alone(
    node_b: TrpcNode,
) -> None:
    """Upstream, the older run's late cleanup_run deletes the newer run's entry, which then
    cannot be cancelled. Here a new run of a key waits for the key's stopping run to end, and a
    cleanup from a finished run does nothing."""
    key = await cancel.register_run(APP, "u1", "s5")
    first = await cancel.cancel_run(APP, "u1", "s5")
    registered = asyncio.Event()
    go = asyncio.Event()

    async def newer_run() -> bool:
        newer_key = await cancel.register_run(APP, "u1", "s5")
        registered.set()
        await asyncio.wait_for(go.wait(), WAIT)
        cancelled: bool = await cancel.is_run_cancelled(newer_key)
        await cancel.cleanup_run(APP, "u1", "s5")
        return cancelled

    newer = asyncio.create_task(newer_run())
    assert await cancel.is_run_cancelled(key)
    await cancel.cleanup_run(APP, "u1", "s5")
    assert first is not None
    await asyncio.wait_for(first.wait(), WAIT)
    await asyncio.wait_for(registered.wait(), WAIT)

    await cancel.cleanup_run(APP, "u1", "s5")  # the finished run's cleanup, once more
    assert _cancel._manager.get_active_sessions() == {(APP, "u1", "s5"): False}
    second = await cancel.cancel_run(APP, "u1", "s5")
    assert second is not None
    go.set()
    assert await asyncio.wait_for(newer, WAIT) is True
    await asyncio.wait_for(second.wait(), WAIT)


async def test_install_checks_the_trpc_internals(
    node_b: TrpcNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = _cancel._manager
    assert isinstance(manager, trpc_agent.BusCancellationManager)
    monkeypatch.delattr(type(manager.fallback), "cleanup_run")
    with pytest.raises(RuntimeError, match=r"changed trpc_agent_sdk\.cancel\._cancel"):
        trpc_agent.install(node_b.bus)
