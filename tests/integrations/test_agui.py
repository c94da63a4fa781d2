"""AG-UI (trpc-agent's AG-UI service) across OS processes: a client streams a run from replica A.
The AG-UI abort (the client closing its stream) stops it on A; replica B stops it through the bus
in each mode, or through trpc-agent's own API. Double texting: a second AG-UI run of the thread,
sent to replica B, follows the replicas' ``multitask_strategy``."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any, NamedTuple

import httpx
import pytest
from trpc_agent_sdk.cancel._session_utils import _CANCELING_SUFFIX

from cancel_bus import CancelBus, Outcome, RunInfo, RunStatus, StopCause
from cancel_bus.integrations.trpc_agent import CANCEL_REASON
from node.embedded import EmbeddedServer

from ..helpers import WAIT, eventually
from .conftest import TRPC_REPLICA
from .replica import TEXTING_LEASE, Replica, running
from .trpc_support import APP

pytest.importorskip("ag_ui", reason="AG-UI needs the ag-ui extra (ag-ui-protocol)")

MARKER = f"\n\n{_CANCELING_SUFFIX}"


@pytest.fixture
def namespace(replica_namespace: str) -> str:
    return replica_namespace


class AgUiRun:
    """An AG-UI client streaming a run from a replica, in the background."""

    def __init__(
        self, http: httpx.AsyncClient, replica: Replica, text: str, thread: str | None = None
    ) -> None:
        self.thread = thread or f"t-{uuid.uuid4().hex[:8]}"  # a new thread, or a run of ``thread``
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

    @property
    def types(self) -> list[str]:
        return [event["type"] for event in self.events]

    async def started(self) -> None:
        await asyncio.wait_for(self.streaming.wait(), WAIT)

    async def closed(self) -> None:
        """Wait for the server to close the stream (see ``CLOSE``)."""
        await asyncio.wait_for(asyncio.shield(self.done), CLOSE)

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


# -- double texting: a second AG-UI run of a thread, on another replica ---------------------------
#
# trpc-agent's AG-UI service sends RUN_STARTED before it calls ``Runner.run_async``, so what the
# strategy does shows after it: ``reject`` fails the run (``SessionBusy``, which the service
# reports as RUN_ERROR ``BACKGROUND_EXECUTION_ERROR``); ``enqueue`` holds the stream at
# RUN_STARTED while the run is queued; ``interrupt``/``rollback`` stop the thread's run on A (its
# stream ends as any cancelled run's: RUN_ERROR ``run_cancelled``), then run.
#
# The service's stream generator calls ``cancel.cancel_run(app, user, thread)`` in its
# ``finally``, at the end of every stream: finished, cancelled or failed. As the thread's session
# cancel on every replica it stopped the thread's *other* run (the rejected stream on B stopped
# A's; the end of A's stream stopped the run B started after it); installed, it stops only the
# runs of its own stream (``_trpc_agui.py``). Each test checks the victim's record for it:
# cancelled with reason ``CANCEL_REASON``.

CLOSE = 2 * WAIT  # a stream's end: the service's final cancel_run may wait cancel_wait_timeout=WAIT
TURNS = "Let me look. It is 42."  # all a "turns" run streams (see StreamingAgent)


class CancelledByAnotherStream(AssertionError):
    """A run stopped by the ``cancel_run`` at the end of another AG-UI stream of its thread."""


class Texting(NamedTuple):
    a: Replica
    b: Replica
    strategy: str


@pytest.fixture(scope="module")
def texting_pair(redis_server: EmbeddedServer, replica_namespace: str) -> Iterator[list[Replica]]:
    """Replicas A and B for the double-texting tests (each installs its strategy)."""
    url = redis_server.url
    with running(TRPC_REPLICA, 2, url, replica_namespace, lease_ttl=TEXTING_LEASE) as pair:
        yield pair


@pytest.fixture
async def texting(
    request: pytest.FixtureRequest, texting_pair: list[Replica], http: httpx.AsyncClient
) -> Texting:
    """A and B installed with the strategy ``request.param``."""
    for replica in texting_pair:
        await replica.install_multitask(http, request.param)
    a, b = texting_pair
    return Texting(a, b, request.param)


async def run_on(ops: CancelBus, run: AgUiRun, replica: Replica) -> RunInfo | None:
    """The bus record of the thread's run owned by ``replica`` (queued ones too)."""
    found = await ops.list_runs(status="all", app_name=APP, user_id=run.user)
    return next((info for info in found if info.owner == replica.node_id), None)


async def ended(ops: CancelBus, run_id: str) -> RunInfo:
    info = await ops.get_run(run_id)
    assert info is not None and not info.is_active, info
    return info


def not_stopped_by_a_stream_end(info: RunInfo, stream: AgUiRun) -> None:
    """Raise :class:`CancelledByAnotherStream` if trpc-agent's ``cancel_run`` stopped the run."""
    if info.cancel_reason == CANCEL_REASON:
        raise CancelledByAnotherStream(
            f"run {info.run_id} ended {info.status}/{info.end_reason} by {info.cancel_reason!r} "
            f"(cause {info.cancel_cause}); its stream: {stream.types}"
        )


def finished(stream: AgUiRun) -> bool:
    """The stream shows a whole "turns" run, ended RUN_FINISHED."""
    types = stream.types
    return stream.text == TURNS and (types[0], types[-1]) == ("RUN_STARTED", "RUN_FINISHED")


@pytest.mark.parametrize("texting", ["reject"], indirect=True)
async def test_reject_fails_a_second_ag_ui_run_of_a_thread_on_another_replica(
    http: httpx.AsyncClient, texting: Texting, ops: CancelBus
) -> None:
    """B's client sees its run start and fail (RUN_ERROR naming the thread's active run); A's
    stream goes on to its end."""
    a, b, _ = texting
    first = AgUiRun(http, a, "turns")
    await first.started()  # "Let me ", then held at A's gate
    holder = await ops.session_run(APP, first.user, first.thread)
    assert holder is not None and holder.owner == a.node_id

    second = AgUiRun(http, b, "turns", thread=first.thread)
    await second.closed()  # refused while A's run goes on
    await http.post(f"{a.url}/gates/{first.thread}")
    await first.closed()

    assert second.types == ["RUN_STARTED", "RUN_ERROR"]
    error = second.events[-1]
    assert error["code"] == "BACKGROUND_EXECUTION_ERROR"  # the service's code for any exception
    assert error["message"] == (
        f"session {APP}/{first.user}/{first.thread} already has an active run {holder.run_id}"
    )  # SessionBusy's
    assert await run_on(ops, first, b) is None  # B registered no run: nothing ran there
    info = await ended(ops, holder.run_id)
    not_stopped_by_a_stream_end(info, first)
    assert finished(first), first.events
    assert (info.status, info.end_reason, info.cancel_requested_at) == (
        RunStatus.SUCCEEDED,
        "completed",
        None,
    )


@pytest.mark.parametrize("texting", ["interrupt", "rollback"], indirect=True)
async def test_a_second_ag_ui_run_of_a_thread_on_another_replica_stops_the_first_and_runs(
    http: httpx.AsyncClient, texting: Texting, ops: CancelBus
) -> None:
    """``interrupt``/``rollback``: A's stream ends as a cancelled run's, its record names B's run
    as the one that stopped it; B's stream runs to its end."""
    a, b, strategy = texting
    first = AgUiRun(http, a, "stream")  # a checkpoint before every chunk
    await first.started()
    holder = await ops.session_run(APP, first.user, first.thread)
    assert holder is not None

    second = AgUiRun(http, b, "turns", thread=first.thread)  # held at B's gate after "Let me "
    await first.closed()

    async def taken_over() -> RunInfo | None:  # B's run holds the thread once A's has ended
        info = await ops.session_run(APP, first.user, first.thread)
        return info if info is not None and info.owner == b.node_id else None

    now = await eventually(taken_over)
    await http.post(f"{b.url}/gates/{first.thread}")
    await second.closed()

    # A's client: the text so far, then the end of a cancelled run (no RUN_FINISHED)
    assert first.text.startswith("t0 ") and first.ended_cancelled, first.types
    assert "RUN_FINISHED" not in first.types
    replaced = await ended(ops, holder.run_id)
    follow_up = await run_on(ops, first, b)
    assert follow_up is not None
    cause, reason = {
        "interrupt": (StopCause.INTERRUPT, "interrupted"),
        "rollback": (StopCause.ROLLBACK, "rolled_back"),
    }[strategy]
    assert (replaced.status, replaced.end_reason, replaced.cancel_cause) == (
        RunStatus.CANCELLED,
        reason,
        cause,
    )
    assert replaced.requested_by == follow_up.run_id
    # B's client: the whole run
    info = await ended(ops, follow_up.run_id)
    assert info.interrupted == holder.run_id
    not_stopped_by_a_stream_end(info, second)
    assert now is not None and now.run_id == info.run_id
    assert finished(second), second.events
    assert (info.status, info.end_reason) == (RunStatus.SUCCEEDED, "completed")
    # trpc-agent kept A's partial text (a final cancel_run of A's stream that found B's run
    # would clear A's pending tool calls: an event of no text saved after it)
    assert (await saved(http, a, first)).endswith(MARKER)
    assert await ops.session_run(APP, first.user, first.thread) is None


@pytest.mark.parametrize("first_ends", ["finishes", "cancelled"])
@pytest.mark.parametrize("texting", ["enqueue"], indirect=True)
async def test_enqueue_holds_a_second_ag_ui_run_of_a_thread_until_the_first_ends(
    http: httpx.AsyncClient, texting: Texting, ops: CancelBus, first_ends: str
) -> None:
    """B's client sees RUN_STARTED, then nothing while its run is queued behind A's; once A's run
    ends (finished, or cancelled), B's runs to its end."""
    a, b, _ = texting
    first = AgUiRun(http, a, "turns")
    await first.started()  # "Let me ", then held at A's gate
    holder = await ops.session_run(APP, first.user, first.thread)
    assert holder is not None

    second = AgUiRun(http, b, "turns", thread=first.thread)

    async def queued() -> RunInfo | None:
        info = await run_on(ops, first, b)
        return info if info is not None and info.status is RunStatus.QUEUED else None

    waiting = await eventually(queued)
    assert second.types == ["RUN_STARTED"] and not second.done.done()  # the stream waits
    now = await ops.session_run(APP, first.user, first.thread)
    assert now is not None and now.run_id == holder.run_id  # A's run still holds the thread

    if first_ends == "finishes":
        await http.post(f"{a.url}/gates/{first.thread}")
    else:  # interrupts its wait at the gate
        stop = await ops.cancel(holder.run_id, mode="immediate", timeout=WAIT)
        assert stop.outcome is Outcome.CANCELLED
    await first.closed()
    await http.post(f"{b.url}/gates/{first.thread}")
    await second.closed()

    first_info = await ended(ops, holder.run_id)
    if first_ends == "finishes":
        assert finished(first), first.events
        assert (first_info.status, first_info.end_reason) == (RunStatus.SUCCEEDED, "completed")
    else:
        assert first.text == "Let me " and first.ended_cancelled, first.events
        assert (first_info.status, first_info.end_reason) == (RunStatus.CANCELLED, "cancelled")
    info = await ended(ops, waiting.run_id)
    not_stopped_by_a_stream_end(info, second)
    assert finished(second), second.events
    assert (info.status, info.end_reason, info.interrupted) == (
        RunStatus.SUCCEEDED,
        "completed",
        None,
    )
    assert info.started_at is not None and first_info.finished_at is not None
    assert info.started_at >= first_info.finished_at  # B's run started once A's had ended
