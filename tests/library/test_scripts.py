"""Each Lua script alone against a real server, including being called twice (a retried call
after a lost reply must change nothing)."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time
import uuid
from typing import Any

import pytest
import redis.asyncio as aioredis

from cancel_bus import RunExists
from cancel_bus._batcher import MAX_CALLS, MAX_IN_FLIGHT, ScriptBatcher
from cancel_bus._keys import ACL_COMMANDS, KEY_TEMPLATES, KeySpace
from cancel_bus._scripts import (
    ALL_SCRIPTS,
    BATCH_HEAD,
    BATCH_TAIL,
    EVENTS_MAX,
    MAX_TOMBSTONES,
    PRELUDE,
)
from cancel_bus._store import CancelOrder, Finish, RunStore
from cancel_bus._types import CancelMode, RunStatus, StopCause

from ..helpers import spawn

LEASE = 30.0


CALLER = "caller"  # the node that asks for cancels (a live one: else Redis lost data lately)


@pytest.fixture
async def store(raw_redis: aioredis.Redis, namespace: str) -> RunStore:
    store = RunStore(
        raw_redis, KeySpace(namespace), retention=3600, pub_command="PUBLISH", spawn=spawn
    )
    await _node(store, CALLER)
    return store


async def _node(store: RunStore, node_id: str = "n1") -> str:
    epoch = uuid.uuid4().hex[:16]
    code, _ = await store.register_node(node_id, LEASE, "test", epoch, restore=False)
    assert code == "ok"
    return epoch


async def _start(
    store: RunStore, run_id: str, node: str, epoch: str, session: tuple[str, str, str] | None = None
) -> None:
    code, run, _ = await store.start_run(run_id, node, epoch, session, None, False)
    assert code == "ok" and run is not None


async def _finish(
    store: RunStore, run_id: str, node: str, epoch: str, status: RunStatus = RunStatus.SUCCEEDED
) -> tuple[str, str, str]:
    return await store.finish_run(_finish_of(run_id, epoch, node_id=node, status=status))


async def _cancel(
    store: RunStore,
    run_id: str,
    mode: CancelMode = CancelMode.CHECKPOINT,
    reason: str = "why",
    waiter: str = "",
) -> tuple[str, object, int]:
    order = CancelOrder(f"run:{run_id}", run_id, None, mode, reason, "tester", StopCause.USER)
    answer = await store.request_cancel(order, waiter=waiter, caller=CALLER)
    return answer.code, answer.run, answer.receivers


def _body(script: str) -> str:
    """One call of a batched script (see ``_scripts.BATCH_HEAD``)."""
    text = script.split("\n", 1)[1]  # after the flags
    return text.removeprefix(PRELUDE + BATCH_HEAD).removesuffix(BATCH_TAIL)


def test_every_script_names_its_keys_and_argv_as_locals_at_the_top() -> None:
    for name, script in ALL_SCRIPTS.items():
        shebang, text = script.split("\n", 1)
        assert shebang.startswith("#!lua"), name  # flags declared: refused whole, or run whole
        assert text.startswith(PRELUDE + BATCH_HEAD) and text.endswith(BATCH_TAIL), name
        lines = _body(script).strip().splitlines()
        assert lines[0].startswith("local ") and "KEYS[" in lines[0], name
        assert all("KEYS[" not in line for line in lines[1:]), name
        argv_lines = [line for line in lines if "ARGV[" in line]
        assert argv_lines, name
        assert all(line.startswith(("local ", "  ARGV[")) for line in argv_lines), name


async def test_register_node_twice_refuses_a_live_incarnation(store: RunStore) -> None:
    await _node(store)
    code, _ = await store.register_node("n1", LEASE, "test", "other", restore=False)
    assert code == "in_use"
    assert (await store.heartbeat("n1", "other", LEASE))[0] == "fenced"


async def test_register_node_after_expiry_reaps_the_old_incarnation_first(
    store: RunStore, raw_redis: aioredis.Redis
) -> None:
    epoch = await _node(store)
    await _start(store, "r1", "n1", epoch)
    await raw_redis.zadd(store.keys.nodes, {"n1": time.time() - 1})
    code, _ = await store.register_node("n1", LEASE, "test", "new-epoch", restore=False)
    assert code == "ok"
    run = await store.get_run("r1")
    assert run is not None and run.status is RunStatus.FAILED and run.end_reason == "owner_lost"
    assert await _finish(store, "r1", "n1", epoch) == ("done", "failed", "")
    assert await _finish(store, "r1", "n1", "new-epoch") == ("done", "failed", "")


async def test_register_node_restores_an_incarnation_only_if_redis_forgot_it(
    store: RunStore, raw_redis: aioredis.Redis
) -> None:
    epoch = await _node(store)
    assert (await store.register_node("n1", LEASE, "test", epoch, restore=True))[0] == "ok"
    await raw_redis.zadd(store.keys.nodes, {"n1": time.time() - 1})  # expired: fenced
    assert (await store.heartbeat("n1", epoch, LEASE))[0] == "fenced"
    restored = await store.register_node("n1", LEASE, "test", epoch, restore=True)
    assert restored[0] == "fenced"  # Redis still knows the incarnation was fenced
    await raw_redis.delete(store.keys.node("n1"))
    await raw_redis.zrem(store.keys.nodes, "n1")  # now Redis forgot it
    restored = await store.register_node("n1", LEASE, "test", epoch, restore=True)
    assert restored[0] == "ok"
    assert (await store.heartbeat("n1", epoch, LEASE))[0] == "ok"


async def test_heartbeat_ok_fenced_missing(store: RunStore, raw_redis: aioredis.Redis) -> None:
    epoch = await _node(store)
    code, _, runs = await store.heartbeat("n1", epoch, LEASE)
    assert (code, runs) == ("ok", 0)
    assert (await store.heartbeat("n1", epoch, LEASE))[0] == "ok"  # twice: still fine
    assert (await store.heartbeat("n1", "999", LEASE))[0] == "fenced"  # wrong incarnation
    await raw_redis.zadd(store.keys.nodes, {"n1": time.time() - 1})
    assert (await store.heartbeat("n1", epoch, LEASE))[0] == "fenced"  # expired = dead
    assert (await store.heartbeat("n1", epoch, LEASE))[0] == "fenced"  # and stays dead
    assert (await store.heartbeat("ghost", "1", LEASE))[0] == "missing"


async def test_start_run_is_idempotent_and_guards_ids_and_sessions(store: RunStore) -> None:
    epoch = await _node(store)
    session = ("app", "u", "s")
    await _start(store, "r1", "n1", epoch, session)
    code, run, _ = await store.start_run("r1", "n1", epoch, session, None, False)
    assert code == "ok" and run is not None  # a retried call
    code, _, holder = await store.start_run("r2", "n1", epoch, session, None, False)
    assert (code, holder) == ("session_busy", "r1")
    epoch2 = await _node(store, "n2")
    code, run, _ = await store.start_run("r1", "n2", epoch2, None, None, False)
    assert code == "exists" and run is not None and run["owner"] == "n1"
    code, _, _ = await store.start_run("r3", "n1", "999", None, None, False)
    assert code == "fenced"


async def test_request_cancel_first_wins_and_is_idempotent(
    store: RunStore, raw_redis: aioredis.Redis
) -> None:
    epoch = await _node(store)
    await _start(store, "r1", "n1", epoch)
    first = await _cancel(store, "r1", reason="first", waiter="w1")
    second = await _cancel(store, "r1", reason="second", waiter="w2")
    assert first[0] == second[0] == "stopping"
    run = second[1]
    assert run.cancel_reason == "first"  # type: ignore[attr-defined]
    assert await raw_redis.smembers(store.keys.waiters("r1")) == {"w1", "w2"}
    assert await store.pending_cancels("n1") == {"r1": CancelMode.CHECKPOINT}
    events = [e.type for e in await store.events("r1")]
    assert events == ["run.started", "run.cancel_requested"]
    await _cancel(store, "r1", mode=CancelMode.IMMEDIATE)
    await _cancel(store, "r1", mode=CancelMode.AFTER_TURN)  # weaker: no change
    events = [e.type for e in await store.events("r1")]
    assert events == ["run.started", "run.cancel_requested", "run.cancel_escalated"]
    assert await store.pending_cancels("n1") == {"r1": CancelMode.IMMEDIATE}


async def test_request_cancel_publishes_to_the_owner_channel_only(
    store: RunStore, raw_redis: aioredis.Redis
) -> None:
    epoch = await _node(store)
    await _node(store, "n2")
    await _start(store, "r1", "n1", epoch)
    pubsub = raw_redis.pubsub()
    await pubsub.subscribe(store.keys.channel("n1"), store.keys.channel("n2"))
    code, _, receivers = await _cancel(store, "r1")
    assert (code, receivers) == ("stopping", 1)
    seen = []
    for _ in range(10):
        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.2)
        if message:
            seen.append(message["channel"])
    assert seen == [store.keys.channel("n1")]
    await pubsub.aclose()


async def test_finish_applies_once_and_converts_success_after_cancel(
    store: RunStore, raw_redis: aioredis.Redis
) -> None:
    epoch = await _node(store)
    await _start(store, "r1", "n1", epoch, ("app", "u", "s"))
    await _cancel(store, "r1")
    assert await _finish(store, "r1", "n1", epoch) == ("ok", "cancelled", "completed")
    assert await _finish(store, "r1", "n1", epoch) == ("ok", "cancelled", "completed")  # retried
    assert await _finish(store, "r1", "n1", epoch, RunStatus.FAILED) == (
        "ok",
        "cancelled",
        "completed",
    )
    events = [e.type for e in await store.events("r1")]
    assert events.count("run.finished") == 1
    keys = store.keys
    assert await raw_redis.zscore(keys.active, "r1") is None
    assert await raw_redis.zscore(keys.finished, "r1") is not None
    assert not await raw_redis.exists(keys.session("app", "u", "s"))
    assert not await raw_redis.sismember(keys.node_runs("n1"), "r1")
    assert await store.pending_cancels("n1") == {}
    assert 0 < await raw_redis.pttl(keys.run("r1")) <= 3600 * 1000
    assert 0 < await raw_redis.pttl(keys.events("r1")) <= 3600 * 1000


async def test_finish_by_another_incarnation_is_fenced(store: RunStore) -> None:
    epoch = await _node(store)
    epoch2 = await _node(store, "n2")
    await _start(store, "r1", "n1", epoch)
    assert (await _finish(store, "r1", "n2", epoch2))[0] == "fenced"
    assert (await _finish(store, "r1", "n1", "999"))[0] == "fenced"
    run = await store.get_run("r1")
    assert run is not None and run.status is RunStatus.RUNNING


async def test_finish_recreates_a_record_redis_lost(store: RunStore) -> None:
    epoch = await _node(store)
    record = {
        "created_at": "1.000000",
        "started_at": "1.000000",
        "app_name": "a",
        "user_id": "u",
        "session_id": "s",
    }
    code, status, _ = await store.finish_run(
        _finish_of("lost", epoch, output="o", record=lambda: record)
    )
    assert (code, status) == ("ok", "succeeded")
    run = await store.get_run("lost")
    assert run is not None and run.status is RunStatus.SUCCEEDED and run.app_name == "a"
    assert [e.type for e in await store.events("lost")] == [
        "run.started",
        "run.reasserted",
        "run.finished",
    ]


async def test_reap_resolves_runs_of_expired_nodes_only(
    store: RunStore, raw_redis: aioredis.Redis
) -> None:
    e1 = await _node(store, "n1")
    e2 = await _node(store, "n2")
    await _start(store, "r1", "n1", e1)
    await _start(store, "r2", "n1", e1)
    await _start(store, "r3", "n2", e2)
    await _cancel(store, "r2", waiter="w")
    await raw_redis.zadd(store.keys.nodes, {"n1": time.time() - 1})
    assert await store.reap(1) == (1, 0, True)  # bounded work per call
    assert await store.reap(100) == (1, 1, False)
    assert await store.reap(100) == (0, 0, False)  # nothing left: twice is a no-op
    r1, r2, r3 = [await store.get_run(i) for i in ("r1", "r2", "r3")]
    assert r1 is not None and r1.status is RunStatus.FAILED and r1.end_reason == "owner_lost"
    assert r2 is not None and r2.status is RunStatus.CANCELLED and r2.end_reason == "owner_lost"
    assert r3 is not None and r3.status is RunStatus.RUNNING
    assert await raw_redis.zscore(store.keys.nodes, "n1") is None
    assert await raw_redis.hget(store.keys.node("n1"), "state") == "dead"


async def test_sync_run_writes_only_for_the_owner_of_an_active_run(
    store: RunStore, raw_redis: aioredis.Redis
) -> None:
    from cancel_bus._store import SyncItem

    epoch = await _node(store)
    await _start(store, "r1", "n1", epoch)
    item = SyncItem("r1", "tool:search", "", [("output", "1.0", '{"text":"hi"}')])
    await store.sync_runs("n1", epoch, [item])
    await store.sync_runs("n2", epoch, [SyncItem("r1", "hijacked", "", [])])
    run = await store.get_run("r1")
    assert run is not None and run.phase == "tool:search"
    assert await raw_redis.xlen(store.keys.relay("r1")) == 1
    await _finish(store, "r1", "n1", epoch)
    await store.sync_runs("n1", epoch, [SyncItem("r1", "after", "", [("x", "1.0", "{}")])])
    run = await store.get_run("r1")
    assert run is not None and run.phase == "tool:search"


async def test_set_waiting_and_add_waiter(store: RunStore, raw_redis: aioredis.Redis) -> None:
    epoch = await _node(store)
    await _start(store, "r1", "n1", epoch)
    assert await store.set_waiting("r1", "n1", epoch, RunStatus.WAITING) == ("ok", "")
    assert await store.set_waiting("r1", "n1", epoch, RunStatus.WAITING) == ("ok", "")
    assert await store.add_waiter("r1", "w") == "waiting"
    assert await store.set_waiting("r1", "n1", epoch, RunStatus.RUNNING) == ("ok", "")
    await _cancel(store, "r1")
    assert (await store.set_waiting("r1", "n1", epoch, RunStatus.WAITING))[0] == "cancel_pending"
    assert await store.add_waiter("nope", "w") == ""


async def test_reassert_run_recreates_then_confirms(store: RunStore) -> None:
    epoch = await _node(store)
    record = {
        "created_at": "1.500000",
        "status": "running",
        "cancel_mode": "checkpoint",
        "cancel_requested_at": "1.600000",
    }
    assert await store.reassert_run("r9", "n1", epoch, record) == ("recreated", "")
    assert await store.reassert_run("r9", "n1", epoch, record) == ("ok", "")
    run = await store.get_run("r9")
    assert run is not None and run.status is RunStatus.RUNNING and run.stopping
    assert await store.pending_cancels("n1") == {"r9": CancelMode.CHECKPOINT}


async def test_event_streams_are_capped(store: RunStore, raw_redis: aioredis.Redis) -> None:
    epoch = await _node(store)
    await _start(store, "r1", "n1", epoch)
    for _ in range(EVENTS_MAX + 300):
        await store.set_waiting("r1", "n1", epoch, RunStatus.WAITING)
        await store.set_waiting("r1", "n1", epoch, RunStatus.RUNNING)
    assert await raw_redis.llen(store.keys.events("r1")) == EVENTS_MAX


async def test_a_namespace_wide_silence_costs_a_lease_one_interval_at_most(
    store: RunStore, raw_redis: aioredis.Redis
) -> None:
    e1, e2 = await _node(store, "n1"), await _node(store, "n2")
    await _start(store, "r1", "n1", e1)
    clock = await raw_redis.hgetall(store.keys.lease_clock)
    silence = float(clock["last"]) - 1000  # as if no heartbeat had reached Redis for 1000 s
    await raw_redis.hset(store.keys.lease_clock, "last", f"{silence:.6f}")
    assert (await store.heartbeat("n2", e2, LEASE))[0] == "ok"
    assert await store.reap(100) == (0, 0, False)  # n1 is not reaped...
    assert (await store.heartbeat("n1", e1, LEASE))[0] == "ok"  # ... nor fenced
    after = await raw_redis.hgetall(store.keys.lease_clock)
    advanced = float(after["at"]) - float(clock["at"])
    assert LEASE / 3 <= advanced < LEASE / 3 + 1  # the silence counted one interval
    nodes = {node.node_id: node for node in await store.list_nodes(time.time())}
    assert not nodes["n1"].expired
    # a node that stays silent while others beat does expire, on the lease clock
    await raw_redis.zadd(store.keys.nodes, {"n1": float(after["at"]) - 1})
    assert await store.reap(100) == (1, 1, False)


async def test_a_cancel_sent_again_after_its_answer_was_lost_answers_for_what_it_did(
    store: RunStore,
) -> None:
    """redis-py repeats a call whose connection died before the answer came back: the repeat
    must not answer from the state the first send created (the chaos suite's long profile saw a
    session cancel recorded, then answered not_found once the run it cancelled had ended)."""
    epoch = await _node(store)
    session = ("app", "u", "s")

    async def session_cancel(request_id: str) -> str:
        order = CancelOrder(
            "session:app:u:s",
            None,
            session,
            CancelMode.CHECKPOINT,
            "stop",
            "tester",
            StopCause.USER,
        )
        answer = await store.request_cancel(order, waiter="", caller=CALLER, request_id=request_id)
        return answer.code

    await _start(store, "r1", "n1", epoch, session)
    assert await session_cancel("q1") == "stopping"
    assert await session_cancel("q1") == "stopping"  # the same request, the run still going
    code, status, _ = await _finish(store, "r1", "n1", epoch, RunStatus.CANCELLED)
    assert (code, status) == ("ok", "cancelled")
    assert await session_cancel("q1") == "cancelled"  # not "not_found": it was this request's
    assert await session_cancel("q2") == "not_found"  # a new request finds no active run
    await _start(store, "r2", "n1", epoch, session)
    assert await session_cancel("q2") == "not_found"  # nor does its repeat take the next run
    record = await store.get_run("r2")
    assert record is not None and record.cancel_requested_at is None


async def test_a_run_is_recorded_cancelled_only_if_someone_asked(store: RunStore) -> None:
    epoch = await _node(store)
    for run_id in ("plain", "fenced", "unreachable", "drained", "asked"):
        await _start(store, run_id, "n1", epoch)
    await _cancel(store, "asked")

    async def finish(run_id: str, cause: StopCause | None) -> tuple[str, str, str]:
        stopped = RunStatus.CANCELLED  # the code stopped as for a cancel
        return await store.finish_run(_finish_of(run_id, epoch, status=stopped, stop_cause=cause))

    assert await finish("plain", None) == ("ok", "failed", "error")
    assert await finish("fenced", StopCause.LEASE_LOST) == ("ok", "failed", "lease_lost")
    unreachable = await finish("unreachable", StopCause.REDIS_UNREACHABLE)
    assert unreachable == ("ok", "failed", "redis_unreachable")
    assert await finish("drained", StopCause.NODE_SHUTDOWN) == ("ok", "cancelled", "cancelled")
    assert await finish("asked", StopCause.LEASE_LOST) == ("ok", "cancelled", "lease_lost")
    for run_id in ("plain", "fenced", "unreachable"):
        run = await store.get_run(run_id)
        assert run is not None and run.cancel_requested_at is None
    drained = await store.get_run("drained")
    assert drained is not None and drained.cancel_reason == "node_shutdown"
    assert drained.requested_by == "n1" and drained.cancel_requested_at is not None
    assert "run.cancel_requested" in [e.type for e in await store.events("drained")]


async def test_a_queued_run_is_claimed_only_by_its_own_session(store: RunStore) -> None:
    epoch = await _node(store)
    queued = await store.enqueue_run("q1", ("app", "alice", "s"), {"secret": 1})
    assert queued.status is RunStatus.QUEUED
    for stranger in (("app", "bob", "s"), ("app", "alice", "other"), ("other", "alice", "s")):
        code, run, _ = await store.start_run("q1", "n1", epoch, stranger, None, False)
        assert code == "exists" and run is not None and run["status"] == "queued"
    code, run, _ = await store.start_run("q1", "n1", epoch, ("app", "alice", "s"), None, False)
    assert code == "ok" and run is not None and run["status"] == "running"
    code, _, _ = await store.start_run("q1", "n1", epoch, ("app", "bob", "s"), None, False)
    assert code == "exists"  # running here: not bob's either
    assert (await store.enqueue_run("q2", None, None)).status is RunStatus.QUEUED
    code, _, _ = await store.start_run("q2", "n1", epoch, ("app", "bob", "s"), None, False)
    assert code == "exists"  # a run queued without a session is not a user's to claim
    code, _, _ = await store.start_run("q2", "n1", epoch, None, None, False)
    assert code == "ok"  # the library claims it by id alone


async def test_the_scripts_name_every_key_as_keyspace_does(
    store: RunStore, raw_redis: aioredis.Redis
) -> None:
    ids = {
        "run_id": "r-1",
        "node_id": "n.1",
        "app_name": "app",
        "user_id": "u@x",
        "session_id": "s=1",
        "tombstone_id": "t1",
        "request_id": "q1",
    }
    for kind, template in KEY_TEMPLATES.items():
        fields = re.findall(r"{(\w+)}", template)
        args = [ids[field] for field in fields]
        lua = await raw_redis.eval(  # type: ignore[misc]
            f"{PRELUDE}\nreturn key_{kind}(unpack(ARGV))", 1, store.keys.active, *args
        )
        accessor = getattr(store.keys, kind)
        python = accessor(*args) if callable(accessor) else accessor
        assert lua == python == store.keys.name(kind, **{f: ids[f] for f in fields}), kind
    for name, text in ALL_SCRIPTS.items():  # no script builds a name of its own
        assert "P .." not in _body(text), name
    built = [line for line in PRELUDE.splitlines() if "P .." in line]
    assert all(line.startswith("local function key_") for line in built)
    assert len(built) == len(KEY_TEMPLATES)


async def test_calls_made_together_leave_in_few_bounded_batches(
    store: RunStore, raw_redis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    epoch = await _node(store)
    sending = most = 0
    send = ScriptBatcher._send

    async def counted(self: ScriptBatcher, script: Any, batch: list[Any]) -> None:
        nonlocal sending, most
        sending += 1
        most = max(most, sending)
        try:
            await send(self, script, batch)
        finally:
            sending -= 1

    monkeypatch.setattr(ScriptBatcher, "_send", counted)
    before = await _evalsha_calls(raw_redis)
    calls = 3000
    answers = await asyncio.gather(
        *(store.start_run(f"r{i}", "n1", epoch, None, None, False) for i in range(calls))
    )
    assert [code for code, _, _ in answers] == ["ok"] * calls
    assert most <= MAX_IN_FLIGHT  # a burst is a queue, not a race for connections
    sent = await _evalsha_calls(raw_redis) - before
    assert sent <= calls // MAX_CALLS + MAX_IN_FLIGHT + 2  # one turn's calls share batches
    assert await raw_redis.scard(store.keys.node_runs("n1")) == calls


async def _evalsha_calls(redis: aioredis.Redis) -> int:
    stats = await redis.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


async def test_a_cancel_takes_its_turn_in_a_burst_of_finishes(
    store: RunStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    epoch = await _node(store)
    runs = MAX_IN_FLIGHT * MAX_CALLS * 2  # more than the batches in flight can carry
    for first in range(0, runs, 500):
        starts = (
            store.start_run(f"r{i}", "n1", epoch, None, None, False)
            for i in range(first, first + 500)
        )
        await asyncio.gather(*starts)
    order: list[str] = []
    send = ScriptBatcher._send

    async def recorded(self: ScriptBatcher, script: Any, batch: list[Any]) -> None:
        order.append(next(name for name, known in self._scripts.items() if known is script))
        await send(self, script, batch)

    monkeypatch.setattr(ScriptBatcher, "_send", recorded)
    finishes = asyncio.ensure_future(
        store.finish_runs([_finish_of(f"r{i}", epoch) for i in range(runs)])
    )
    while len(order) < MAX_IN_FLIGHT:  # the first batches are on their way, the rest queued
        await asyncio.sleep(0)
    code, _, _ = await _cancel(store, f"r{runs - 1}")  # queued behind them
    assert code in ("stopping", "already_finished")
    second_wave = order.index("finish_run", MAX_IN_FLIGHT)  # sent as the first ones came back
    assert "request_cancel" in order[second_wave : second_wave + 2], order
    answers = await finishes
    assert all(not isinstance(a, BaseException) and a[0] in ("ok", "done") for a in answers)


def _finish_of(run_id: str, epoch: str, **changes: Any) -> Finish:
    """A succeeded run's finish by node n1, as ``changes`` alter it."""
    finish = Finish(
        run_id=run_id,
        node_id="n1",
        epoch=epoch,
        status=RunStatus.SUCCEEDED,
        stop_cause=None,
        output="",
        output_truncated=False,
        error=None,
        phase=None,
        delivered_at=None,
        observed_at=None,
        record=dict,
    )
    return dataclasses.replace(finish, **changes)


async def test_a_tombstone_sent_again_is_laid_once_even_when_the_namespace_is_full(
    store: RunStore, raw_redis: aioredis.Redis
) -> None:
    """redis-py sends a script again when the connection dies before its answer came: the
    repeat must not answer "too many tombstones" for the one the first send laid."""

    async def lay(tombstone_id: str) -> bool:
        selector = {"user_id": "u"}
        return await store.add_tombstone(
            tombstone_id, selector, CancelMode.CHECKPOINT, None, None, StopCause.USER, 60
        )

    for n in range(MAX_TOMBSTONES - 1):
        assert await lay(f"t{n}")
    assert await lay("last")  # the namespace is now full
    laid = await raw_redis.hgetall(store.keys.tombstone("last"))
    assert not await lay("another")
    assert await lay("last")  # sent again: laid, as it was
    assert await raw_redis.zcard(store.keys.tombstones) == MAX_TOMBSTONES
    assert await raw_redis.hgetall(store.keys.tombstone("last")) == laid  # not laid anew


async def test_an_enqueue_sent_again_answers_with_the_run_it_queued(store: RunStore) -> None:
    """redis-py sends a script again when the connection dies before its answer came: the
    repeat of an enqueue that ran must not say the run exists (it does: the call made it)."""
    epoch = await _node(store)
    session = ("app", "u", "s")
    first = await store.enqueue_run("q1", session, {"k": 1}, request_id="call-1")
    again = await store.enqueue_run("q1", session, {"k": 1}, request_id="call-1")
    assert first.status is again.status is RunStatus.QUEUED and again.run_id == "q1"
    with pytest.raises(RunExists):  # another call for the same id is a conflict
        await store.enqueue_run("q1", session, {"k": 1}, request_id="call-2")
    code, _, _ = await store.start_run("q1", "n1", epoch, session, None, False)
    assert code == "ok"
    late = await store.enqueue_run("q1", session, {"k": 1}, request_id="call-1")
    assert late.status is RunStatus.RUNNING  # the run it queued, as it now stands


async def test_a_tombstone_lift_sent_again_answers_as_the_first(
    store: RunStore, raw_redis: aioredis.Redis
) -> None:
    laid = await store.add_tombstone(
        "t1", {"user_id": "u"}, CancelMode.CHECKPOINT, None, None, StopCause.USER, 60
    )
    assert laid
    assert await store.remove_tombstone("t1", request_id="call-1")
    assert await store.remove_tombstone("t1", request_id="call-1")  # sent again: lifted
    assert not await store.remove_tombstone("t1", request_id="call-2")  # not live any more
    assert await store.tombstones() == []  # what the lift keeps is not a tombstone
    assert 0 < await raw_redis.pttl(store.keys.tombstone("t1")) <= 120_000


def test_every_command_of_the_scripts_is_one_the_acl_rules_allow() -> None:
    """A command missing from ACL_COMMANDS fails only for a user confined by acl_rules()."""
    used: set[str] = set()
    for text in (PRELUDE, *ALL_SCRIPTS.values()):
        used |= {name.lower() for name in re.findall(r"redis\.p?call\(\s*'(\w+)'", text)}
    assert "hset" in used and "zcard" in used  # the pattern reads the scripts
    assert used <= set(ACL_COMMANDS), used - set(ACL_COMMANDS)
