"""agno across OS processes: the agent runs on replica A (agno's async runs, and its sync runs
in a thread), and agno's own cancel API is called on A (the owner) or B (another replica):
``Agent.acancel_run`` / ``cancel_run``, ``Team.acancel_run``, AgentOS's cancel route; the bus's
cancel in each mode; a cancel before the run starts; a team whose member run is a child."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from cancel_bus import CancelBus, RunInfo, RunStatus, StopCause

from ..helpers import WAIT, eventually
from .replica import Replica
from .replica_client import WHERE, ReplicaRuns, delivered
from .story_support import APP, ENDS, USER, gates_to_open

CANCELLED = "CANCELLED"  # agno's RunStatus.cancelled


class AgnoRuns(ReplicaRuns):
    async def run(self, kind: str = "async") -> tuple[str, str]:
        """Start a run on A; (its session, its run id) once it registered."""
        session = f"agno-{kind}-{uuid.uuid4().hex[:8]}"
        return session, await self.start("agno", session, kind=kind)

    async def agno_cancel(self, where: str, run_id: str, kind: str = "async") -> bool:
        """agno's own cancel call (``Agent.acancel_run``, ``Agent.cancel_run`` in a thread for
        ``sync``, ``Team.acancel_run`` for ``team``) on a replica."""
        body = {"run_id": run_id, "kind": kind}
        answer: bool = (await self.post(self.at(where), "/agno/cancel", body))["answer"]
        return answer

    async def bus_cancel(self, where: str, run_id: str, mode: str) -> str:
        body = {"run_id": run_id, "mode": mode, "wait": False}
        outcome: str = (await self.post(self.at(where), "/bus/cancel-run", body))["outcome"]
        return outcome

    async def stored(self, session: str) -> list[list[Any]]:
        """The session's runs as agno stored them on A: [run id, status, content]."""
        response = await self.http.get(f"{self.a.url}/agno/sessions/{session}")
        response.raise_for_status()
        runs: list[list[Any]] = response.json()["runs"]
        return runs


@pytest.fixture
def namespace(replica_namespace: str) -> str:
    return replica_namespace


@pytest.fixture
def runs(http: httpx.AsyncClient, frameworks_replicas: list[Replica]) -> AgnoRuns:
    return AgnoRuns(http, frameworks_replicas, APP, USER)


async def ended(ops: CancelBus, run_id: str, mode: str = "checkpoint") -> RunInfo:
    final = await ops.wait(run_id, timeout=WAIT)
    assert final is not None
    assert (final.status, final.end_reason, final.cancel_mode) == (
        RunStatus.CANCELLED,
        "cancelled",
        mode,
    )
    return final


@pytest.mark.parametrize("kind", ["async", "sync"])
@pytest.mark.parametrize("where", WHERE)
async def test_agents_cancel_run_on_any_replica_stops_the_run_at_its_next_check(
    runs: AgnoRuns, ops: CancelBus, where: str, kind: str
) -> None:
    """agno's own call, on the owner or another replica, in an async run or a sync one (a
    thread): True, and the run stops at the event after the model's wait, as agno stops it."""
    session, run_id = await runs.run(kind)
    await runs.streaming(session)  # "Let me ", then the model waits at its gate

    assert await runs.agno_cancel(where, run_id, kind) is True

    await delivered(ops, run_id)
    await runs.open(f"model:{session}")
    result = await runs.result(session)
    assert (result["status"], result["content"], result["tool"]) == (
        CANCELLED,
        "Let me look. ",  # agno keeps the chunk it checked after (it yields it no more)
        False,
    )
    assert result["text"] == "Let me " and result["after_loop"]
    assert (await ended(ops, run_id)).output == "Let me look. "
    assert [run_id, CANCELLED, "Let me look. "] in await runs.stored(session)
    await runs.open(f"tool:{session}")


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("mode", ENDS)
async def test_a_bus_cancel_from_any_replica_honours_each_mode(
    runs: AgnoRuns, ops: CancelBus, mode: str, where: str
) -> None:
    session, run_id = await runs.run()
    await runs.streaming(session)

    assert await runs.bus_cancel(where, run_id, mode) == "stopping"

    await delivered(ops, run_id)
    for gate in gates_to_open(session, mode):
        await runs.open(gate)
    result = await runs.result(session)
    text, tool = ENDS[mode]
    assert (result["tool"], result["model_calls"]) == (tool, 1)
    if mode == "immediate":  # agno re-raises the interruption: as the bus's RunCancelled
        assert result["error"] == f"RunCancelled: run {run_id} cancelled"
    else:
        assert (result["status"], result["content"]) == (CANCELLED, text)
    assert (await ended(ops, run_id, mode)).output == text

    async def stored() -> bool:  # an interrupted run is stored by a task of agno's
        return [run_id, CANCELLED, text] in await runs.stored(session)

    await eventually(stored)
    for gate in ("model", "tool"):
        await runs.open(f"{gate}:{session}")


async def test_a_cancel_before_the_run_starts_stops_it_at_its_first_check(
    runs: AgnoRuns, ops: CancelBus
) -> None:
    """agno's contract: the intent is kept for a run not registered yet (cancel_run answers
    False). On the bus it is a queued run cancelled at once; the run, started on another
    replica, never starts its model."""
    run_id = str(uuid.uuid4())
    assert await runs.agno_cancel("other", run_id) is False
    queued = await ops.get_run(run_id)
    assert queued is not None and (queued.status, queued.started_at) == (RunStatus.CANCELLED, None)

    session = f"agno-before-{uuid.uuid4().hex[:8]}"
    assert await runs.start("agno", session, run_id=run_id) == run_id
    result = await runs.result(session)
    assert (result["status"], result["text"], result["model_calls"]) == (CANCELLED, "", 0)


async def test_cancelling_a_team_on_another_replica_stops_its_member_run_first(
    runs: AgnoRuns, ops: CancelBus
) -> None:
    """The leader delegates to its member, a run of its own on A, recorded as the team run's
    child. ``Team.acancel_run`` on B cancels the tree: the member stops at its next check
    (cause ``parent``), then the team."""
    session, team_run_id = await runs.run("team")
    await runs.streaming(session)  # the member streams "Let me ", then waits at its gate
    [member] = await ops.children(team_run_id)
    assert (member.status, member.owner) == (RunStatus.RUNNING, runs.a.node_id)

    assert await runs.agno_cancel("other", team_run_id, "team") is True

    await delivered(ops, member.run_id)
    await runs.open(f"model:{session}")
    result = await runs.result(session)
    assert result["status"] == CANCELLED
    assert result["members"] == [[CANCELLED, "Let me look. "]]
    stopped = await ended(ops, member.run_id)
    assert (stopped.cancel_cause, stopped.output) == (StopCause.PARENT, "Let me look. ")
    await ended(ops, team_run_id)
    await runs.open(f"tool:{session}")


async def test_agentos_cancel_route_on_another_replica_stops_the_run(
    runs: AgnoRuns, ops: CancelBus
) -> None:
    """AgentOS's ``POST /agents/{agent_id}/runs/{run_id}/cancel``, served by replica B, for a
    run of A: agno's route calls ``agent.acancel_run``, which the bus carries to A."""
    session, run_id = await runs.run()
    await runs.streaming(session)

    response = await runs.http.post(f"{runs.b.url}/os/agents/story/runs/{run_id}/cancel")
    assert response.status_code == 200

    await delivered(ops, run_id)
    await runs.open(f"model:{session}")
    result = await runs.result(session)
    assert (result["status"], result["content"]) == (CANCELLED, "Let me look. ")
    await ended(ops, run_id)
    await runs.open(f"tool:{session}")
