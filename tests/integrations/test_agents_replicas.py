"""openai-agents and LangGraph across OS processes: the agent runs on replica A (the user's code
as the docs show it), and ``bus.cancel_session`` is called on A (the owner) or B (another
replica) in each mode. Neither framework has a cancel API of its own for another process to
call: replica B calls the bus, and A's adapter stops the framework its own way."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from cancel_bus import CancelBus, RunStatus

from ..helpers import WAIT
from .agents_replica import APP, GATED, USER
from .replica import Replica
from .replica_client import WHERE, delivered
from .replica_client import ReplicaRuns as Runs

# Stopped while the model stalls after "Let me ": (text streamed, tool called).
OPENAI_ENDS = {
    "checkpoint": ("Let me look. ", False),  # at the next event: the turn cut short
    "immediate": ("Let me ", False),  # the stalled model stream interrupted
    "after_turn": ("Let me look. ", True),  # the turn completes, tool call included
}
# Stopped while the draft node stalls after "Paris ": (chunks, research started, next nodes).
LANGGRAPH_ENDS = {
    "checkpoint": (["Paris ", "is "], False),  # the next chunk, then stopped mid-node
    "immediate": (["Paris "], False),  # the stalled node interrupted
    "after_turn": (["Paris ", "is ", "the capital."], False),  # the superstep completes
}


@pytest.fixture
def namespace(replica_namespace: str) -> str:
    return replica_namespace


@pytest.fixture
def runs(http: httpx.AsyncClient, agents_replicas: list[Replica]) -> Runs:
    return Runs(http, agents_replicas, APP, USER)


async def stopped(runs: Runs, ops: CancelBus, framework: str, where: str, mode: str) -> Any:
    """Start a run on A, wait until it stalls at its gate, cancel it from ``where`` in ``mode``
    (delivered while it stalls), open the gate; its result and bus record."""
    session = f"{framework}-{uuid.uuid4().hex[:8]}"
    run_id = await runs.start(framework, session)
    await runs.streaming(session)
    gates = (
        [f"model:{session}", f"tool:{session}"] if framework == "openai" else [f"draft:{session}"]
    )
    assert await runs.cancel(where, session, mode) == "stopping"
    await delivered(ops, run_id)
    if mode != "immediate":  # immediate interrupts the stall itself
        await runs.open(gates[0])
    if mode == "after_turn":  # the turn completes
        for gate in gates[1:]:
            await runs.open(gate)
    result = await runs.result(session)
    for gate in gates:
        await runs.open(gate)
    final = await ops.wait(run_id, timeout=WAIT)
    assert final is not None
    assert (final.status, final.end_reason, final.cancel_mode) == (
        RunStatus.CANCELLED,
        "cancelled",
        mode,
    )
    assert result.get("error") is None and not result["after_loop"]
    return result, final


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("mode", OPENAI_ENDS)
async def test_openai_agents_honours_each_mode_from_any_replica(
    runs: Runs, ops: CancelBus, mode: str, where: str
) -> None:
    result, final = await stopped(runs, ops, "openai", where, mode)
    text, tool = OPENAI_ENDS[mode]
    assert (result["text"], result["tool"], result["model_calls"]) == (text, tool, 1)
    assert final.output == text  # the partial output is kept


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("mode", LANGGRAPH_ENDS)
async def test_langgraph_honours_each_mode_from_any_replica(
    runs: Runs, ops: CancelBus, mode: str, where: str
) -> None:
    result, final = await stopped(runs, ops, "langgraph", where, mode)
    chunks, research = LANGGRAPH_ENDS[mode]
    assert (result["chunks"], result["research"]) == (chunks, research)
    assert result["draft_interrupted"] is (mode == "immediate")
    assert final.output == "".join(chunks)
    if mode == "after_turn":
        assert result["next"] == ["research"]  # drained at the superstep boundary: resumable


@pytest.mark.parametrize("framework", ["openai", "langgraph"])
async def test_a_cancel_right_after_the_framework_call_stops_the_run_at_its_first_checkpoint(
    runs: Runs, ops: CancelBus, framework: str
) -> None:
    """The bus run registers before the framework is called: there is no window in which a
    cancel finds nothing. The first token waits for a gate, the next ones for another that stays
    shut: a lost cancel would hang the run. It stops at the first event after the cancel."""
    session = f"{GATED}{framework}-{uuid.uuid4().hex[:8]}"
    run_id = await runs.start(framework, session)
    assert await runs.cancel("other", session, "checkpoint") == "stopping"
    await delivered(ops, run_id)
    await runs.open(f"start:{session}")
    result = await runs.result(session)

    first = {"openai": "Let me ", "langgraph": "Paris "}[framework]
    kept = result.get("text", "".join(result.get("chunks", [])))
    assert kept in ("", first) and not result["after_loop"]
    final = await ops.wait(run_id, timeout=WAIT)
    assert final is not None and final.status is RunStatus.CANCELLED
    assert final.output == kept
