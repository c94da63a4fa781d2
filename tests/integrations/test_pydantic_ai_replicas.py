"""pydantic-ai across OS processes: the agent runs on replica A under a bus run (the user's code
as the docs show it, through each helper), and ``bus.cancel_session`` is called on A (the owner)
or B (another replica) in each mode. pydantic-ai has no cancel API another process could call:
B calls the bus, and A's capability cancels the run with pydantic-ai's own cancellation."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from cancel_bus import CancelBus, RunStatus

from ..helpers import WAIT
from .replica import Replica
from .replica_client import WHERE, ReplicaRuns, delivered
from .story_support import APP, ENDS, GATED, USER, gates_to_open

# The messages pydantic-ai keeps for a run stopped in each mode (see pydantic_ai_support.summary)
MESSAGES = {
    "checkpoint": [["prompt"], ["text:Let me look. "]],
    "immediate": [["prompt"], ["text:Let me "]],
    "after_turn": [["prompt"], ["text:Let me look. ", "call:lookup"], ["tool-return:lookup"]],
}


@pytest.fixture
def namespace(replica_namespace: str) -> str:
    return replica_namespace


@pytest.fixture
def runs(http: httpx.AsyncClient, frameworks_replicas: list[Replica]) -> ReplicaRuns:
    return ReplicaRuns(http, frameworks_replicas, APP, USER)


async def stopped(
    runs: ReplicaRuns, ops: CancelBus, api: str, where: str, mode: str
) -> dict[str, Any]:
    """Start a run on A through ``api``, cancel it from ``where`` in ``mode`` while its model
    waits, open the gates the mode needs; its result, checked against the bus record."""
    session = f"pai-{api}-{uuid.uuid4().hex[:8]}"
    run_id = await runs.start("pydantic-ai", session, api=api)
    await runs.streaming(session)

    assert await runs.cancel(where, session, mode) == "stopping"

    await delivered(ops, run_id)
    for gate in gates_to_open(session, mode):
        await runs.open(gate)
    result = await runs.result(session)
    for gate in ("model", "tool"):
        await runs.open(f"{gate}:{session}")
    final = await ops.wait(run_id, timeout=WAIT)
    assert final is not None
    assert (final.status, final.end_reason, final.cancel_mode) == (
        RunStatus.CANCELLED,
        "cancelled",
        mode,
    )
    text, tool = ENDS[mode]
    assert final.output == text  # the text deltas, emitted to the run
    assert (result["tool"], result["model_calls"]) == (tool, 1)
    assert result.get("error") is None and not result["after_loop"]  # RunCancelled, suppressed
    return result


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("mode", ENDS)
async def test_run_stream_events_honours_each_mode_from_any_replica(
    runs: ReplicaRuns, ops: CancelBus, mode: str, where: str
) -> None:
    result = await stopped(runs, ops, "run_stream_events", where, mode)
    assert result["text"] == ENDS[mode][0]
    assert result["messages"] == MESSAGES[mode]  # events.all_messages(), as pydantic-ai keeps them


@pytest.mark.parametrize("mode", ENDS)
async def test_iter_honours_each_mode(runs: ReplicaRuns, ops: CancelBus, mode: str) -> None:
    """``agent.iter`` driven node by node, the model node streamed by the user's code: the
    checkpoints are the capability's hooks, however the run is driven."""
    result = await stopped(runs, ops, "iter", "other", mode)
    assert result["messages"] == MESSAGES[mode]  # agent_run.all_messages()


async def test_run_stream_stops_at_its_next_event(runs: ReplicaRuns, ops: CancelBus) -> None:
    """``run_stream``: its messages so far are on pydantic-ai's ``RunCancelled``, the cause of
    the bus's (``result.all_messages()`` does not have the interrupted response)."""
    result = await stopped(runs, ops, "run_stream", "other", "checkpoint")
    assert result["messages"] == MESSAGES["checkpoint"]


async def test_a_cancel_right_after_the_run_started_stops_it_at_its_first_checkpoint(
    runs: ReplicaRuns, ops: CancelBus
) -> None:
    """The bus run registers before pydantic-ai is called: a cancel then finds it. The model's
    first chunk waits for a gate; the run stops at the first event after the cancel."""
    session = f"{GATED}pai-{uuid.uuid4().hex[:8]}"
    run_id = await runs.start("pydantic-ai", session, api="run_stream_events")
    assert await runs.cancel("other", session, "checkpoint") == "stopping"
    await delivered(ops, run_id)
    await runs.open(f"start:{session}")
    result = await runs.result(session)
    for gate in ("model", "tool"):
        await runs.open(f"{gate}:{session}")

    assert result["text"] in ("", "Let me ") and not result["after_loop"]
    final = await ops.wait(run_id, timeout=WAIT)
    assert final is not None and final.status is RunStatus.CANCELLED
    assert final.output == result["text"]
