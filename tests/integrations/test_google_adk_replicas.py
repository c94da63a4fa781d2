"""google-adk across OS processes: replicas serve ADK's own FastAPI app (``get_fast_api_app``);
a client streams an invocation from replica A's ``/run_sse``, and a caller without the library
cancels it with the route ``add_cancel_routes`` added, on A (the owner) or B (another replica), by
session or by run id, in each mode. ADK aborts the invocation its own way: its abort event ends
the client's stream and the session's history is as ADK leaves it. A sub-agent called through
``AgentTool`` (a nested Runner) is a child run, cancelled with it."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import httpx
import pytest

from cancel_bus import CancelBus, RunInfo, RunStatus, StopCause

from ..helpers import WAIT, eventually
from .replica import Replica
from .replica_client import WHERE, ReplicaRuns, delivered
from .story_support import ENDS, GATED, USER, gates_to_open

ABORTED = "INVOCATION_ABORTED"
# The session's history ADK keeps (author, text, calls, responses, error) for each mode: the
# streamed text is not stored; a completed turn is.
HISTORY = {
    "checkpoint": [("user",), ("story", "", [], [], ABORTED)],
    "immediate": [("user",), ("story", "", [], [], ABORTED)],
    "after_turn": [
        ("user",),
        ("story", "Let me look. ", ["lookup"], [], None),
        ("story", "", [], ["lookup"], None),
        ("story", "", [], [], ABORTED),
    ],
}


def shown(event: dict[str, Any]) -> tuple[Any, ...]:
    """An ADK event (as JSON) as (author, text, calls, responses, error code)."""
    if event["author"] == "user":
        return ("user",)
    parts = (event.get("content") or {}).get("parts") or []
    return (
        event["author"],
        "".join(part.get("text") or "" for part in parts),
        [part["functionCall"]["name"] for part in parts if part.get("functionCall")],
        [part["functionResponse"]["name"] for part in parts if part.get("functionResponse")],
        event.get("errorCode"),
    )


class Invocation:
    """A client of A's ``/run_sse``: the session's name is its message."""

    def __init__(self, http: httpx.AsyncClient, replica: Replica, app: str, session: str):
        self.http, self.replica, self.app, self.session = http, replica, app, session
        self.events: list[dict[str, Any]] = []
        self.streaming = asyncio.Event()
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        body = {
            "app_name": self.app,
            "user_id": USER,
            "session_id": self.session,
            "new_message": {"role": "user", "parts": [{"text": self.session}]},
            "streaming": True,
        }
        async with self.http.stream("POST", f"{self.replica.url}/run_sse", json=body) as stream:
            async for line in stream.aiter_lines():
                if line.startswith("data:"):
                    self.events.append(json.loads(line.removeprefix("data:")))
                    self.streaming.set()

    async def ended(self) -> list[dict[str, Any]]:
        await asyncio.wait_for(self.task, WAIT)
        return self.events

    @property
    def text(self) -> str:
        return "".join(shown(e)[1] for e in self.events if e.get("partial"))

    async def history(self) -> list[tuple[Any, ...]]:
        url = f"{self.replica.url}/apps/{self.app}/users/{USER}/sessions/{self.session}"
        response = await self.http.get(url)
        response.raise_for_status()
        return [shown(event) for event in response.json()["events"]]


class AdkRuns(ReplicaRuns):
    def invoke(self, app: str = "story", name: str = "adk") -> Invocation:
        return Invocation(self.http, self.a, app, f"{name}-{uuid.uuid4().hex[:8]}")

    async def cancel_route(
        self, where: str, invocation: Invocation, mode: str, run_id: str | None = None
    ) -> httpx.Response:
        """The cancel route of ADK's app on a replica: by session, or by the bus run's id."""
        path = f"/apps/{invocation.app}/users/{USER}/sessions/{invocation.session}/cancel"
        if run_id is not None:
            path = f"/runs/{run_id}/cancel"
        return await self.http.post(
            f"{self.at(where).url}{path}", json={"mode": mode, "wait": False}
        )

    async def played(self, session: str) -> dict[str, Any]:
        response = await self.http.get(f"{self.a.url}/stories/{session}")
        response.raise_for_status()
        played: dict[str, Any] = response.json()
        return played


@pytest.fixture
def namespace(replica_namespace: str) -> str:
    return replica_namespace


@pytest.fixture
def runs(http: httpx.AsyncClient, frameworks_replicas: list[Replica]) -> AdkRuns:
    return AdkRuns(http, frameworks_replicas, "story", USER)


async def record(ops: CancelBus, invocation: Invocation) -> RunInfo:
    """The invocation's bus run, found by its session key (from any node), once registered."""
    found: list[RunInfo] = []

    async def registered() -> bool:
        run = await ops.session_run(invocation.app, USER, invocation.session)
        found[:] = [run] if run is not None else []
        return bool(found)

    await eventually(registered)
    return found[0]


async def ended(ops: CancelBus, run_id: str, mode: str = "checkpoint") -> RunInfo:
    final = await ops.wait(run_id, timeout=WAIT)
    assert final is not None
    assert (final.status, final.end_reason, final.cancel_mode) == (
        RunStatus.CANCELLED,
        "cancelled",
        mode,
    )
    return final


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("mode", ENDS)
async def test_the_cancel_route_on_any_replica_aborts_the_invocation_in_each_mode(
    runs: AdkRuns, ops: CancelBus, mode: str, where: str
) -> None:
    invocation = runs.invoke()
    await asyncio.wait_for(invocation.streaming.wait(), WAIT)  # "Let me ", then the model waits

    answer = await runs.cancel_route(where, invocation, mode)
    assert (answer.status_code, answer.json()["outcome"]) == (202, "stopping")

    run_id = answer.json()["run"]["run_id"]
    await delivered(ops, run_id)
    for gate in gates_to_open(invocation.session, mode):
        await runs.open(gate)
    events = await invocation.ended()
    text, tool = ENDS[mode]
    assert invocation.text == text and shown(events[-1])[-1] == ABORTED  # ADK's abort event
    assert await runs.played(invocation.session) == {"model_calls": 1, "tool": tool}
    assert await invocation.history() == HISTORY[mode]
    assert (await ended(ops, run_id, mode)).output == text


async def test_the_cancel_route_by_run_id_on_another_replica(runs: AdkRuns, ops: CancelBus) -> None:
    invocation = runs.invoke()
    await asyncio.wait_for(invocation.streaming.wait(), WAIT)

    run = await record(ops, invocation)
    answer = await runs.cancel_route("other", invocation, "immediate", run_id=run.run_id)
    assert (answer.status_code, answer.json()["outcome"]) == (202, "stopping")

    assert shown((await invocation.ended())[-1])[-1] == ABORTED
    await ended(ops, answer.json()["run"]["run_id"], "immediate")
    for gate in ("model", "tool"):
        await runs.open(f"{gate}:{invocation.session}")


async def test_a_cancel_right_after_the_invocation_started_aborts_it_at_its_first_event(
    runs: AdkRuns, ops: CancelBus
) -> None:
    """The bus run registers before ADK is called; the model's first chunk waits for a gate.
    A cancel then finds the run, and ADK aborts at the first event after it."""
    invocation = runs.invoke(name=GATED.rstrip("-"))
    run = await record(ops, invocation)

    answer = await runs.cancel_route("other", invocation, "checkpoint")
    assert answer.json()["outcome"] == "stopping"

    await delivered(ops, run.run_id)
    await runs.open(f"start:{invocation.session}")
    events = await invocation.ended()
    assert invocation.text in ("", "Let me ") and shown(events[-1])[-1] == ABORTED
    await ended(ops, run.run_id)
    for gate in ("model", "tool"):
        await runs.open(f"{gate}:{invocation.session}")


async def test_a_cancel_of_an_idle_session_is_not_found(runs: AdkRuns) -> None:
    path = f"/apps/story/users/{USER}/sessions/idle-{uuid.uuid4().hex[:8]}/cancel"
    answer = await runs.http.post(f"{runs.b.url}{path}", json={"wait": False})
    assert (answer.status_code, answer.json()["outcome"]) == (404, "not_found")


async def test_cancelling_an_invocation_stops_its_sub_agents_run_first(
    runs: AdkRuns, ops: CancelBus
) -> None:
    """The boss asks its sub-agent ``helper`` through ``AgentTool``: a nested Runner, a bus run
    of its own on A, the boss's child. A cancel of the boss's session on B cancels the tree: the
    helper is aborted at its next event (cause ``parent``), then the boss."""
    invocation = runs.invoke(app="boss", name="boss")
    boss = await record(ops, invocation)

    async def helper_running() -> bool:
        return bool(await ops.children(boss.run_id))

    await eventually(helper_running)
    [helper] = await ops.children(boss.run_id)
    assert (helper.status, helper.owner) == (RunStatus.RUNNING, runs.a.node_id)
    assert helper.session_id != invocation.session  # AgentTool's session of its own

    answer = await runs.cancel_route("other", invocation, "checkpoint")
    assert [d["run"]["run_id"] for d in answer.json()["descendants"]] == [helper.run_id]

    await delivered(ops, helper.run_id)
    for gate in ("model", "tool"):  # the helper runs unary: its first event is its whole turn
        await runs.open(f"{gate}:{invocation.session}")
    events = await invocation.ended()
    assert shown(events[-1])[-1] == ABORTED
    stopped = await ended(ops, helper.run_id)
    assert (stopped.cancel_cause, stopped.output) == (StopCause.PARENT, "Let me look. ")
    await ended(ops, boss.run_id)
