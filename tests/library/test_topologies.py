"""Beyond one server: a Sentinel group that fails over and a Redis Cluster that moves a slot and
fails over a shard, built from real server processes; cancels are honoured throughout."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
import redis

from cancel_bus import CancelBus, Outcome, RunStatus
from cancel_bus._keys import KeySpace

from ..helpers import WAIT, LoopingRun, eventually, keys_of
from ..topology import Cluster, SentinelGroup, needs_sharded_pubsub
from . import test_cancel

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sentinel_group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelGroup]:
    group = SentinelGroup(tmp_path_factory.mktemp("sentinel")).start()
    yield group
    group.cleanup()


@pytest.fixture(scope="module")
def redis_cluster() -> Iterator[Cluster]:
    if needs_sharded_pubsub.args[0]:
        pytest.skip(needs_sharded_pubsub.kwargs["reason"])
    cluster = Cluster().start()
    yield cluster
    cluster.cleanup()


def _factory(url: str, buses: list[CancelBus]) -> Callable[..., Awaitable[CancelBus]]:
    namespace = f"t-{uuid.uuid4().hex[:10]}"

    async def factory(**options: Any) -> CancelBus:
        options.setdefault("namespace", namespace)
        options.setdefault("lease_ttl", 10.0)
        bus = CancelBus(url, **options)
        await bus.start()
        buses.append(bus)
        return bus

    return factory


@pytest.fixture
async def on_cluster(redis_cluster: Cluster) -> AsyncIterator[Callable[..., Awaitable[CancelBus]]]:
    buses: list[CancelBus] = []
    yield _factory(redis_cluster.url, buses)
    for bus in buses:
        await bus.close(cancel_timeout=2)


# -- Redis Cluster ---------------------------------------------------------------------------

# The core behaviours re-run on a cluster, named one by one (test_cancel's tests not named here
# are in LEFT_OUT with the reason; a test added to test_cancel must be put in one or the other).
CORE = [
    test_cancel.test_cancel_from_another_node_stops_run_at_checkpoint,
    test_cancel.test_cancel_on_the_owner_node_uses_the_local_path,
    test_cancel.test_cancel_without_wait_answers_stopping_then_run_stops,
    test_cancel.test_cancel_unknown_run_is_not_found,
    test_cancel.test_cancel_finished_run_reports_final_state_and_never_overwrites,
    test_cancel.test_cancel_queued_run_needs_no_owner_and_claim_then_raises,
    test_cancel.test_queued_run_is_claimed_by_any_node,
    test_cancel.test_repeated_cancels_are_idempotent_and_every_waiter_is_answered,
    test_cancel.test_success_after_accepted_cancel_is_recorded_cancelled,
    test_cancel.test_wait_times_out_with_stopping_and_cancel_is_honoured_later,
    test_cancel.test_immediate_interrupts_a_blocked_await,
    test_cancel.test_foreign_cancelled_error_is_never_swallowed,
    test_cancel.test_foreign_cancel_during_our_immediate_cancel_still_propagates,
    test_cancel.test_after_turn_lets_the_turn_finish,
    test_cancel.test_stronger_mode_escalates_a_pending_after_turn,
    test_cancel.test_one_active_run_per_session_and_session_cancel_from_any_node,
    test_cancel.test_run_ids_are_never_reused,
    test_cancel.test_failed_run_is_recorded_and_reraised,
    test_cancel.test_waiting_run_is_cancelled_directly_and_resume_raises,
    test_cancel.test_list_runs_and_nodes_cluster_wide,
    test_cancel.test_wait_for_a_run_from_another_node,
    test_cancel.test_cancel_callbacks_fire_on_delivery_and_escalation,
    test_cancel.test_list_runs_of_every_status_most_recent_first,
]
LEFT_OUT = {
    "test_cancel_finish_race_has_exactly_one_terminal_state": "a race of local timing only",
    "test_an_immediate_cancel_that_beats_the_registration_still_interrupts": (
        "patches a store method: the topology does not change it"
    ),
}


def test_every_core_behaviour_is_re_run_on_a_cluster_or_left_out_by_name() -> None:
    names = {name for name in vars(test_cancel) if name.startswith("test_")}
    rerun = {behaviour.__name__ for behaviour in CORE}
    assert rerun | set(LEFT_OUT) == names, names - rerun - set(LEFT_OUT)
    assert not rerun & set(LEFT_OUT)


@pytest.mark.parametrize("behaviour", CORE, ids=[b.__name__[5:] for b in CORE])
async def test_core_behaviour_on_a_cluster(
    behaviour: Callable[..., Awaitable[None]], on_cluster: Callable[..., Awaitable[CancelBus]]
) -> None:
    await behaviour(on_cluster)


async def test_node_channels_are_sharded(
    redis_cluster: Cluster, on_cluster: Callable[..., Awaitable[CancelBus]]
) -> None:
    a = await on_cluster()
    channel = keys_of(a).channel(a.node_id)
    owner = redis_cluster.client(redis_cluster.owner(channel))
    assert channel in owner.execute_command("PUBSUB", "SHARDCHANNELS")
    for server in redis_cluster.primaries:
        assert channel not in redis_cluster.client(server).execute_command("PUBSUB", "CHANNELS")


async def test_slot_migration_mid_run(
    redis_cluster: Cluster, on_cluster: Callable[..., Awaitable[CancelBus]]
) -> None:
    a, b = await on_cluster(), await on_cluster()
    run = await LoopingRun(a, app_name="app", user_id="u", session_id="s").start()
    probe = keys_of(a).run(run.run_id)
    source = redis_cluster.owner(probe)
    target = next(p for p in redis_cluster.primaries if p is not source)
    await asyncio.to_thread(redis_cluster.move_slot, probe, target)

    result = await b.cancel_session("app", "u", "s", timeout=WAIT)
    assert result.outcome is Outcome.CANCELLED
    await run.done()
    assert redis_cluster.owner(keys_of(a).channel(a.node_id)) is target
    await eventually(lambda: _listening_on(redis_cluster, a))  # resubscribed on the new owner
    second = await LoopingRun(a).start()
    assert (await b.cancel(second.run_id, timeout=WAIT)).outcome is Outcome.CANCELLED
    await second.done()


async def test_shard_failover_mid_run(
    redis_cluster: Cluster, on_cluster: Callable[..., Awaitable[CancelBus]]
) -> None:
    a, b = await on_cluster(), await on_cluster()
    run = await LoopingRun(a).start()
    primary = redis_cluster.owner(keys_of(a).run(run.run_id))
    t0 = time.monotonic()
    await asyncio.to_thread(redis_cluster.fail_over, primary)
    result = await _cancel_until_answered(b, run.run_id)
    elapsed = time.monotonic() - t0
    if result.outcome is Outcome.STOPPING:  # recorded in the 2 s; its message may have died with
        # the old primary's connections: the owner's sweep delivers it (the fresh-clone CI saw it)
        final = await b.wait(run.run_id, timeout=WAIT)
        assert final is not None and final.status is RunStatus.CANCELLED, final
    else:
        assert result.outcome is Outcome.CANCELLED, result
    await run.done()
    print(f"shard failover: first cross-node cancel confirmed {elapsed:.2f}s after the kill")


async def test_namespaces_on_different_shards_serve_side_by_side(
    redis_cluster: Cluster, on_cluster: Callable[..., Awaitable[CancelBus]]
) -> None:
    namespaces = _namespaces_on_distinct_shards(redis_cluster, 2)
    owners = set()
    for namespace in namespaces:
        a, b = await on_cluster(namespace=namespace), await on_cluster(namespace=namespace)
        run = await LoopingRun(a).start()
        owners.add(redis_cluster.owner(keys_of(a).run(run.run_id)).port)
        assert (await b.cancel(run.run_id, timeout=WAIT)).outcome is Outcome.CANCELLED
        await run.done()
        assert {n.node_id for n in await b.list_nodes()} == {a.node_id, b.node_id}
    assert len(owners) == 2


def _namespaces_on_distinct_shards(cluster: Cluster, count: int) -> list[str]:
    chosen: dict[int, str] = {}
    while len(chosen) < count:
        namespace = f"tenant-{uuid.uuid4().hex[:6]}"
        port = cluster.owner(f"cb:{{{namespace}}}:x").port
        chosen.setdefault(port, namespace)
    return list(chosen.values())


async def _listening_on(cluster: Cluster, bus: CancelBus) -> bool:
    channel = keys_of(bus).channel(bus.node_id)
    try:
        owner = cluster.client(cluster.owner(channel))
        return bool(bus.ready) and channel in owner.execute_command("PUBSUB", "SHARDCHANNELS")
    except redis.RedisError:
        return False


async def _cancel_until_answered(bus: CancelBus, run_id: str) -> Any:
    """Cancel, again while Redis is failing over (each call answers within its timeout)."""
    async with asyncio.timeout(60):
        while True:
            try:
                result = await bus.cancel(run_id, timeout=2)
            except Exception:  # BusUnavailable while there is no primary
                await asyncio.sleep(0.1)
                continue
            if result.outcome is not Outcome.NOT_FOUND:
                return result
            await asyncio.sleep(0.1)


# -- Sentinel ----------------------------------------------------------------------------------


async def test_sentinel_failover_cancels_before_during_and_after(
    sentinel_group: SentinelGroup,
) -> None:
    buses: list[CancelBus] = []
    factory = _factory(sentinel_group.url, buses)
    try:
        a, b = await factory(), await factory()
        before, during, after = [await LoopingRun(a).start() for _ in range(3)]
        assert (await b.cancel(before.run_id, timeout=WAIT)).outcome is Outcome.CANCELLED
        await before.done()

        old_primary = sentinel_group.current_primary_port()
        accepted = await b.cancel(during.run_id, wait=False)  # then the primary dies
        sentinel_group.primary.kill()
        t0 = time.monotonic()
        result = await _cancel_until_answered(b, after.run_id)
        first_cancel = time.monotonic() - t0
        assert result.outcome is Outcome.CANCELLED, result
        assert sentinel_group.current_primary_port() != old_primary
        await after.done()
        assert accepted.outcome is Outcome.STOPPING
        await during.done()  # the cancel accepted as the primary died is honoured too
        final = await b.wait(during.run_id, timeout=WAIT)  # its finish may wait in the outbox
        assert final is not None and final.status is RunStatus.CANCELLED
        print(
            f"sentinel failover: first cross-node cancel confirmed {first_cancel:.2f}s after "
            "the primary died"
        )
    finally:
        for bus in buses:
            await bus.close(cancel_timeout=2)


async def test_namespace_acl_user_on_a_cluster(redis_cluster: Cluster) -> None:
    namespace = f"acl-{uuid.uuid4().hex[:6]}"
    user, password = f"u-{namespace}", uuid.uuid4().hex
    rules = KeySpace(namespace).acl_rules().split()
    for server in redis_cluster.servers:  # ACLs are per node
        redis_cluster.client(server).execute_command(
            "ACL", "SETUSER", user, "on", f">{password}", *rules
        )
    url = redis_cluster.url.replace("://", f"://{user}:{password}@")
    buses: list[CancelBus] = []
    try:
        factory = _factory(url, buses)
        a, b = await factory(namespace=namespace), await factory(namespace=namespace)
        run = await LoopingRun(a, relay=True).start()
        assert (await b.cancel(run.run_id, timeout=WAIT)).outcome is Outcome.CANCELLED
        await run.done()
        assert [e.type async for e in b.follow(run.run_id, from_start=True)][-1] == "run.finished"
        assert len(await b.list_runs(status="all")) == 1
    finally:
        for bus in buses:
            await bus.close(cancel_timeout=2)
        for server in redis_cluster.servers:
            redis_cluster.client(server).execute_command("ACL", "DELUSER", user)
