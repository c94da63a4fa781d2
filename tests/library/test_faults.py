"""Faults on real connections: lost pub/sub messages, dead owners, fencing, Redis unreachable
(behaviours 7, 8, 9, 12 of the foundation)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time

import pytest
import redis.asyncio as aioredis
import uvloop

from cancel_bus import BusUnavailable, CancelBus, Outcome, RunStatus
from node.embedded import EmbeddedServer

from ..conftest import BusFactory
from ..faultproxy import FaultProxy
from ..helpers import WAIT, GatedRun, LoopingRun, crash, eventually, keys_of, redis_of

POOL_SIZE = 64  # connections in a bus's command pool (cancel_bus._redis.connect)


async def test_cancel_published_while_subscriber_is_down_is_delivered_by_sweep(
    make_bus: BusFactory, proxy: FaultProxy
) -> None:
    a = await make_bus(url=proxy.url, sweep_interval=3600)  # only the resubscribe sweep can help
    b = await make_bus()
    run = await LoopingRun(a).start()

    proxy.refuse()  # the owner's connections (subscriber included) die and cannot come back
    await eventually(lambda: _not_connected(a))
    result = await b.cancel(run.run_id, wait=False)
    assert result.outcome is Outcome.STOPPING
    receivers = await redis_of(b).pubsub_numsub(keys_of(b).channel(a.node_id))
    assert receivers == [(keys_of(b).channel(a.node_id), 0)]  # nobody heard the publish

    proxy.heal()
    await run.done()  # delivered after the reconnect, by the sweep
    assert a.stats.cancels_recovered_by_sweep == 1
    assert a.pubsub_reconnects >= 1
    final = await b.get_run(run.run_id)
    assert final is not None and final.status is RunStatus.CANCELLED


async def test_client_kill_of_the_subscriber_loses_no_cancel(
    make_bus: BusFactory, raw_redis: aioredis.Redis
) -> None:
    a, b = await make_bus(), await make_bus()
    for _ in range(5):
        run = await LoopingRun(a).start()
        killed = await raw_redis.client_kill_filter(_type="pubsub", skipme=True)
        assert killed >= 1
        result = await b.cancel(run.run_id, timeout=WAIT)
        assert result.outcome is Outcome.CANCELLED
        await run.done()


async def test_every_forced_disconnect_of_the_subscriber_is_counted(
    make_bus: BusFactory, raw_redis: aioredis.Redis
) -> None:
    """redis-py reconnects a pub/sub connection and resubscribes by itself: the bus counts each
    such reconnect too (it counted none: its own loop never saw the connection go)."""
    a = await make_bus()
    name = f"cancel-bus.{a.node_id}"
    for times in range(1, 31):
        subscriber = next(
            c for c in await raw_redis.client_list() if c["name"] == name and int(c["sub"])
        )
        await raw_redis.client_kill_filter(_id=subscriber["id"])
        await eventually(lambda times=times: _reconnected(a, times))  # type: ignore[misc]
    assert a.pubsub_reconnects == 30 and a.ready


async def _reconnected(bus: CancelBus, times: int) -> bool:
    return bus.pubsub_reconnects >= times and bus._node.subscription.connected


async def test_periodic_sweep_delivers_a_cancel_whose_message_was_lost(
    make_bus: BusFactory, raw_redis: aioredis.Redis
) -> None:
    a = await make_bus(sweep_interval=0.2)
    run = await LoopingRun(a).start()
    # Record a cancel the way the script does, but publish nothing: a message lost in flight.
    key = keys_of(a).run(run.run_id)
    await raw_redis.hset(
        key,
        mapping={
            "cancel_requested_at": f"{time.time():.6f}",
            "cancel_mode": "checkpoint",
            "cancel_reason": "lost",
        },
    )
    await raw_redis.hset(keys_of(a).node_pending(a.node_id), run.run_id, "checkpoint")
    await run.done()
    assert a.stats.cancels_recovered_by_sweep == 1
    final = await a.get_run(run.run_id)
    assert final is not None and final.status is RunStatus.CANCELLED


@pytest.mark.parametrize("cancel_pending", [True, False])
async def test_dead_owner_runs_are_resolved_within_lease(
    make_bus: BusFactory, proxy: FaultProxy, cancel_pending: bool
) -> None:
    lease_ttl = 1.5
    a = await make_bus(url=proxy.url, lease_ttl=lease_ttl)
    b = await make_bus(lease_ttl=lease_ttl)
    run = await LoopingRun(a).start()
    waiter = None
    await crash(a, proxy)
    last_beat = {node.node_id: node.last_heartbeat for node in await b.list_nodes()}[a.node_id]
    if cancel_pending:  # accepted while the owner is silently gone: nobody hears the publish
        waiter = asyncio.create_task(b.cancel(run.run_id, timeout=2 * lease_ttl + 5))

    async def resolved() -> bool:
        info = await b.get_run(run.run_id)
        return info is not None and not info.is_active

    await eventually(resolved, timeout=lease_ttl * 3 + 5)
    final = await b.get_run(run.run_id)
    assert final is not None and final.finished_at is not None
    # on the server's clock: the lease runs out, then the reaper's next beat resolves the run
    # (its beat lands within an interval; a little more for a busy machine's scheduling)
    assert final.finished_at - last_beat <= lease_ttl + lease_ttl / 3 + 0.5
    assert final is not None and final.end_reason == "owner_lost"
    if cancel_pending:
        assert waiter is not None
        result = await asyncio.wait_for(waiter, WAIT)
        assert result.outcome is Outcome.OWNER_LOST
        assert final.status is RunStatus.CANCELLED
    else:
        assert final.status is RunStatus.FAILED
    assert b.stats.runs_reaped == 1
    nodes = [n.node_id for n in await b.list_nodes()]
    assert a.node_id not in nodes
    assert run.task is not None
    run.task.cancel()


async def test_cancel_of_a_run_whose_owner_lease_expired_answers_owner_lost_at_once(
    make_bus: BusFactory, proxy: FaultProxy, raw_redis: aioredis.Redis
) -> None:
    a = await make_bus(url=proxy.url, lease_ttl=60)
    b = await make_bus(lease_ttl=60)
    run = await LoopingRun(a).start()
    await crash(a, proxy)
    await raw_redis.zadd(keys_of(a).nodes, {a.node_id: time.time() - 1})  # the lease runs out
    result = await b.cancel(run.run_id, timeout=WAIT)
    assert result.outcome is Outcome.OWNER_LOST
    assert result.run is not None and result.run.status is RunStatus.CANCELLED
    assert run.task is not None
    run.task.cancel()


async def test_fenced_node_cannot_overwrite_its_former_runs(
    make_bus: BusFactory, proxy: FaultProxy
) -> None:
    lease_ttl = 1.2
    a = await make_bus(url=proxy.url, lease_ttl=lease_ttl)
    b = await make_bus(lease_ttl=lease_ttl)
    old_node = a.node_id
    # no checkpoint after the gate: it would finish as succeeded
    run = await GatedRun(a, then=lambda run: run.emit("late output")).start()
    ids = [run.run_id]
    proxy.blackhole()  # a partition: no answer, no reset

    async def reaped() -> bool:
        info = await b.get_run(ids[0])
        return info is not None and info.status is RunStatus.FAILED

    await eventually(reaped, timeout=lease_ttl * 3 + 2)
    proxy.heal()
    run.release()
    await run.done()
    final = await b.get_run(ids[0])
    assert final is not None and final.status is RunStatus.FAILED
    assert final.end_reason == "owner_lost" and final.output == ""
    # the node found itself fenced and rejoined as a new incarnation
    await eventually(lambda: _rejoined(a, old_node), timeout=lease_ttl * 4 + 2)
    assert a.stats.leases_lost >= 1
    async with a.run() as fresh:  # and it works again
        fresh.emit("ok")
    again = await b.get_run(fresh.run_id)
    assert again is not None and again.owner == a.node_id


async def test_a_busy_pool_does_not_cost_the_node_its_lease(
    make_bus: BusFactory, raw_redis: aioredis.Redis
) -> None:
    # every connection of the node's pool is taken (as by 64 followers in a blocking read):
    # the heartbeat has connections of its own and keeps the lease, so the node is not fenced
    a, b = await make_bus(lease_ttl=0.9), await make_bus()
    run = await LoopingRun(a).start()
    key = f"test:{a.node_id}:blocker"
    blockers = [asyncio.create_task(redis_of(a).blpop([key], timeout=4)) for _ in range(POOL_SIZE)]
    await eventually(lambda: _blocked_clients(raw_redis, POOL_SIZE - 1))  # 1: the subscriber
    exhausted_at = _seconds(await raw_redis.time())

    async def renewed_long_after() -> bool:
        nodes = {node.node_id: node for node in await b.list_nodes()}
        return nodes[a.node_id].last_heartbeat > exhausted_at + 2 * a.lease_ttl

    await eventually(renewed_long_after)
    assert a.stats.leases_lost == 0 and a.ready
    await raw_redis.lpush(key, *range(POOL_SIZE))
    await asyncio.wait_for(asyncio.gather(*blockers), WAIT)
    result = await b.cancel(run.run_id, timeout=WAIT)  # the run kept going, and stops now
    assert result.outcome is Outcome.CANCELLED
    await run.done()


async def test_redis_down_raises_bus_unavailable_and_finish_is_not_lost(
    make_bus: BusFactory, proxy: FaultProxy
) -> None:
    a = await make_bus(url=proxy.url, lease_ttl=30)
    b = await make_bus(lease_ttl=30)
    run = await GatedRun(a, then=lambda run: run.emit("finished while Redis was away")).start()
    ids = [run.run_id]
    proxy.refuse()

    t0 = time.monotonic()
    with pytest.raises(BusUnavailable):
        await a.cancel(ids[0], timeout=WAIT)
    with pytest.raises(BusUnavailable):
        async with a.run():
            pass
    assert time.monotonic() - t0 < WAIT

    run.release()
    await run.done()  # the run's own exit is not blocked by the outage
    assert a.stats.finishes_deferred == 1
    info = await b.get_run(ids[0])
    assert info is not None and info.status is RunStatus.RUNNING  # not written yet

    proxy.heal()

    async def landed() -> bool:
        info = await b.get_run(ids[0])
        return info is not None and info.status is RunStatus.SUCCEEDED

    await eventually(landed)
    final = await b.get_run(ids[0])
    assert final is not None and final.output == "finished while Redis was away"


async def test_cancel_answers_within_its_timeout_when_redis_hangs(
    make_bus: BusFactory, proxy: FaultProxy
) -> None:
    a = await make_bus(url=proxy.url, lease_ttl=30)
    proxy.blackhole()
    t0 = time.monotonic()
    with pytest.raises(BusUnavailable):
        await a.cancel("some-run", timeout=0.5)
    assert time.monotonic() - t0 < 1.5
    proxy.heal()


async def test_start_fails_clearly_when_redis_is_unreachable() -> None:
    bus = CancelBus("redis://127.0.0.1:1/0", namespace="nowhere", lease_ttl=1)
    t0 = time.monotonic()
    with pytest.raises(BusUnavailable):
        await bus.start()
    assert time.monotonic() - t0 < WAIT
    await bus.close()


async def _blocked_clients(redis: aioredis.Redis, count: int) -> bool:
    info = await redis.info("clients")
    return int(info["blocked_clients"]) >= count


def _seconds(server_time: tuple[int, int]) -> float:
    return server_time[0] + server_time[1] / 1e6


async def _not_connected(bus: CancelBus) -> bool:
    return not bus.ready


async def _rejoined(bus: CancelBus, old_node: str) -> bool:
    return bus.ready and bus.node_id != old_node


def test_under_uvloop_refused_connections_are_bus_unavailable_and_heal(
    redis_server: EmbeddedServer, namespace: str
) -> None:
    """The node service runs on uvloop, whose transports fail differently from asyncio's
    (a write after a reset is a RuntimeError there, uvloop#506; the node-level test
    test_no_password_or_signing_key_leaks_when_redis_fails meets it): same promises."""

    async def scenario() -> None:
        proxy = await FaultProxy(redis_server.port).start()
        bus = CancelBus(proxy.url, namespace=namespace, lease_ttl=30)
        await bus.start()
        try:
            proxy.refuse()
            await eventually(lambda: _not_connected(bus))
            for _ in range(3):
                with pytest.raises(BusUnavailable):
                    await bus.cancel("some-run", timeout=2)
            proxy.heal()
            await eventually(lambda: _ready(bus))
            assert (await bus.cancel("some-run", timeout=2)).outcome is Outcome.NOT_FOUND
        finally:
            await bus.close()
            await proxy.close()

    uvloop.run(scenario())


async def _ready(bus: CancelBus) -> bool:
    return bus.ready


async def test_a_close_without_redis_says_the_lease_was_not_released(
    make_bus: BusFactory, proxy: FaultProxy, caplog: pytest.LogCaptureFixture
) -> None:
    a = await make_bus(url=proxy.url, lease_ttl=30)
    proxy.refuse()
    with caplog.at_level(logging.INFO, logger="cancel_bus"):
        await a.close(cancel_timeout=0.5)
    said = [record.getMessage() for record in caplog.records]
    assert any("stopped without releasing its lease" in line for line in said), said
    assert not any(line.endswith(" left") for line in said), said


async def test_a_failing_heartbeat_is_one_line_per_change_of_state(
    make_bus: BusFactory, proxy: FaultProxy, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="cancel_bus")
    a = await make_bus(url=proxy.url, lease_ttl=2)
    proxy.blackhole()  # Redis silent: each beat times out, and is retried many times

    def lines(words: str) -> list[str]:
        return [r.getMessage() for r in caplog.records if words in r.getMessage()]

    await eventually(lambda: _self_fenced(a), timeout=WAIT)  # 1.9 s after the last renewal
    proxy.heal()
    await eventually(lambda: _said(caplog, "heartbeat: over after"))
    (failing,) = lines("heartbeat: ")[:1]  # the first line says how long and what happens
    assert "s since the last renewal; its runs go on for " in failing, failing
    assert "s more unless Redis renews the lease: " in failing and not failing.endswith(": ")
    # not one per attempt: a line only when the failure changes kind (a reset after timeouts,
    # as redis-py 6 reports the healed proxy's, is one)
    said = lines("since the last renewal")
    kinds = [line.split("lease: ", 1)[-1].split("): ", 1)[-1].split(" (")[0] for line in said]
    assert len(said) <= 2 and all(a != b for a, b in itertools.pairwise(kinds)), said
    (stopped,) = lines("stops its runs")
    assert "redis_unreachable" in stopped and "may run out" in stopped
    assert len(lines("heartbeat: over after")) == 1


async def _self_fenced(bus: CancelBus) -> bool:
    return bus.stats.self_fences == 1


async def _said(caplog: pytest.LogCaptureFixture, words: str) -> bool:
    return any(words in record.getMessage() for record in caplog.records)
