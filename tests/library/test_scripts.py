"""Each Lua script alone against a real server, including being called twice (a retried call
after a lost reply must change nothing), and the named protocol between the two sides."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import time
import uuid
from importlib import resources
from typing import Any, get_args

import pytest
import redis.asyncio as aioredis

from cancel_bus import Fenced, RunCancelled, RunExists, SessionBusy
from cancel_bus._batcher import MAX_CALLS, MAX_IN_FLIGHT, ScriptBatcher, _Call
from cancel_bus._calls import ScriptCalls
from cancel_bus._keys import ACL_COMMANDS, KEY_TEMPLATES, KeySpace
from cancel_bus._protocol import CancelOrder, Code, Finish, Finished, Reasserted, SyncItem
from cancel_bus._reads import Reads
from cancel_bus._scripts import (
    ALL_SCRIPTS,
    EVENTS_MAX,
    MAX_TOMBSTONES,
    NAMES,
    PRELUDE,
    TABLES,
    source,
)
from cancel_bus._types import CancelMode, EndReason, RunStatus, StopCause

from ..helpers import calls_on

LEASE = 30.0
INTERVAL = LEASE / 5
CALLER = "caller"  # the node that asks for cancels (a live one: else Redis lost data lately)


@dataclasses.dataclass
class Store:
    """The script calls and the reads of one namespace, as a node holds them."""

    calls: ScriptCalls
    reads: Reads
    keys: KeySpace


@pytest.fixture
async def store(raw_redis: aioredis.Redis, namespace: str) -> Store:
    calls = calls_on(raw_redis, namespace)
    store = Store(calls, Reads(raw_redis, calls.keys), calls.keys)
    await _node(store, CALLER)
    return store


async def _node(store: Store, node_id: str = "n1") -> str:
    epoch = uuid.uuid4().hex[:16]
    code, _ = await store.calls.register_node(
        node_id, LEASE, INTERVAL, "test", epoch, restore=False
    )
    assert code is Code.OK
    return epoch


async def _beat(store: Store, node_id: str, epoch: str) -> Code:
    return (await store.calls.heartbeat(node_id, epoch, LEASE, INTERVAL))[0]


async def _start(
    store: Store, run_id: str, node: str, epoch: str, session: tuple[str, str, str] | None = None
) -> dict[str, str]:
    return await store.calls.start_run(run_id, node, epoch, session, None, False)


async def _finish(
    store: Store, run_id: str, node: str, epoch: str, status: RunStatus = RunStatus.SUCCEEDED
) -> Finished:
    return await store.calls.finish_run(_finish_of(run_id, epoch, node_id=node, status=status))


async def _cancel(
    store: Store,
    run_id: str,
    mode: CancelMode = CancelMode.CHECKPOINT,
    reason: str = "why",
    waiter: str = "",
) -> tuple[Code, Any, int]:
    order = CancelOrder(f"run:{run_id}", run_id, None, mode, reason, "tester", StopCause.USER)
    answer = await store.calls.request_cancel(order, waiter=waiter, caller=CALLER)
    return answer.code, answer.run, answer.receivers


async def _event_types(store: Store, run_id: str) -> list[str]:
    return [e.type for e in await store.reads.events(run_id)]


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


def _ok(status: str, end_reason: str) -> Finished:
    return Finished(Code.OK, status, end_reason)


# -- the protocol: one name on both sides ------------------------------------------------------


def _lua_files() -> dict[str, str]:
    return {name: source(name) for name in (*NAMES, "prelude")}


def test_every_script_declares_its_flags_and_reads_its_arguments_by_name() -> None:
    assert set(ALL_SCRIPTS) == set(NAMES)
    for name in NAMES:
        text = source(name)
        assert text.startswith("#!lua"), name  # flags declared: refused whole, or run whole
        assert "ARGV" not in text, name  # arguments by name (A.x), never by position
        assert set(re.findall(r"KEYS\[(\d+)\]", text)) <= {"1"}, name  # one key: one slot
    lua_files = resources.files("cancel_bus").joinpath("lua")
    listed = {entry.name.removesuffix(".lua") for entry in lua_files.iterdir()}
    assert listed == {*NAMES, "prelude"}  # no script on disk that is never loaded


def test_every_shared_name_the_lua_uses_has_its_one_python_definition() -> None:
    """A misspelt ``R.STAUTS`` is nil in Lua — a field silently never written. And no script
    spells a record or message field, an event type or a result code by hand."""
    defined = {table: {member.name for member in enum} for table, enum in TABLES.items()}
    by_hand = {member.value for table in ("R", "N", "T", "F", "E", "C") for member in TABLES[table]}
    values = {e.value for enum in (RunStatus, CancelMode, StopCause) for e in enum}
    values |= set(
        get_args(EndReason)
    )  # a status, a mode, a cause or an end reason may share a spelling with a field or code
    for name, text in _lua_files().items():
        code_lines = "\n".join(line.split("--", 1)[0] for line in text.splitlines())
        shadowed = [n for n in TABLES if re.search(rf"\blocal {n}\b", code_lines)]
        assert not shadowed, f"{name}.lua defines {shadowed} again"
        tables = "|".join(TABLES)
        for table, member in re.findall(rf"\b({tables})\.([A-Z_]+)\b", code_lines):
            assert member in defined[table], f"{name}.lua: {table}.{member} is not defined"
        literals = set(re.findall(r"'([a-z_.]+)'", code_lines))
        spelt = (literals & by_hand) - values
        assert not spelt, f"{name}.lua spells {spelt} by hand"


async def test_every_argument_a_script_reads_is_one_python_sends(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Calls every script through ``ScriptCalls`` and holds the names it sent (``A``) to the
    names the Lua reads: an argument read and never sent is nil; one sent and never read, dead."""
    sent: dict[str, set[str]] = {}
    of = _Call.of

    def recorded(keys: list[str], args: dict[str, Any], timeout: float | None) -> _Call:
        script = json.dumps(sorted(args))
        sent.setdefault(script, set()).update(args)
        return of(keys, args, timeout)

    monkeypatch.setattr(_Call, "of", staticmethod(recorded))
    epoch = await _node(store)
    await _beat(store, "n1", epoch)
    await _start(store, "r1", "n1", epoch, ("a", "u", "s"))
    await store.calls.enqueue_run("q1", None, None)
    await store.calls.set_waiting("r1", "n1", epoch, waiting=True)
    await store.calls.add_waiter("r1", CALLER)
    await store.calls.sync_runs("n1", epoch, [SyncItem("r1", "p", "", [])])
    await store.calls.reassert_run("r1", "n1", epoch, {})
    await store.calls.select_runs({"user_id": "u"})
    await store.calls.add_tombstone("t", {"user_id": "x"}, CancelMode.CHECKPOINT, None, None,
                                    StopCause.USER, 5)  # fmt: skip
    await store.calls.remove_tombstone("t")
    await _cancel(store, "r1")
    await _finish(store, "r1", "n1", epoch)
    await store.calls.reap(10)
    await store.calls.leave_node("n1", epoch)
    read = {name: set(re.findall(r"\bA\.(\w+)", source(name))) for name in NAMES}
    matched: set[str] = set()
    for names in sent.values():
        script = next((n for n in NAMES if read[n] == names), None)
        assert script is not None, f"arguments {sorted(names)} match no script's reads: {read}"
        matched.add(script)
    assert matched == set(NAMES)


# -- nodes ---------------------------------------------------------------------------------


async def test_register_node_twice_refuses_a_live_incarnation(store: Store) -> None:
    await _node(store)
    code, _ = await store.calls.register_node("n1", LEASE, INTERVAL, "test", "other", False)
    assert code is Code.IN_USE
    assert await _beat(store, "n1", "other") is Code.FENCED


async def test_register_node_after_expiry_reaps_the_old_incarnation_first(
    store: Store, raw_redis: aioredis.Redis
) -> None:
    epoch = await _node(store)
    await _start(store, "r1", "n1", epoch)
    await raw_redis.zadd(store.keys.nodes, {"n1": time.time() - 1})
    code, _ = await store.calls.register_node("n1", LEASE, INTERVAL, "test", "new-epoch", False)
    assert code is Code.OK
    run = await store.reads.get_run("r1")
    assert run is not None and run.status is RunStatus.FAILED and run.end_reason == "owner_lost"
    assert await _finish(store, "r1", "n1", epoch) == Finished(Code.DONE, "failed")
    assert await _finish(store, "r1", "n1", "new-epoch") == Finished(Code.DONE, "failed")


async def test_register_node_restores_an_incarnation_only_if_redis_forgot_it(
    store: Store, raw_redis: aioredis.Redis
) -> None:
    epoch = await _node(store)
    register = store.calls.register_node
    assert (await register("n1", LEASE, INTERVAL, "test", epoch, restore=True))[0] is Code.OK
    await raw_redis.zadd(store.keys.nodes, {"n1": time.time() - 1})  # expired: fenced
    assert await _beat(store, "n1", epoch) is Code.FENCED
    restored = await register("n1", LEASE, INTERVAL, "test", epoch, restore=True)
    assert restored[0] is Code.FENCED  # Redis still knows the incarnation was fenced
    await raw_redis.delete(store.keys.node("n1"))
    await raw_redis.zrem(store.keys.nodes, "n1")  # now Redis forgot it
    restored = await register("n1", LEASE, INTERVAL, "test", epoch, restore=True)
    assert restored[0] is Code.OK
    assert await _beat(store, "n1", epoch) is Code.OK


async def test_heartbeat_ok_fenced_missing(store: Store, raw_redis: aioredis.Redis) -> None:
    epoch = await _node(store)
    code, _, runs = await store.calls.heartbeat("n1", epoch, LEASE, INTERVAL)
    assert (code, runs) == (Code.OK, 0)
    assert await _beat(store, "n1", epoch) is Code.OK  # twice: still fine
    assert await _beat(store, "n1", "999") is Code.FENCED  # wrong incarnation
    await raw_redis.zadd(store.keys.nodes, {"n1": time.time() - 1})
    assert await _beat(store, "n1", epoch) is Code.FENCED  # expired = dead
    assert await _beat(store, "n1", epoch) is Code.FENCED  # and stays dead
    assert await _beat(store, "ghost", "1") is Code.MISSING


# -- runs ----------------------------------------------------------------------------------


async def test_start_run_is_idempotent_and_guards_ids_and_sessions(store: Store) -> None:
    epoch = await _node(store)
    session = ("app", "u", "s")
    first = await _start(store, "r1", "n1", epoch, session)
    again = await _start(store, "r1", "n1", epoch, session)  # a retried call
    assert first["status"] == again["status"] == "running"
    with pytest.raises(SessionBusy) as busy:
        await _start(store, "r2", "n1", epoch, session)
    assert busy.value.active_run_id == "r1"
    epoch2 = await _node(store, "n2")
    with pytest.raises(RunExists):
        await _start(store, "r1", "n2", epoch2)
    with pytest.raises(Fenced):
        await _start(store, "r3", "n1", "999")


async def test_request_cancel_first_wins_and_is_idempotent(
    store: Store, raw_redis: aioredis.Redis
) -> None:
    epoch = await _node(store)
    await _start(store, "r1", "n1", epoch)
    first = await _cancel(store, "r1", reason="first", waiter="w1")
    second = await _cancel(store, "r1", reason="second", waiter="w2")
    assert first[0] is second[0] is Code.STOPPING
    assert second[1].cancel_reason == "first"
    assert await raw_redis.smembers(store.keys.waiters("r1")) == {"w1", "w2"}
    assert await store.reads.pending_cancels("n1") == {"r1": CancelMode.CHECKPOINT}
    assert await _event_types(store, "r1") == ["run.started", "run.cancel_requested"]
    await _cancel(store, "r1", mode=CancelMode.IMMEDIATE)
    await _cancel(store, "r1", mode=CancelMode.AFTER_TURN)  # weaker: no change
    assert await _event_types(store, "r1") == [
        "run.started",
        "run.cancel_requested",
        "run.cancel_escalated",
    ]
    assert await store.reads.pending_cancels("n1") == {"r1": CancelMode.IMMEDIATE}


async def test_request_cancel_publishes_to_the_owner_channel_only(
    store: Store, raw_redis: aioredis.Redis
) -> None:
    epoch = await _node(store)
    await _node(store, "n2")
    await _start(store, "r1", "n1", epoch)
    pubsub = raw_redis.pubsub()
    await pubsub.subscribe(store.keys.channel("n1"), store.keys.channel("n2"))
    code, _, receivers = await _cancel(store, "r1")
    assert (code, receivers) == (Code.STOPPING, 1)
    seen = []
    for _ in range(10):
        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.2)
        if message:
            seen.append(message["channel"])
    assert seen == [store.keys.channel("n1")]
    await pubsub.aclose()


async def test_finish_applies_once_and_converts_success_after_cancel(
    store: Store, raw_redis: aioredis.Redis
) -> None:
    epoch = await _node(store)
    await _start(store, "r1", "n1", epoch, ("app", "u", "s"))
    await _cancel(store, "r1")
    assert await _finish(store, "r1", "n1", epoch) == _ok("cancelled", "completed")
    assert await _finish(store, "r1", "n1", epoch) == _ok("cancelled", "completed")  # retried
    failed = await _finish(store, "r1", "n1", epoch, RunStatus.FAILED)
    assert failed == _ok("cancelled", "completed")
    assert (await _event_types(store, "r1")).count("run.finished") == 1
    keys = store.keys
    assert await raw_redis.zscore(keys.active, "r1") is None
    assert await raw_redis.zscore(keys.finished, "r1") is not None
    assert not await raw_redis.exists(keys.session("app", "u", "s"))
    assert not await raw_redis.sismember(keys.node_runs("n1"), "r1")
    assert await store.reads.pending_cancels("n1") == {}
    assert 0 < await raw_redis.pttl(keys.run("r1")) <= 3600 * 1000
    assert 0 < await raw_redis.pttl(keys.events("r1")) <= 3600 * 1000


async def test_finish_by_another_incarnation_is_fenced(store: Store) -> None:
    epoch = await _node(store)
    epoch2 = await _node(store, "n2")
    await _start(store, "r1", "n1", epoch)
    assert (await _finish(store, "r1", "n2", epoch2)).code is Code.FENCED
    assert (await _finish(store, "r1", "n1", "999")).code is Code.FENCED
    run = await store.reads.get_run("r1")
    assert run is not None and run.status is RunStatus.RUNNING


async def test_finish_recreates_a_record_redis_lost(store: Store) -> None:
    epoch = await _node(store)
    record = {
        "created_at": "1.000000",
        "started_at": "1.000000",
        "app_name": "a",
        "user_id": "u",
        "session_id": "s",
    }
    finished = await store.calls.finish_run(
        _finish_of("lost", epoch, output="o", record=lambda: record)
    )
    assert (finished.code, finished.status) == (Code.OK, "succeeded")
    run = await store.reads.get_run("lost")
    assert run is not None and run.status is RunStatus.SUCCEEDED and run.app_name == "a"
    assert await _event_types(store, "lost") == ["run.started", "run.reasserted", "run.finished"]


async def test_reap_resolves_runs_of_expired_nodes_only(
    store: Store, raw_redis: aioredis.Redis
) -> None:
    e1 = await _node(store, "n1")
    e2 = await _node(store, "n2")
    await _start(store, "r1", "n1", e1)
    await _start(store, "r2", "n1", e1)
    await _start(store, "r3", "n2", e2)
    await _cancel(store, "r2", waiter="w")
    await raw_redis.zadd(store.keys.nodes, {"n1": time.time() - 1})
    assert await store.calls.reap(1) == (1, 0, True)  # bounded work per call
    assert await store.calls.reap(100) == (1, 1, False)
    assert await store.calls.reap(100) == (0, 0, False)  # nothing left: twice is a no-op
    r1, r2, r3 = [await store.reads.get_run(i) for i in ("r1", "r2", "r3")]
    assert r1 is not None and r1.status is RunStatus.FAILED and r1.end_reason == "owner_lost"
    assert r2 is not None and r2.status is RunStatus.CANCELLED and r2.end_reason == "owner_lost"
    assert r3 is not None and r3.status is RunStatus.RUNNING
    assert await raw_redis.zscore(store.keys.nodes, "n1") is None
    assert await raw_redis.hget(store.keys.node("n1"), "state") == "dead"


async def test_sync_run_writes_only_for_the_owner_of_an_active_run(
    store: Store, raw_redis: aioredis.Redis
) -> None:
    epoch = await _node(store)
    await _start(store, "r1", "n1", epoch)
    item = SyncItem("r1", "tool:search", "", [("output", "1.0", '{"text":"hi"}')])
    assert await store.calls.sync_runs("n1", epoch, [item]) == 1
    assert await store.calls.sync_runs("n2", epoch, [SyncItem("r1", "hijacked", "", [])]) == 0
    run = await store.reads.get_run("r1")
    assert run is not None and run.phase == "tool:search"
    assert await raw_redis.xlen(store.keys.relay("r1")) == 1
    await _finish(store, "r1", "n1", epoch)
    late = SyncItem("r1", "after", "", [("x", "1.0", "{}")])
    assert await store.calls.sync_runs("n1", epoch, [late]) == 0
    run = await store.reads.get_run("r1")
    assert run is not None and run.phase == "tool:search"


async def test_set_waiting_and_add_waiter(store: Store) -> None:
    epoch = await _node(store)
    await _start(store, "r1", "n1", epoch)
    assert await store.calls.set_waiting("r1", "n1", epoch, waiting=True)
    assert await store.calls.set_waiting("r1", "n1", epoch, waiting=True)  # twice: the same
    assert await store.calls.add_waiter("r1", "w") == "waiting"
    assert await store.calls.set_waiting("r1", "n1", epoch, waiting=False)
    await _cancel(store, "r1")
    assert not await store.calls.set_waiting("r1", "n1", epoch, waiting=True)  # cancel pending
    with pytest.raises(Fenced):
        await store.calls.set_waiting("r1", "n1", "999", waiting=True)
    assert await store.calls.add_waiter("nope", "w") == ""


async def test_reassert_run_recreates_then_confirms(store: Store) -> None:
    epoch = await _node(store)
    record = {
        "created_at": "1.500000",
        "status": "running",
        "cancel_mode": "checkpoint",
        "cancel_requested_at": "1.600000",
    }
    assert await store.calls.reassert_run("r9", "n1", epoch, record) == Reasserted(Code.RECREATED)
    assert await store.calls.reassert_run("r9", "n1", epoch, record) == Reasserted(Code.OK)
    run = await store.reads.get_run("r9")
    assert run is not None and run.status is RunStatus.RUNNING and run.stopping
    assert await store.reads.pending_cancels("n1") == {"r9": CancelMode.CHECKPOINT}
    e2 = await _node(store, "n2")
    foreign = await store.calls.reassert_run("r9", "n2", e2, record)
    assert (foreign.code, foreign.owner) == (Code.FOREIGN, "n1")
    await _finish(store, "r9", "n1", epoch)
    ended = await store.calls.reassert_run("r9", "n1", epoch, record)
    assert (ended.code, ended.status) == (Code.FINISHED, "cancelled")


async def test_event_streams_are_capped(store: Store, raw_redis: aioredis.Redis) -> None:
    epoch = await _node(store)
    await _start(store, "r1", "n1", epoch)
    for _ in range(EVENTS_MAX + 300):
        await store.calls.set_waiting("r1", "n1", epoch, waiting=True)
        await store.calls.set_waiting("r1", "n1", epoch, waiting=False)
    assert await raw_redis.llen(store.keys.events("r1")) == EVENTS_MAX


async def test_a_namespace_wide_silence_costs_a_lease_one_interval_at_most(
    store: Store, raw_redis: aioredis.Redis
) -> None:
    e1, e2 = await _node(store, "n1"), await _node(store, "n2")
    await _start(store, "r1", "n1", e1)
    clock = await raw_redis.hgetall(store.keys.lease_clock)
    silence = float(clock["last"]) - 1000  # as if no heartbeat had reached Redis for 1000 s
    await raw_redis.hset(store.keys.lease_clock, "last", f"{silence:.6f}")
    assert await _beat(store, "n2", e2) is Code.OK
    assert await store.calls.reap(100) == (0, 0, False)  # n1 is not reaped...
    assert await _beat(store, "n1", e1) is Code.OK  # ... nor fenced
    after = await raw_redis.hgetall(store.keys.lease_clock)
    advanced = float(after["at"]) - float(clock["at"])
    assert INTERVAL <= advanced < INTERVAL + 1  # the silence counted one interval
    nodes = {node.node_id: node for node in await store.reads.list_nodes(time.time())}
    assert not nodes["n1"].expired
    # a node that stays silent while others beat does expire, on the lease clock
    await raw_redis.zadd(store.keys.nodes, {"n1": float(after["at"]) - 1})
    assert await store.calls.reap(100) == (1, 1, False)


async def test_a_cancel_sent_again_after_its_answer_was_lost_answers_for_what_it_did(
    store: Store,
) -> None:
    """redis-py repeats a call whose connection died before the answer came back: the repeat
    must not answer from the state the first send created (the chaos suite's long profile saw a
    session cancel recorded, then answered not_found once the run it cancelled had ended)."""
    epoch = await _node(store)
    session = ("app", "u", "s")

    async def session_cancel(request_id: str) -> Code:
        order = CancelOrder(
            "session:app:u:s", None, session, CancelMode.CHECKPOINT, "stop", "t", StopCause.USER
        )
        answer = await store.calls.request_cancel(
            order, waiter="", caller=CALLER, request_id=request_id
        )
        return answer.code

    await _start(store, "r1", "n1", epoch, session)
    assert await session_cancel("q1") is Code.STOPPING
    assert await session_cancel("q1") is Code.STOPPING  # the same request, the run still going
    finished = await _finish(store, "r1", "n1", epoch, RunStatus.CANCELLED)
    assert (finished.code, finished.status) == (Code.OK, "cancelled")
    assert await session_cancel("q1") is Code.CANCELLED  # not "not_found": it was this request's
    assert await session_cancel("q2") is Code.NOT_FOUND  # a new request finds no active run
    await _start(store, "r2", "n1", epoch, session)
    assert await session_cancel("q2") is Code.NOT_FOUND  # nor does its repeat take the next run
    record = await store.reads.get_run("r2")
    assert record is not None and record.cancel_requested_at is None


async def test_a_run_is_recorded_cancelled_only_if_someone_asked(store: Store) -> None:
    epoch = await _node(store)
    for run_id in ("plain", "fenced", "unreachable", "drained", "asked"):
        await _start(store, run_id, "n1", epoch)
    await _cancel(store, "asked")

    async def finish(run_id: str, cause: StopCause | None) -> Finished:
        stopped = RunStatus.CANCELLED  # the code stopped as for a cancel
        return await store.calls.finish_run(
            _finish_of(run_id, epoch, status=stopped, stop_cause=cause)
        )

    assert await finish("plain", None) == _ok("failed", "error")
    assert await finish("fenced", StopCause.LEASE_LOST) == _ok("failed", "lease_lost")
    unreachable = await finish("unreachable", StopCause.REDIS_UNREACHABLE)
    assert unreachable == _ok("failed", "redis_unreachable")
    assert await finish("drained", StopCause.NODE_SHUTDOWN) == _ok("cancelled", "cancelled")
    assert await finish("asked", StopCause.LEASE_LOST) == _ok("cancelled", "lease_lost")
    for run_id in ("plain", "fenced", "unreachable"):
        run = await store.reads.get_run(run_id)
        assert run is not None and run.cancel_requested_at is None
    drained = await store.reads.get_run("drained")
    assert drained is not None and drained.cancel_reason == "node_shutdown"
    assert drained.requested_by == "n1" and drained.cancel_requested_at is not None
    assert "run.cancel_requested" in await _event_types(store, "drained")


async def test_a_queued_run_is_claimed_only_by_its_own_session(store: Store) -> None:
    epoch = await _node(store)
    queued = await store.calls.enqueue_run("q1", ("app", "alice", "s"), {"secret": 1})
    assert queued.status is RunStatus.QUEUED
    for stranger in (("app", "bob", "s"), ("app", "alice", "other"), ("other", "alice", "s")):
        with pytest.raises(RunExists) as taken:
            await _start(store, "q1", "n1", epoch, stranger)
        assert taken.value.status == "queued"
    run = await _start(store, "q1", "n1", epoch, ("app", "alice", "s"))
    assert run["status"] == "running"
    with pytest.raises(RunExists):  # running here: not bob's either
        await _start(store, "q1", "n1", epoch, ("app", "bob", "s"))
    assert (await store.calls.enqueue_run("q2", None, None)).status is RunStatus.QUEUED
    with pytest.raises(RunExists):  # a run queued without a session is not a user's to claim
        await _start(store, "q2", "n1", epoch, ("app", "bob", "s"))
    assert (await _start(store, "q2", "n1", epoch))["status"] == "running"  # by id alone


async def test_a_run_whose_parent_was_cancelled_never_starts(store: Store) -> None:
    epoch = await _node(store)
    await _start(store, "parent", "n1", epoch)
    await _cancel(store, "parent")
    with pytest.raises(RunCancelled):
        await store.calls.start_run("child", "n1", epoch, None, None, False, parent="parent")
    child = await store.reads.get_run("child")
    assert child is not None and child.status is RunStatus.CANCELLED and child.started_at is None


async def test_the_scripts_name_every_key_as_keyspace_does(
    store: Store, raw_redis: aioredis.Redis
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
    for name, text in _lua_files().items():  # no script builds a name of its own
        assert "P .." not in text, name
    built = [line for line in PRELUDE.splitlines() if "P .." in line]
    assert all(line.startswith("local function key_") for line in built)
    assert len(built) == len(KEY_TEMPLATES)


async def test_calls_made_together_leave_in_few_bounded_batches(
    store: Store, raw_redis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    epoch = await _node(store)
    sending = most = sent = 0
    send = ScriptBatcher._send

    async def counted(self: ScriptBatcher, script: Any, batch: list[Any]) -> None:
        nonlocal sending, most, sent
        sending += 1
        sent += 1
        most = max(most, sending)
        try:
            await send(self, script, batch)
        finally:
            sending -= 1

    monkeypatch.setattr(ScriptBatcher, "_send", counted)
    calls = 3000
    answers = await asyncio.gather(*(_start(store, f"r{i}", "n1", epoch) for i in range(calls)))
    assert [record["status"] for record in answers] == ["running"] * calls
    assert most <= MAX_IN_FLIGHT  # a burst is a queue, not a race for connections
    # one turn's calls share batches (counted here: the server's own count of script calls
    # also holds the heartbeats of every other bus on it)
    assert sent <= calls // MAX_CALLS + MAX_IN_FLIGHT + 2
    assert await raw_redis.scard(store.keys.node_runs("n1")) == calls


async def test_a_cancel_takes_its_turn_in_a_burst_of_finishes(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    epoch = await _node(store)
    runs = MAX_IN_FLIGHT * MAX_CALLS * 2  # more than the batches in flight can carry
    for first in range(0, runs, 500):
        await asyncio.gather(
            *(_start(store, f"r{i}", "n1", epoch) for i in range(first, first + 500))
        )
    order: list[str] = []
    send = ScriptBatcher._send

    async def recorded(self: ScriptBatcher, script: Any, batch: list[Any]) -> None:
        order.append(next(name for name, known in self._scripts.items() if known is script))
        await send(self, script, batch)

    monkeypatch.setattr(ScriptBatcher, "_send", recorded)
    finishes = asyncio.ensure_future(
        store.calls.finish_runs([_finish_of(f"r{i}", epoch) for i in range(runs)])
    )
    while len(order) < MAX_IN_FLIGHT:  # the first batches are on their way, the rest queued
        await asyncio.sleep(0)
    code, _, _ = await _cancel(store, f"r{runs - 1}")  # queued behind them
    assert code in (Code.STOPPING, Code.ALREADY_FINISHED)
    second_wave = order.index("finish_run", MAX_IN_FLIGHT)  # sent as the first ones came back
    assert "request_cancel" in order[second_wave : second_wave + 2], order
    answers = await finishes
    assert all(isinstance(a, Finished) and a.code in (Code.OK, Code.DONE) for a in answers)


# -- tombstones and queued runs sent again --------------------------------------------------


async def _lay(store: Store, tombstone_id: str) -> bool:
    return await store.calls.add_tombstone(
        tombstone_id, {"user_id": "u"}, CancelMode.CHECKPOINT, None, None, StopCause.USER, 60
    )


async def test_a_tombstone_sent_again_is_laid_once_even_when_the_namespace_is_full(
    store: Store, raw_redis: aioredis.Redis
) -> None:
    """redis-py sends a script again when the connection dies before its answer came: the
    repeat must not answer "too many tombstones" for the one the first send laid."""
    for n in range(MAX_TOMBSTONES - 1):
        assert await _lay(store, f"t{n}")
    assert await _lay(store, "last")  # the namespace is now full
    laid = await raw_redis.hgetall(store.keys.tombstone("last"))
    assert not await _lay(store, "another")
    assert await _lay(store, "last")  # sent again: laid, as it was
    assert await raw_redis.zcard(store.keys.tombstones) == MAX_TOMBSTONES
    assert await raw_redis.hgetall(store.keys.tombstone("last")) == laid  # not laid anew


async def test_an_enqueue_sent_again_answers_with_the_run_it_queued(store: Store) -> None:
    """redis-py sends a script again when the connection dies before its answer came: the
    repeat of an enqueue that ran must not say the run exists (it does: the call made it)."""
    epoch = await _node(store)
    session = ("app", "u", "s")
    enqueue = store.calls.enqueue_run
    first = await enqueue("q1", session, {"k": 1}, request_id="call-1")
    again = await enqueue("q1", session, {"k": 1}, request_id="call-1")
    assert first.status is again.status is RunStatus.QUEUED and again.run_id == "q1"
    with pytest.raises(RunExists):  # another call for the same id is a conflict
        await enqueue("q1", session, {"k": 1}, request_id="call-2")
    await _start(store, "q1", "n1", epoch, session)
    late = await enqueue("q1", session, {"k": 1}, request_id="call-1")
    assert late.status is RunStatus.RUNNING  # the run it queued, as it now stands


async def test_a_tombstone_lift_sent_again_answers_as_the_first(
    store: Store, raw_redis: aioredis.Redis
) -> None:
    assert await _lay(store, "t1")
    assert await store.calls.remove_tombstone("t1", request_id="call-1")
    assert await store.calls.remove_tombstone("t1", request_id="call-1")  # sent again: lifted
    assert not await store.calls.remove_tombstone("t1", request_id="call-2")  # not live now
    assert await store.reads.tombstones() == []  # what the lift keeps is not a tombstone
    assert 0 < await raw_redis.pttl(store.keys.tombstone("t1")) <= 120_000


def test_every_command_of_the_scripts_is_one_the_acl_rules_allow() -> None:
    """A command missing from ACL_COMMANDS fails only for a user confined by acl_rules()."""
    used: set[str] = set()
    for text in (PRELUDE, *ALL_SCRIPTS.values()):
        used |= {name.lower() for name in re.findall(r"redis\.p?call\(\s*'(\w+)'", text)}
    assert "hset" in used and "zcard" in used  # the pattern reads the scripts
    assert used <= set(ACL_COMMANDS), used - set(ACL_COMMANDS)
