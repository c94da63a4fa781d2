"""AG-UI (trpc-agent's AG-UI service) across OS processes: a client streams a run from replica A.
The AG-UI abort (the client closing its stream) stops it on A; replica B stops it through the bus
in each mode, or through trpc-agent's own API."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import httpx
import pytest
from trpc_agent_sdk.cancel._session_utils import _CANCELING_SUFFIX

from cancel_bus import CancelBus, RunInfo, RunStatus

from ..helpers import WAIT, eventually
from .replica import Replica
from .trpc_support import APP

pytest.importorskip("ag_ui", reason="AG-UI needs the ag-ui extra (ag-ui-protocol)")

MARKER = f"\n\n{_CANCELING_SUFFIX}"


@pytest.fixture
def namespace(replica_namespace: str) -> str:
    return replica_namespace


class AgUiRun:
    """An AG-UI client streaming a run from a replica, in the background."""

    def __init__(self, http: httpx.AsyncClient, replica: Replica, text: str) -> None:
        self.thread = f"t-{uuid.uuid4().hex[:8]}"
        self.user = f"thread_user_{self.thread}"  # trpc-agent's AG-UI default user
        self.events: list[dict[str, Any]] = []
        self.text = ""
        self.streaming = asyncio.Event()
        body = {
            "threadId": self.thread,
            "runId": uuid.uuid4().hex,
            "messages": [{"id": "m1", "role": "user", "content": text}],
            "tools": [],
            "context": [],
            "state": {},
            "forwardedProps": {},
        }
        self.done = asyncio.create_task(self._consume(http, f"{replica.url}/agui", body))

    async def _consume(self, http: httpx.AsyncClient, url: str, body: dict[str, Any]) -> None:
        headers = {"accept": "text/event-stream"}
        async with http.stream("POST", url, json=body, headers=headers) as response:
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                event = json.loads(line.removeprefix("data:"))
                self.events.append(event)
                if event["type"] == "TEXT_MESSAGE_CONTENT":
                    self.text += event["delta"]
                    self.streaming.set()

    @property
    def ended_cancelled(self) -> bool:
        """The stream ended as trpc-agent's AG-UI service ends a cancelled run."""
        last = self.events[-1]
        return (last["type"], last.get("code")) == ("RUN_ERROR", "run_cancelled")

    async def started(self) -> None:
        await asyncio.wait_for(self.streaming.wait(), WAIT)

    async def record(self, ops: CancelBus) -> RunInfo:
        """The bus record of the run (trpc-agent's, of the thread's session)."""
        [run] = await ops.list_runs(status="all", app_name=APP, user_id=self.user, limit=1)
        return run


async def saved(http: httpx.AsyncClient, replica: Replica, run: AgUiRun) -> str:
    response = await http.get(f"{replica.url}/trpc/sessions/{run.user}/{run.thread}")
    text: str = response.json()["saved"]
    return text


async def test_the_ag_ui_abort_stops_the_run_on_the_replica_serving_it(
    http: httpx.AsyncClient, trpc_replicas: list[Replica], ops: CancelBus
) -> None:
    a, _ = trpc_replicas
    run = AgUiRun(http, a, "stream")
    await run.started()

    run.done.cancel()  # the client closes its stream

    async def stopped() -> bool:
        return (await run.record(ops)).status is RunStatus.CANCELLED

    await eventually(stopped)
    final = await run.record(ops)
    assert (final.end_reason, final.owner) == ("cancelled", a.node_id)
    text = await saved(http, a, run)
    assert text.startswith("t0 ") and text.endswith(MARKER)  # trpc-agent kept the partial text


# What a "turns" run (see StreamingAgent) streams, stopped in its first turn at the gate.
TURN_TEXT = {"checkpoint": "Let me ", "immediate": "Let me ", "after_turn": "Let me look. "}


@pytest.mark.parametrize("mode", TURN_TEXT)
async def test_another_replica_stops_an_ag_ui_run_in_each_mode(
    http: httpx.AsyncClient, trpc_replicas: list[Replica], ops: CancelBus, mode: str
) -> None:
    a, b = trpc_replicas
    run = AgUiRun(http, a, "turns")
    await run.started()  # "Let me ", then held at the gate

    body = {"app": APP, "user": run.user, "session": run.thread, "mode": mode, "wait": False}
    assert (await http.post(f"{b.url}/bus/cancel", json=body)).json()["outcome"] == "stopping"

    async def delivered() -> bool:
        return (await run.record(ops)).cancel_delivered_at is not None

    await eventually(delivered)
    if mode != "immediate":  # immediate interrupts the gate's await itself
        await http.post(f"{a.url}/gates/{run.thread}")
    await asyncio.wait_for(run.done, WAIT)

    assert run.text == TURN_TEXT[mode] and run.ended_cancelled
    final = await run.record(ops)
    assert (final.status, final.end_reason, final.cancel_mode) == (
        RunStatus.CANCELLED,
        "cancelled",
        mode,
    )
    assert (await saved(http, a, run)).endswith(_CANCELING_SUFFIX)
    await http.post(f"{a.url}/gates/{run.thread}")


async def test_trpc_agents_cancel_api_on_another_replica_stops_an_ag_ui_run(
    http: httpx.AsyncClient, trpc_replicas: list[Replica], ops: CancelBus
) -> None:
    a, b = trpc_replicas
    run = AgUiRun(http, a, "stream")
    await run.started()

    body = {"user": run.user, "session": run.thread}
    assert (await http.post(f"{b.url}/trpc/cancel", json=body)).json()["answer"] is True

    await asyncio.wait_for(run.done, WAIT)
    assert run.ended_cancelled and run.text.startswith("t0 ")
    final = await run.record(ops)
    assert (final.status, final.end_reason) == (RunStatus.CANCELLED, "cancelled")
