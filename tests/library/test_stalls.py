"""A paused Redis is not a dead node: stalls of the whole server (SIGSTOP, CLIENT PAUSE) that the
lease rides out stop nothing; a longer one stops the runs before their lease could run out (the
lease-safe fence), and the same incarnation goes on; the heartbeat's retries, the subscriber's
watchdog and a burst of ends — on real servers."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from cancel_bus import BusUnavailable, CancelBus, Outcome, RunInfo, RunStatus
from node.embedded import EmbeddedServer

from ..conftest import BusFactory
from ..faultproxy import FaultProxy
from ..helpers import WAIT, LoopingRun, eventually, keys_of, redis_of

pytestmark = pytest.mark.slow  # not in the fast tier

LEASE = 3.0
RIDE_OUT = 0.65  # of a lease: a stall this long loses nothing (the bound is 0.85, DESIGN §9)
# Where in a node's heartbeat a stall begins (a share of a beat since its last renewal was sent),
# and a stall that long wherever it begins: past the bound of a beat of a fifth of a lease (0.75)
PHASES = (0.0, 0.5, 0.95)
WORST_STALL = 0.78


@pytest.fixture
async def own_client(own_server: EmbeddedServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(own_server.url, decode_responses=True)
    yield client
    await client.aclose()


@pytest.fixture
async def nodes(own_server: EmbeddedServer, namespace: str) -> AsyncIterator[list[CancelBus]]:
    buses = [CancelBus(own_server.url, namespace=namespace, lease_ttl=LEASE) for _ in range(2)]
    for bus in buses:
        await bus.start()
    yield buses
    for bus in buses:
        await bus.close(cancel_timeout=2)


async def _stall(server: EmbeddedServer, client: aioredis.Redis, kind: str, seconds: float) -> None:
    """Redis answers nobody for ``seconds`` (the sleeps are the fault's length)."""
    if kind == "sigstop":
        server.pause()
        await asyncio.sleep(seconds)
        server.resume()
        return
    await client.execute_command("CLIENT", "PAUSE", int(seconds * 1000), kind.rsplit("_", 1)[-1])
    await asyncio.sleep(seconds)


async def _server_time(client: aioredis.Redis) -> float:
    seconds, micros = await client.time()
    return float(seconds) + micros / 1e6


async def _renewed_since(bus: CancelBus, observer: CancelBus, since: float) -> bool:
    nodes = {node.node_id: node for node in await observer.list_nodes()}
    node = nodes.get(bus.node_id)
    return node is not None and node.last_heartbeat > since


@pytest.mark.parametrize("kind", ["sigstop", "client_pause_all", "client_pause_write"])
async def test_a_stall_the_lease_rides_out_stops_no_run_and_reaps_no_node(
    own_server: EmbeddedServer, own_client: aioredis.Redis, nodes: list[CancelBus], kind: str
) -> None:
    incarnations = [(bus.node_id, bus.epoch) for bus in nodes]
    runs = [await LoopingRun(bus).start() for bus in nodes]
    await _stall(own_server, own_client, kind, RIDE_OUT * LEASE)
    await _nothing_was_lost(own_client, nodes, runs, incarnations)


@pytest.mark.parametrize("phase", PHASES)
async def test_a_stall_rides_out_wherever_it_falls_in_the_heartbeat(
    own_server: EmbeddedServer, own_client: aioredis.Redis, nodes: list[CancelBus], phase: float
) -> None:
    """The worst case is a stall that begins just before a beat: the last renewal Redis
    acknowledged is then a whole beat old, and the fence is counted from it."""
    incarnations = [(bus.node_id, bus.epoch) for bus in nodes]
    runs = [await LoopingRun(bus).start() for bus in nodes]
    lease = nodes[0]._node.lease
    renewed = lease.renewed_at

    async def beat_answered() -> bool:
        return lease.renewed_at > renewed

    await eventually(beat_answered, interval=0.002)
    await asyncio.sleep(lease.renewed_at + phase * lease.beat_period - time.monotonic())
    await _stall(own_server, own_client, "sigstop", WORST_STALL * LEASE)
    await _nothing_was_lost(own_client, nodes, runs, incarnations)


async def _nothing_was_lost(
    client: aioredis.Redis,
    nodes: list[CancelBus],
    runs: list[LoopingRun],
    incarnations: list[tuple[str, str]],
) -> None:
    """After a stall the nodes rode out: every run goes on, unasked, on the same incarnations,
    and the cancel path works."""
    a, b = nodes
    resumed = await _server_time(client)
    for bus in nodes:
        await eventually(lambda bus=bus: _renewed_since(bus, a, resumed))  # type: ignore[misc]
    for run in runs:
        assert run.handle is not None and run.handle.cancel_requested is None
        record = await a.get_run(run.run_id)
        assert record is not None and record.status is RunStatus.RUNNING
        assert record.cancel_requested_at is None
    for bus in nodes:
        assert (bus.stats.leases_lost, bus.stats.self_fences, bus.stats.runs_reaped) == (0, 0, 0)
    assert [(bus.node_id, bus.epoch) for bus in nodes] == incarnations
    for run, canceller in zip(runs, (b, a), strict=True):  # and the cancel path still works
        result = await canceller.cancel(run.run_id, timeout=WAIT)
        assert result.outcome is Outcome.CANCELLED
        await run.done()


@pytest.mark.parametrize("kind", ["sigstop", "client_pause_write"])
async def test_a_stall_past_the_lease_stops_the_runs_in_time_and_the_incarnation_goes_on(
    own_server: EmbeddedServer, own_client: aioredis.Redis, nodes: list[CancelBus], kind: str
) -> None:
    a, b = nodes
    incarnations = [(bus.node_id, bus.epoch) for bus in nodes]
    runs = [await LoopingRun(bus).start() for bus in nodes]
    stalled = time.monotonic()
    await _stall(own_server, own_client, kind, 1.5 * LEASE)
    for run in runs:  # stopped by their own node, before their lease could run out
        await run.done()
        assert run.handle is not None and run.handle.cancel_requested is not None
        assert run.stopped_at is not None and run.stopped_at - stalled < LEASE
    for bus in nodes:
        await eventually(lambda bus=bus: _all_ended(bus, b), timeout=WAIT)  # type: ignore[misc]
    for run in runs:
        record = await b.get_run(run.run_id)
        assert record is not None and record.status is RunStatus.FAILED
        assert record.end_reason == "redis_unreachable" and record.cancel_requested_at is None
    for bus in nodes:  # nobody was reaped: a stall everyone sat out is nobody's death
        assert (bus.stats.leases_lost, bus.stats.self_fences, bus.stats.runs_reaped) == (0, 1, 0)
    assert [(bus.node_id, bus.epoch) for bus in nodes] == incarnations
    again = await LoopingRun(a).start()  # the same incarnation goes on
    assert (await b.cancel(again.run_id, timeout=WAIT)).outcome is Outcome.CANCELLED
    await again.done()


async def test_a_node_cut_off_alone_stops_its_runs_before_another_may_resolve_them(
    make_bus: BusFactory, proxy: FaultProxy
) -> None:
    """The partition the others cannot tell from a death: the cut-off node's code stops before
    its lease can expire, so no record or answer says a run ended while its code went on."""
    a = await make_bus(url=proxy.url, lease_ttl=LEASE)
    b = await make_bus(lease_ttl=LEASE)
    run = await LoopingRun(a).start()
    proxy.blackhole()
    await run.done()
    assert run.stopped_at is not None
    stopped = time.time() - (time.monotonic() - run.stopped_at)  # its code's last step
    record = await eventually(lambda: _ended(b, run.run_id), timeout=2 * LEASE)
    assert record.end_reason == "owner_lost" and record.status is RunStatus.FAILED
    assert record.finished_at is not None and record.finished_at > stopped
    result = await b.cancel(run.run_id, timeout=WAIT)  # true: its code had stopped
    assert result.outcome is Outcome.ALREADY_FINISHED
    proxy.heal()


async def test_a_start_answered_after_the_node_fenced_itself_does_not_run_the_code(
    make_bus: BusFactory, proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start is recorded, then the node is cut off before the answer reaches it; the answer
    comes back after the node stopped its runs (its lease may have run out, and the others
    resolve the run as its node's): the code never starts (the chaos suite's case: code that
    ran for a run already recorded owner_lost)."""
    a = await make_bus(url=proxy.url, lease_ttl=LEASE)
    b = await make_bus(lease_ttl=LEASE)
    register = a._node.calls.start_run

    async def answered_late(*args: Any, **kwargs: Any) -> Any:
        answer = await register(*args, **kwargs)
        proxy.blackhole()
        await eventually(lambda: _fenced(a), timeout=2 * LEASE)
        proxy.heal()
        return answer

    monkeypatch.setattr(a._node.calls, "start_run", answered_late)
    ran = False
    with pytest.raises(BusUnavailable, match="may have lost its lease"):
        async with a.run("late"):
            ran = True
    assert not ran
    record = await eventually(lambda: _ended(b, "late"), timeout=3 * LEASE)
    assert record.status is RunStatus.FAILED and record.started_at is not None


async def _fenced(bus: CancelBus) -> bool:
    return bus.stats.self_fences > 0


async def _ended(bus: CancelBus, run_id: str) -> RunInfo | None:
    record = await bus.get_run(run_id)
    return record if record is not None and not record.is_active else None


async def _all_ended(bus: CancelBus, observer: CancelBus) -> bool:
    return not bus.local_runs() and not await observer.list_runs(node_id=bus.node_id)


async def test_a_failed_heartbeat_is_retried_at_once(
    make_bus: BusFactory, proxy: FaultProxy, raw_redis: aioredis.Redis
) -> None:
    lease = 10.0  # a heartbeat every second
    a = await make_bus(url=proxy.url, lease_ttl=lease)
    b = await make_bus(lease_ttl=lease)
    before = await _server_time(raw_redis)
    await eventually(lambda: _renewed_since(a, b, before), interval=0.005)
    proxy.refuse()  # right after a beat: the next one, 1 s later, fails
    await asyncio.sleep(1.1)
    proxy.heal()
    healed = await _server_time(raw_redis)
    await eventually(lambda: _renewed_since(a, b, healed), timeout=lease)
    renewed = {node.node_id: node.last_heartbeat for node in await b.list_nodes()}[a.node_id]
    # retried with a backoff of at most half a beat, it lands right after the heal; waiting a
    # whole beat after the failure would land 0.9 s after it
    assert renewed - healed < 0.7
    assert a.stats.leases_lost == 0


async def test_a_busy_then_quiet_channel_keeps_its_subscriber(
    make_bus: BusFactory, raw_redis: aioredis.Redis
) -> None:
    a = await make_bus(lease_ttl=0.9)  # the subscriber pings every 0.3 s
    channel = keys_of(a).channel(a.node_id)
    for _ in range(12):  # a message every 0.1 s for four ping intervals...
        await raw_redis.publish(channel, "noise")
        await asyncio.sleep(0.1)
    await eventually(lambda: _rejected(a, 12))
    await asyncio.sleep(1.2)  # ... then four quiet intervals: the pongs must keep it alive
    assert a.pubsub_reconnects == 0 and a.ready


async def test_a_burst_of_ends_is_written_without_starving_the_owner(
    make_bus: BusFactory, raw_redis: aioredis.Redis
) -> None:
    runs = 2000
    a = await make_bus(lease_ttl=1.5)
    await make_bus(lease_ttl=1.5)  # a live reaper: the owner's lease runs on its beats too
    redis_of(a).connection_pool.timeout = 0.2  # type: ignore[union-attr]  # waiting longer fails
    gate = asyncio.Event()

    async def one() -> None:
        async with a.run():
            await gate.wait()

    tasks = [asyncio.create_task(one()) for _ in range(runs)]
    await eventually(lambda: _holding(a, runs), timeout=60)
    gate.set()  # every run ends in the same event-loop turn
    await asyncio.wait_for(asyncio.gather(*tasks), 60)
    assert a.stats.finishes_deferred == 0 and a.stats.leases_lost == 0
    keys = keys_of(a)
    assert await raw_redis.zcard(keys.finished) == runs and await raw_redis.zcard(keys.active) == 0
    for status in (RunStatus.FAILED, RunStatus.CANCELLED):
        assert await a.list_runs(status=status) == []


async def test_a_run_whose_exit_is_cancelled_ends_once_its_end_is_recorded(
    own_server: EmbeddedServer, own_client: aioredis.Redis, namespace: str
) -> None:
    async with CancelBus(own_server.url, namespace=namespace, lease_ttl=6.0) as a:
        leave, ids = asyncio.Event(), []

        async def work() -> None:
            async with a.run() as run:
                ids.append(run.run_id)
                await leave.wait()

        task = asyncio.create_task(work())
        await eventually(lambda: _holding(a, 1))
        await own_client.execute_command("CLIENT", "PAUSE", 5000, "WRITE")  # the finish waits
        try:
            leave.set()
            await eventually(lambda: _finishing(a))
            task.cancel()  # e.g. the server shutting down, while the end is on its way
            ended, _ = await asyncio.wait({task}, timeout=0.5)
            assert not ended  # the exit waits for the record, cancelled or not...
        finally:
            await own_client.execute_command("CLIENT", "UNPAUSE")
        with pytest.raises(asyncio.CancelledError):  # ... and is cancelled once it is written
            await asyncio.wait_for(task, WAIT)
        record = await a.get_run(ids[0])
        assert record is not None and record.status is RunStatus.SUCCEEDED


async def _finishing(bus: CancelBus) -> bool:
    return bus._node.local.finishing > 0


async def _rejected(bus: CancelBus, count: int) -> bool:
    return bus.stats.messages_rejected >= count


async def _holding(bus: CancelBus, count: int) -> bool:
    return len(bus.local_runs()) >= count


async def test_a_drain_that_cannot_record_its_cancels_still_records_them_with_the_finish(
    make_bus: BusFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = await make_bus(), await make_bus()
    run = await LoopingRun(a).start()

    async def unavailable(*args: object, **kwargs: object) -> None:
        raise BusUnavailable("no answer from Redis within the timeout")

    monkeypatch.setattr(a, "cancel", unavailable)  # the drain's own cancel request fails
    await a.close(cancel_timeout=WAIT)
    await run.done()
    record = await b.get_run(run.run_id)
    assert record is not None and record.status is RunStatus.CANCELLED
    assert record.cancel_reason == "node_shutdown" and record.requested_by == a.node_id


async def test_a_blocked_event_loop_is_not_a_dead_subscriber(
    make_bus: BusFactory, redis_url: str, namespace: str
) -> None:
    """The node's own loop blocked for seconds (a long CPU turn) while a cancel arrives: once it
    runs again the cancel is read at once from its connection, which is not judged dead for a
    silence that was the node's own (it was dropped, then the cancel came a reconnect later)."""
    a = await make_bus(lease_ttl=LEASE)  # a ping every 0.6 s: 1.2 s of silence is death
    run = await LoopingRun(a).start()
    blocked = threading.Event()

    def cancel_from_elsewhere() -> None:  # another node, in a thread with a loop of its own
        async def cancel() -> None:
            assert blocked.wait(WAIT)
            async with CancelBus(redis_url, namespace=namespace, lease_ttl=LEASE) as b:
                result = await b.cancel(run.run_id, wait=False)
                assert result.outcome is Outcome.STOPPING

        asyncio.run(cancel())

    elsewhere = threading.Thread(target=cancel_from_elsewhere)
    elsewhere.start()
    blocked.set()
    time.sleep(2.0)  # noqa: ASYNC251 - the fault: this node's event loop blocked for 2 s
    unblocked = time.monotonic()
    await asyncio.to_thread(elsewhere.join, WAIT)
    await run.done()
    assert run.stopped_at is not None and run.stopped_at - unblocked < 0.5
    assert a.pubsub_reconnects == 0
