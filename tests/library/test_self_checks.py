"""A cancel path that proves itself, on real servers: leaks after a run's end are recorded,
a node whose own channel goes silent turns unready within a probe interval, and the
responsiveness profile names the code site that keeps a run from stopping promptly."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
import redis.asyncio as aioredis

from cancel_bus import CancelBus, CancelMode, Outcome, RunCancelled, RunEnded, RunHandle
from cancel_bus._notices import Notices
from cancel_bus._reads import Reads
from node.embedded import EmbeddedServer

from ..conftest import BusFactory
from ..helpers import WAIT, eventually


async def test_what_a_run_does_after_its_cancel_is_recorded_as_a_leak(
    make_bus: BusFactory,
) -> None:
    a, b = await make_bus(), await make_bus()
    kept: list[RunHandle] = []

    async def careless() -> None:
        async with a.run() as run:
            kept.append(run)
            while True:
                run.emit("token")
                run.checkpoint()
                await asyncio.sleep(0.002)

    task = asyncio.create_task(careless())
    await eventually(lambda: _holding(kept))
    run = kept[0]
    assert (await b.cancel(run.run_id, timeout=WAIT)).outcome is Outcome.CANCELLED
    await asyncio.wait_for(task, WAIT)

    run.emit("a token after the end")  # the code of a run that did not stop everything
    leak_line = inspect.currentframe().f_lineno - 1  # type: ignore[union-attr]
    run.phase = "tool:late"
    with pytest.raises(RunCancelled):
        run.checkpoint()  # would have raised: still does, and is a leak
    with pytest.raises(RunEnded):
        await run.pause()
    run.report_leak("framework_event")  # an adapter's own report
    assert a.stats.leaks == 5

    async def recorded() -> bool:
        info = await b.get_run(run.run_id)
        return info is not None and (info.leaked_after_cancel or {}).get("count") == 5

    await eventually(recorded)
    info = await b.get_run(run.run_id)
    assert info is not None and info.leaked_after_cancel is not None
    leak = info.leaked_after_cancel
    assert leak["calls"] == {
        "emit": 1,
        "phase": 1,
        "checkpoint": 1,
        "pause": 1,
        "framework_event": 1,
    }
    assert leak["first_call"] == "emit" and leak["first_site"].endswith(f":{leak_line}")
    assert info.output.count("token") >= 1 and "after the end" not in info.output
    assert info.phase != "tool:late"
    assert [e.type for e in await b.events(run.run_id)].count("run.leaked") == 1


async def test_a_child_started_after_its_parent_ended_is_a_leak_of_the_parent(
    make_bus: BusFactory,
) -> None:
    a = await make_bus()
    async with a.run() as parent:
        pass
    async with a.run(parent=parent.run_id):  # e.g. a task the parent left behind
        pass

    async def recorded() -> bool:
        info = await a.get_run(parent.run_id)
        return info is not None and info.leaked_after_cancel is not None

    await eventually(recorded)
    info = await a.get_run(parent.run_id)
    assert info is not None and info.leaked_after_cancel is not None
    assert info.leaked_after_cancel["calls"] == {"child_started": 1}


@pytest.fixture
async def elsewhere() -> AsyncIterator[EmbeddedServer]:
    """Another server: where a misdirected subscriber ends up (a stale primary, say)."""
    server = EmbeddedServer().start()
    yield server
    server.cleanup()


async def test_a_node_whose_channel_goes_silent_turns_unready_within_a_probe_interval(
    make_bus: BusFactory,
    elsewhere: EmbeddedServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a = await make_bus(lease_ttl=1.5)  # a probe every 0.5 s
    await eventually(lambda: _probe_shown(a))  # a heartbeat carried its first probe's figures
    assert a.ready and a.problems == []
    stale = aioredis.Redis.from_url(elsewhere.url, decode_responses=True)

    async def misdirected(channel: str) -> tuple[aioredis.Redis, bool]:
        return stale, False  # connected, subscribed, answering pings: on the wrong server

    topology = SimpleNamespace(subscriber=misdirected, cluster=False)
    monkeypatch.setattr(a._node.subscription, "_topology", topology)
    a._node.subscription.unsubscribe()  # its subscription is lost...
    await a._node.subscription.subscribe(timeout=WAIT)  # ... and made again where nothing arrives
    assert a._node.subscription.connected  # all looks fine, but the probes
    async with asyncio.timeout(3 * a._node.probe.interval + 1):
        while a.ready:
            await asyncio.sleep(0.02)
    assert any("silent" in problem for problem in a.problems)
    assert a.stats.probes_failed >= 1
    await stale.aclose()


async def test_the_responsiveness_profile_names_the_slow_site(make_bus: BusFactory) -> None:
    a = await make_bus(profile_checkpoints=True)
    b = await make_bus()
    sites: dict[str, int] = {}

    async def agent(run: RunHandle) -> None:
        for _ in range(3):
            run.checkpoint()
            line = inspect.currentframe().f_lineno  # type: ignore[union-attr]
            sites.setdefault("fast", line - 1)
            await asyncio.sleep(0.001)
        run.checkpoint()
        sites["slow"] = inspect.currentframe().f_lineno - 1  # type: ignore[union-attr]
        await asyncio.sleep(0.2)  # a tool call with no checkpoint inside
        run.checkpoint()

    async with a.run() as run:
        await agent(run)
    info = await b.get_run(run.run_id)
    assert info is not None and info.slowest_checkpoints is not None
    worst_site, worst_ms = max(info.slowest_checkpoints.items(), key=lambda item: item[1])
    assert worst_site.endswith(f"test_self_checks.py:{sites['slow']}")
    assert worst_ms >= 200
    fast = [
        ms for site, ms in info.slowest_checkpoints.items() if site.endswith(f":{sites['fast']}")
    ]
    assert fast and fast[0] < 100


async def _holding(handles: list[Any]) -> bool:
    return bool(handles)


async def _probe_shown(bus: CancelBus) -> bool:
    nodes = {node.node_id: node for node in await bus.list_nodes()}
    node = nodes.get(bus.node_id)
    return node is not None and node.probe_latency_ms is not None and node.probe_at is not None


async def test_a_probe_whose_cancellation_was_swallowed_still_stops_with_the_bus(
    make_bus: BusFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    entered = asyncio.Event()

    async def swallowing(self: Notices, node_id: str, epoch: str, nonce: str) -> int:
        entered.set()  # as redis-py can, in a rare race: the cancellation is lost in a connect
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.Event().wait()
        return 1

    monkeypatch.setattr(Notices, "probe", swallowing)
    bus = await make_bus(lease_ttl=30.0)  # a probe every 5 s: longer than a shutdown may take
    await asyncio.wait_for(entered.wait(), WAIT)
    probing = [task for task in asyncio.all_tasks() if task.get_name() == "cancel-bus probe"]
    assert len(probing) == 1
    await bus.close()
    assert probing[0].done()  # it rested no probe interval after its stop


async def test_a_sweep_started_by_a_subscription_ends_with_the_bus(
    make_bus: BusFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    bus = await make_bus()
    entered = asyncio.Event()

    async def slow(self: Reads, node_id: str) -> dict[str, CancelMode]:
        entered.set()  # Redis slow to answer when the bus closes
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0.2)  # the call takes a while to let go of its connection
        return {}

    monkeypatch.setattr(Reads, "pending_cancels", slow)
    bus._node.subscription.unsubscribe()
    await bus._node.subscription.subscribe(timeout=WAIT)  # subscribed again: it sweeps at once
    await asyncio.wait_for(entered.wait(), WAIT)
    sweeping = [t for t in asyncio.all_tasks() if t.get_name() == "cancel-bus subscription"]
    assert len(sweeping) == 1  # the sweep runs in the subscription's task, before it listens
    await bus.close()
    assert sweeping[0].done()  # stopped by the close, not left pending for the loop's end
