"""The upstream single-node defects of trpc-agent's cancel manager that the distributed one fixes
(two nodes: two buses, two loops, one real Redis server), and its install checks. Cancels across
OS processes, in every mode: test_trpc_replicas.py."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import gc
from collections.abc import AsyncIterator
from typing import Any

import pytest
from trpc_agent_sdk import cancel
from trpc_agent_sdk.cancel import SessionKey, _cancel
from trpc_agent_sdk.configs import RunConfig
from trpc_agent_sdk.types import Content, Part

from cancel_bus import InvalidArgument
from cancel_bus.integrations import trpc_agent

from ..helpers import WAIT, eventually
from .docs_examples import example
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

    thread.loop.call_soon_threadsafe(a.agent.gate("s3").set)
    await resolved(run)
    for event in remote:
        assert event is not None
        await asyncio.wait_for(event.wait(), WAIT)
    for event in local:
        assert event is not None
        assert event.is_set()  # set by A's cleanup, on A's loop, before the run returned


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

    # another request's run: not started inside the first run's code (that would be its child)
    newer = asyncio.create_task(newer_run(), context=contextvars.Context())
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


@pytest.mark.parametrize(
    ("setting", "says"),
    [
        ({"multitask_strategy": "queue"}, "invalid multitask_strategy 'queue'"),
        ({"interrupt_mode": "now"}, "invalid cancel mode 'now'"),
    ],
)
async def test_install_refuses_an_unknown_multitask_setting(
    node_b: TrpcNode, setting: dict[str, str], says: str
) -> None:
    before = _cancel._manager
    with pytest.raises(InvalidArgument, match=says):
        trpc_agent.install(node_b.bus, **setting)  # type: ignore[arg-type]
    assert _cancel._manager is before  # nothing installed


async def test_a_run_whose_stream_is_abandoned_ends(node_b: TrpcNode) -> None:
    """A consumer that breaks out of ``run_async`` leaves the stream to the garbage collector,
    which closes it in a task of its own: the run's end must still be recorded."""

    async def consume() -> None:
        message = Content(role="user", parts=[Part.from_text(text="stream")])
        async for _ in node_b.runner.run_async(
            user_id="u1", session_id="s6", new_message=message, run_config=RunConfig(streaming=True)
        ):
            break  # the stream is left to the garbage collector

    await asyncio.create_task(consume())
    gc.collect()
    runs = await node_b.bus.list_runs(status="all", app_name=APP, user_id="u1")
    [record] = [run for run in runs if run.session_id == "s6"]

    async def ended() -> bool:
        run = await node_b.bus.get_run(record.run_id)
        return run is not None and not run.is_active

    await eventually(ended, timeout=2.0)  # a task of the asyncgen finalizer closes the stream


async def test_the_docs_sub_agent_example_runs(redis_url: str, capsys: Any) -> None:
    await example("trpc-sub-agent")(redis_url)
    printed = capsys.readouterr().out.splitlines()
    assert "cancelled cancelled parent" in printed and "AgentCancelledEvent" in printed
