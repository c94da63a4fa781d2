"""Nothing grows without bound: finished runs, their events and indexes expire (behaviour 14)."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from cancel_bus import CancelBus, RunStatus

from ..conftest import BusFactory
from ..helpers import LoopingRun, eventually, keys_of


async def _namespace_keys(redis: aioredis.Redis, bus: CancelBus) -> set[str]:
    return {key async for key in redis.scan_iter(match=f"{keys_of(bus).prefix}*", count=1000)}


async def test_finished_runs_and_their_events_expire(
    make_bus: BusFactory, raw_redis: aioredis.Redis
) -> None:
    retention = 3.0  # long enough for the steps below on a slow machine
    a = await make_bus(retention=retention)
    b = await make_bus(retention=retention)
    k = keys_of(a)
    baseline = await _namespace_keys(raw_redis, a)

    async with a.run(app_name="app", user_id="u", session_id="s", relay=True) as run:
        run.emit("text")
    looping = await LoopingRun(a).start()
    await b.cancel(looping.run_id)
    await looping.done()
    queued = await b.enqueue()
    await b.cancel(queued.run_id)

    ids = [run.run_id, looping.run_id, queued.run_id]
    limit = retention * 1000
    for run_id in ids:
        assert 0 < await raw_redis.pttl(k.run(run_id)) <= limit
        assert 0 < await raw_redis.pttl(k.events(run_id)) <= limit
    assert 0 < await raw_redis.pttl(k.relay(run.run_id)) <= limit
    assert await raw_redis.zcard(k.active) == 0
    assert not await raw_redis.exists(k.node_pending(a.node_id), k.waiters(looping.run_id))

    async def expired() -> bool:
        return not await raw_redis.exists(*(k.run(i) for i in ids), *(k.events(i) for i in ids))

    await eventually(expired, timeout=retention + 5)
    async with a.run():  # the next finish prunes the finished index
        pass
    assert await raw_redis.zcard(k.finished) == 1
    (last,) = await raw_redis.zrange(k.finished, 0, -1)
    leftover = await _namespace_keys(raw_redis, a) - baseline
    assert leftover == {k.finished, k.run(last), k.events(last)}
    assert await b.get_run(ids[0]) is None


async def test_departed_nodes_are_forgotten(
    make_bus: BusFactory, raw_redis: aioredis.Redis
) -> None:
    a = await make_bus(retention=1.0)
    b = await make_bus(retention=1.0)
    node_key = keys_of(a).node(a.node_id)
    await a.close()
    assert a.node_id not in {n.node_id for n in await b.list_nodes()}
    assert await raw_redis.hget(node_key, "state") == "left"
    assert 0 < await raw_redis.pttl(node_key) <= 2000
    await asyncio.sleep(0)
    assert (await b.list_runs(status=RunStatus.RUNNING)) == []


async def test_the_finished_index_is_pruned_even_when_nothing_finishes(
    make_bus: BusFactory, raw_redis: aioredis.Redis
) -> None:
    a = await make_bus(retention=60, lease_ttl=1)
    stale = {f"gone-{i}": 1000.0 + i for i in range(18_000)}  # ended long ago, records expired
    await raw_redis.zadd(keys_of(a).finished, stale)
    await raw_redis.zadd(keys_of(a).finished, {"recent": (await raw_redis.time())[0]})

    async def pruned() -> bool:
        return await raw_redis.zcard(keys_of(a).finished) == 1  # at the next heartbeat's reaping

    await eventually(pruned, timeout=5)
