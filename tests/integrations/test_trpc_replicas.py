"""trpc-agent across OS processes: the agent runs on replica A, the cancel is sent to A (the
owner) or B (another replica), through trpc-agent's own API or the bus in each mode; a sub-agent's
run is a child of the run that started it, cancelled with it."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from trpc_agent_sdk.cancel._session_utils import _CANCELING_SUFFIX

from cancel_bus import CancelBus, Outcome, RunInfo, RunStatus, StopCause
from cancel_bus.integrations._held import HeldCancels
from cancel_bus.integrations.trpc_agent import bus_session

from ..helpers import WAIT, eventually
from .replica import Replica
from .tree_support import children
from .trpc_support import APP, BOSS, GATED

WHERE = ["owner", "other"]
MARKER = f"\n\n{_CANCELING_SUFFIX}"


@pytest.fixture
def namespace(replica_namespace: str) -> str:
    return replica_namespace


class TrpcRuns:
    """Drives replicas' trpc-agent runs over their control routes."""

    def __init__(self, http: httpx.AsyncClient, replicas: list[Replica]) -> None:
        self.http = http
        self.a, self.b = replicas
        self.user = f"u-{uuid.uuid4().hex[:8]}"

    def session(self, name: str) -> str:
        """A session id of its own (the agent's gates are named by session)."""
        return f"{name}-{uuid.uuid4().hex[:8]}"

    def at(self, where: str) -> Replica:
        return self.a if where == "owner" else self.b

    async def post(self, replica: Replica, path: str, body: dict[str, Any] | None = None) -> Any:
        response = await self.http.post(f"{replica.url}{path}", json=body or {})
        response.raise_for_status()
        return response.json()

    async def start(
        self, session: str, command: str, app: str = APP, replica: Replica | None = None
    ) -> None:
        """Start a run on A (or ``replica``); returns once ``run_async`` was called."""
        body = {"app": app, "user": self.user, "session": session, "command": command}
        await self.post(replica or self.a, "/trpc/runs", body)

    async def streaming(self, session: str) -> None:
        await self.post(self.a, f"/trpc/runs/{self.user}/{session}/streaming")

    async def result(self, session: str) -> dict[str, Any]:
        result: dict[str, Any] = await self.post(self.a, f"/trpc/runs/{self.user}/{session}/result")
        return result

    async def cancel_run_async(
        self, where: str, session: str, timeout: float = WAIT, app: str = APP
    ) -> bool:
        body = {"app": app, "user": self.user, "session": session, "timeout": timeout}
        answer: bool = (await self.post(self.at(where), "/trpc/cancel", body))["answer"]
        return answer

    async def bus_cancel(self, where: str, session: str, mode: str) -> dict[str, Any]:
        """``bus.cancel_session`` on a replica (what ops call), without waiting."""
        body = {"app": APP, "user": self.user, "session": session, "mode": mode, "wait": False}
        answer: dict[str, Any] = await self.post(self.at(where), "/bus/cancel", body)
        return answer

    async def open(self, gate: str) -> None:
        await self.post(self.a, f"/gates/{gate}")


@pytest.fixture
def runs(http: httpx.AsyncClient, trpc_replicas: list[Replica]) -> TrpcRuns:
    return TrpcRuns(http, trpc_replicas)


async def record(ops: CancelBus, runs: TrpcRuns, session: str, app: str = APP) -> RunInfo:
    """The bus record of the session's (last) run."""
    records = await ops.list_runs(status="all", app_name=app, user_id=runs.user)
    return next(run for run in records if run.session_id == session)


@pytest.mark.parametrize("strategy", ["enqueue", "interrupt"])
async def test_a_second_run_of_a_session_on_another_replica_follows_the_install_strategy(
    http: httpx.AsyncClient,
    trpc_replicas: list[Replica],
    ops: CancelBus,
    strategy: str,
) -> None:
    """``install(bus, multitask_strategy=...)``: ``Runner.run_async`` of a session whose run is
    active on replica A, called on replica B, waits queued behind it (``enqueue``) or stops it
    (``interrupt``), then runs on B. (The replicas the other tests share: ``reject`` again
    after it.)"""
    for replica in trpc_replicas:
        await replica.install_multitask(http, strategy)
    try:
        runs = TrpcRuns(http, trpc_replicas)
        session = runs.session("texting")
        await runs.start(session, "stream")
        await runs.streaming(session)
        await runs.start(session, "stream", replica=runs.b)

        async def on(owner: str, *statuses: RunStatus) -> RunInfo | None:
            found = await ops.list_runs(status="all", app_name=APP, user_id=runs.user)
            return next((r for r in found if r.owner == owner and r.status in statuses), None)

        if strategy == "enqueue":  # queued on B while A's run goes on, then its turn
            queued = await eventually(lambda: on(runs.b.node_id, RunStatus.QUEUED))
            first = await on(runs.a.node_id, RunStatus.RUNNING)
            assert first is not None and queued.session_id == session
            assert (await ops.cancel(first.run_id, timeout=WAIT)).outcome is Outcome.CANCELLED
        second = await eventually(lambda: on(runs.b.node_id, RunStatus.RUNNING))
        result = await runs.result(session)  # A's run, stopped at a checkpoint
        assert result["cancelled"] and result["error"] is None
        ended = await on(runs.a.node_id, RunStatus.CANCELLED)
        assert ended is not None and ended.session_id == second.session_id == session
        if strategy == "interrupt":
            assert ended.cancel_cause is StopCause.INTERRUPT
            assert (ended.end_reason, ended.requested_by) == ("interrupted", second.run_id)
        stop = await ops.cancel_session(*bus_session(APP, runs.user, session), timeout=WAIT)
        assert stop.outcome is Outcome.CANCELLED and stop.run is not None
        assert stop.run.run_id == second.run_id
    finally:
        for replica in trpc_replicas:
            await replica.install_multitask(http, "reject")


@pytest.mark.parametrize("where", WHERE)
async def test_cancel_run_async_on_any_replica_stops_the_run_at_its_checkpoint(
    runs: TrpcRuns, ops: CancelBus, where: str
) -> None:
    session = runs.session("s")
    await runs.start(session, "stream")
    await runs.streaming(session)

    assert await runs.cancel_run_async(where, session) is True

    result = await runs.result(session)
    assert result["cancelled"] and result["error"] is None
    assert result["partial"].startswith("t0 ")
    assert result["saved"] == result["partial"] + MARKER  # trpc-agent kept the partial text
    final = await record(ops, runs, session)
    assert (final.status, final.end_reason, final.owner) == (
        RunStatus.CANCELLED,
        "cancelled",
        runs.a.node_id,
    )


# What a "turns" run (see StreamingAgent) leaves, stopped in its first turn, held at the gate.
TURN_ENDS = {
    # at the first checkpoint after the gate: the turn cut short
    "checkpoint": ("Let me ", [], "Let me " + MARKER),
    # the await at the gate interrupted
    "immediate": ("Let me ", [], "Let me " + MARKER),
    # the turn completes (its tool call answered); the next one never starts
    "after_turn": ("Let me look. ", ["Let me look. ", ""], _CANCELING_SUFFIX),
}


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("mode", TURN_ENDS)
async def test_a_bus_cancel_from_any_replica_honours_each_mode(
    runs: TrpcRuns, ops: CancelBus, mode: str, where: str
) -> None:
    session = runs.session("turns")
    await runs.start(session, "turns")
    await runs.streaming(session)  # "Let me ", then held at the gate

    answer = await runs.bus_cancel(where, session, mode)
    assert answer["outcome"] == "stopping"
    run_id = answer["run"]["run_id"]

    async def delivered() -> bool:
        run = await ops.get_run(run_id)
        return run is not None and run.cancel_delivered_at is not None

    await eventually(delivered)
    if mode == "immediate":
        result = await runs.result(session)  # ends without the gate: the await was interrupted
    else:
        await runs.open(session)
        result = await runs.result(session)
    partial, complete, saved = TURN_ENDS[mode]
    assert (result["partial"], result["complete"], result["saved"]) == (partial, complete, saved)
    assert result["cancelled"] and result["error"] is None
    final = await ops.wait(run_id, timeout=WAIT)
    assert final is not None
    assert (final.status, final.end_reason, final.cancel_mode) == (
        RunStatus.CANCELLED,
        "cancelled",
        mode,
    )
    if mode == "immediate":
        await runs.open(session)  # the gate of a run that is over


@pytest.mark.parametrize("where", WHERE)
async def test_a_cancel_right_after_run_async_is_held_and_applied_at_start(
    runs: TrpcRuns, ops: CancelBus, raw_redis: aioredis.Redis, where: str
) -> None:
    """The run is held before it registers (its session lookup waits for a gate): the cancel
    finds no run, is held, and the run stops at its first checkpoint, before any chunk."""
    session = runs.session(GATED.rstrip("-"))
    await runs.start(session, "stream")
    cancel = asyncio.create_task(runs.cancel_run_async(where, session))
    hold = HeldCancels(ops).key(bus_session(APP, runs.user, session))
    await eventually(lambda: _exists(raw_redis, hold))

    await runs.open(f"start:{session}")

    assert await asyncio.wait_for(cancel, WAIT) is True
    result = await runs.result(session)
    assert result["cancelled"] and result["partial"] == ""
    assert result["saved"] == _CANCELING_SUFFIX
    final = await record(ops, runs, session)
    assert (final.status, final.end_reason) == (RunStatus.CANCELLED, "cancelled")


async def _exists(redis: aioredis.Redis, key: str) -> bool:
    return bool(await redis.exists(key))


async def test_a_cancel_of_an_idle_session_answers_false_and_spares_the_next_run(
    runs: TrpcRuns,
) -> None:
    session = runs.session("idle")
    assert await runs.cancel_run_async("other", session) is False
    await runs.start(session, "short")
    result = await runs.result(session)
    assert not result["cancelled"] and result["complete"] == ["done"]

    assert await runs.cancel_run_async("other", session) is False  # the run has ended


async def test_a_run_without_checkpoints_is_running_with_a_stop_pending_until_it_ends(
    runs: TrpcRuns, ops: CancelBus
) -> None:
    session = runs.session("hold")
    await runs.start(session, "hold")
    await runs.streaming(session)

    assert await runs.cancel_run_async("other", session, timeout=0.2) is True
    pending = await record(ops, runs, session)
    assert (pending.status, pending.stopping) == (RunStatus.RUNNING, True)

    await runs.open(session)
    result = await runs.result(session)
    assert not result["cancelled"] and result["complete"] == ["done"]
    final = await ops.wait(pending.run_id, timeout=WAIT)
    assert final is not None
    assert (final.status, final.end_reason, final.stopping) == (
        RunStatus.CANCELLED,
        "completed",
        False,
    )


@pytest.mark.parametrize("how", ["bus", "cancel_run_async"])
async def test_cancelling_a_run_stops_the_run_of_its_sub_agent(
    runs: TrpcRuns, ops: CancelBus, how: str
) -> None:
    """The boss (an LlmAgent) calls the sub-agent ``helper`` through trpc-agent's ``AgentTool``:
    a nested Runner, a run of its own on A, recorded as the boss's child. A cancel of the boss,
    sent from another process, stops the helper's run first (at its checkpoint), then the boss."""
    session = runs.session("boss")
    await runs.start(session, "helper stream", app=BOSS)

    async def helper_running() -> bool:  # the boss's run may not be recorded yet
        records = await ops.list_runs(status="all", app_name=BOSS, user_id=runs.user)
        boss = next((run for run in records if run.session_id == session), None)
        return boss is not None and bool(await children(ops, boss))

    await eventually(helper_running)
    root = await record(ops, runs, session, BOSS)
    [helper] = await children(ops, root)
    assert (helper.status, helper.owner) == (RunStatus.RUNNING, runs.a.node_id)

    if how == "bus":  # the test's own bus: another node, another process
        result = await ops.cancel_session(BOSS, runs.user, session, timeout=WAIT)
        assert result.outcome is Outcome.CANCELLED
        assert [(r.outcome, r.run.run_id if r.run else None) for r in result.descendants] == [
            (Outcome.CANCELLED, helper.run_id)
        ]
    else:  # trpc-agent's own API, on replica B
        assert await runs.cancel_run_async("other", session, app=BOSS) is True

    assert (await runs.result(session))["cancelled"]  # the boss ended with AgentCancelledEvent
    stopped = await ops.wait(helper.run_id, timeout=WAIT)
    assert stopped is not None
    assert (stopped.status, stopped.end_reason, stopped.cancel_cause) == (
        RunStatus.CANCELLED,
        "cancelled",  # at the helper's own checkpoint
        StopCause.PARENT,
    )
    final = await ops.wait(root.run_id, timeout=WAIT)
    assert final is not None and (final.status, final.end_reason) == (
        RunStatus.CANCELLED,
        "cancelled",
    )
