"""google-adk across OS processes: replicas serve ADK's own FastAPI app (``get_fast_api_app``);
a client streams an invocation from replica A's ``/run_sse``, and a caller without the library
cancels it with the route ``add_cancel_routes`` added, on A (the owner) or B (another replica), by
session or by run id, in each mode. ADK aborts the invocation its own way: its abort event ends
the client's stream and the session's history is as ADK leaves it. A sub-agent called through
``AgentTool`` (a nested Runner) is a child run, cancelled with it.

Cancel-before-start: the replicas (adk_replica.py) also call ``run_async`` and read the stream
only once the test opens a gate, so a session cancel can land between the two: it is held, and
the invocation asked for before it claims it as it registers; one asked for after it is spared."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from cancel_bus import CancelBus, Outcome, RunInfo, RunStatus, StopCause
from cancel_bus.integrations import google_adk
from cancel_bus.integrations._held import HeldCancels
from cancel_bus.integrations._sessions import bus_session
from node.embedded import EmbeddedServer

from ..helpers import WAIT, eventually
from .replica import TEXTING_LEASE, Replica, running
from .replica_client import WHERE, ReplicaRuns, delivered
from .story_support import ANSWER, ENDS, GATED, USER, gates_to_open

ADK_REPLICA = "tests.integrations.adk_replica"

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

    def session(self, name: str) -> str:
        return f"{name}-{uuid.uuid4().hex[:8]}"

    async def ask(self, session: str, on: Replica | None = None) -> None:
        """``run_async`` of an invocation of ``session`` called on A (or ``on``; adk_replica.py);
        its stream is not read (the invocation does not register) until :meth:`read`."""
        await self.post(on or self.a, "/adk/invocations", {"session": session})

    async def read(self, session: str, on: Replica | None = None) -> None:
        await self.open_on(on or self.a, f"read:{session}")

    async def open_on(self, replica: Replica, gate: str) -> None:
        await self.post(replica, f"/gates/{gate}")

    async def streamed(self, session: str, on: Replica | None = None) -> None:
        """Until the invocation :meth:`ask` started has yielded its first event."""
        await self.post(on or self.a, f"/adk/invocations/{session}/streaming")

    async def outcome(self, session: str, on: Replica | None = None) -> dict[str, Any]:
        """The events of the invocation :meth:`ask` started, once it ended."""
        path = f"/adk/invocations/{session}/result"
        outcome: dict[str, Any] = await self.post(on or self.a, path)
        return outcome

    async def cancel_session(
        self, where: str, session: str, mode: str, wait: bool = True
    ) -> httpx.Response:
        """The session cancel route of ADK's app on a replica."""
        path = f"/apps/story/users/{USER}/sessions/{session}/cancel"
        return await self.http.post(
            f"{self.at(where).url}{path}", json={"mode": mode, "wait": wait}
        )

    async def played(self, session: str, on: Replica | None = None) -> dict[str, Any]:
        response = await self.http.get(f"{(on or self.a).url}/stories/{session}")
        response.raise_for_status()
        played: dict[str, Any] = response.json()
        return played


@pytest.fixture
def namespace(replica_namespace: str) -> str:
    return replica_namespace


@pytest.fixture(scope="module")
def adk_replicas(redis_server: EmbeddedServer, replica_namespace: str) -> Iterator[list[Replica]]:
    """Replicas A and B of the frameworks (adk_replica.py: ADK invocations held before their
    first read too), as OS processes."""
    with running(ADK_REPLICA, 2, redis_server.url, replica_namespace) as replicas:
        yield replicas


@pytest.fixture
def runs(http: httpx.AsyncClient, adk_replicas: list[Replica]) -> AdkRuns:
    return AdkRuns(http, adk_replicas, "story", USER)


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


async def test_a_cancel_of_an_idle_session_is_not_found_after_the_grace(
    runs: AdkRuns, ops: CancelBus, raw_redis: aioredis.Redis
) -> None:
    """No invocation registers within the route's ``start_grace``: ``not_found``, and the hold
    is withdrawn (a later invocation finds none)."""
    session = runs.session("idle")
    answer = await runs.cancel_session("other", session, "checkpoint", wait=False)
    assert (answer.status_code, answer.json()["outcome"]) == (404, "not_found")
    assert not await held(raw_redis, hold_of(ops, session))


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


# -- cancel before start: the invocation asked for, not yet registered ---------------------------

GRACE = 3.0  # the start_grace of the tests that give cancel_session one of their own


def hold_of(ops: CancelBus, session: str) -> str:
    """The key of the cancel held for the session (in the namespace of the replicas)."""
    return HeldCancels(ops).key(bus_session("story", USER, session))


async def held(redis: aioredis.Redis, key: str) -> bool:
    return bool(await redis.exists(key))


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("mode", ENDS)
async def test_a_cancel_before_the_invocation_registered_is_held_and_aborts_it_at_its_start(
    runs: AdkRuns, ops: CancelBus, raw_redis: aioredis.Redis, mode: str, where: str
) -> None:
    """``run_async`` was called on A, its stream not read yet (the invocation registers at its
    first read): the cancel route finds no run and holds the cancel; the invocation claims it as
    it registers and ADK is aborted before the model is called; the cancel answers for it."""
    session = runs.session("early")
    await runs.ask(session)
    cancel = asyncio.create_task(runs.cancel_session(where, session, mode))
    await eventually(lambda: held(raw_redis, hold_of(ops, session)))

    await runs.read(session)

    answer = await asyncio.wait_for(cancel, WAIT)
    assert (answer.status_code, answer.json()["outcome"]) == (200, "cancelled")
    final = await ended(ops, answer.json()["run"]["run_id"], mode)
    assert final.session_id == session
    outcome = await runs.outcome(session)
    assert (outcome["error"], outcome["model_calls"]) == (None, 0)
    assert [event["error"] for event in outcome["events"]][-1:] == [ABORTED]


@pytest.mark.parametrize("mode", ENDS)
async def test_cancel_session_without_waiting_is_held_and_answers_for_the_invocation(
    runs: AdkRuns, ops: CancelBus, raw_redis: aioredis.Redis, mode: str
) -> None:
    """``google_adk.cancel_session`` on another node (the test's), ``wait=False``: held, claimed,
    and answered ``stopping`` (or ``cancelled``, if the invocation ended by then)."""
    session = runs.session("early")
    await runs.ask(session)
    cancel = asyncio.create_task(
        google_adk.cancel_session(ops, "story", USER, session, mode=mode, wait=False)
    )
    await eventually(lambda: held(raw_redis, hold_of(ops, session)))

    await runs.read(session)

    result = await asyncio.wait_for(cancel, WAIT)
    assert result.outcome in (Outcome.STOPPING, Outcome.CANCELLED) and result.run is not None
    final = await ended(ops, result.run.run_id, mode)
    assert final.session_id == session
    outcome = await runs.outcome(session)
    assert (outcome["error"], outcome["model_calls"]) == (None, 0)


@pytest.mark.parametrize("mode", ENDS)
async def test_a_held_cancel_spares_an_invocation_asked_for_after_it(
    runs: AdkRuns, ops: CancelBus, raw_redis: aioredis.Redis, mode: str
) -> None:
    """A stop pressed on an idle session, then a message: the invocation asked for after the
    cancel registers while the cancel is held, and is not touched; the cancel is not_found."""
    session = runs.session("later")
    cancel = asyncio.create_task(
        google_adk.cancel_session(ops, "story", USER, session, mode=mode, start_grace=GRACE)
    )
    await eventually(lambda: held(raw_redis, hold_of(ops, session)))

    await runs.ask(session)
    await runs.read(session)
    await runs.streamed(session)  # registered, past its claim: the model streams "Let me "
    assert not cancel.done()  # the cancel is still held

    for gate in ("model", "tool"):
        await runs.open(f"{gate}:{session}")
    outcome = await runs.outcome(session)
    assert (outcome["error"], outcome["model_calls"]) == (None, 2)
    assert ABORTED not in [event["error"] for event in outcome["events"]]
    assert outcome["events"][-1]["text"] == ANSWER
    assert (await asyncio.wait_for(cancel, WAIT)).outcome is Outcome.NOT_FOUND
    [run] = [r for r in await ops.list_runs("all", app_name="story") if r.session_id == session]
    assert (run.status, run.cancel_request) == (RunStatus.SUCCEEDED, None)


# How far off A's estimate of the Redis clock is made (bus.clock(): time.time() plus an offset
# taken at each heartbeat; a loop stalled 0.5 s while an answer came is off by as much). Clock
# comparisons between nodes misordered a cancel and an ask a few milliseconds apart.
SKEW = 0.25


@pytest.fixture
async def skewed(runs: AdkRuns) -> AsyncIterator[Callable[[float], Awaitable[None]]]:
    """Skews A's ``bus.clock()`` for the test; restored after it."""

    async def skew(seconds: float) -> None:
        await runs.post(runs.a, "/adk/clock-skew", {"seconds": seconds})

    try:
        yield skew
    finally:
        await skew(0.0)


async def test_a_held_cancel_is_ordered_by_redis_not_by_a_clock_running_ahead(
    runs: AdkRuns,
    ops: CancelBus,
    raw_redis: aioredis.Redis,
    skewed: Callable[[float], Awaitable[None]],
) -> None:
    """A's clock estimate runs ahead: the invocation was asked for before the cancel, though
    A's clock dates it after. The cancel still reaches it (compared by clock, it was missed:
    ``not_found``, and the invocation ran on)."""
    await skewed(SKEW)
    session = runs.session("early")
    await runs.ask(session)
    cancel = asyncio.create_task(runs.cancel_session("other", session, "immediate"))
    await eventually(lambda: held(raw_redis, hold_of(ops, session)))

    await runs.read(session)

    answer = await asyncio.wait_for(cancel, WAIT)
    assert (answer.status_code, answer.json()["outcome"]) == (200, "cancelled")
    assert (await runs.outcome(session))["model_calls"] == 0


async def test_a_held_cancel_is_ordered_by_redis_not_by_a_clock_running_behind(
    runs: AdkRuns,
    ops: CancelBus,
    raw_redis: aioredis.Redis,
    skewed: Callable[[float], Awaitable[None]],
) -> None:
    """A's clock estimate runs behind: the invocation was asked for after the cancel, though
    A's clock dates it before. It is not touched (compared by clock, it was aborted)."""
    await skewed(-SKEW)
    session = runs.session("later")
    cancel = asyncio.create_task(
        google_adk.cancel_session(ops, "story", USER, session, mode="immediate", start_grace=GRACE)
    )
    await eventually(lambda: held(raw_redis, hold_of(ops, session)))

    await runs.ask(session)
    await runs.read(session)
    await runs.streamed(session)
    assert not cancel.done()

    for gate in ("model", "tool"):
        await runs.open(f"{gate}:{session}")
    outcome = await runs.outcome(session)
    assert (outcome["error"], outcome["model_calls"]) == (None, 2)
    assert (await asyncio.wait_for(cancel, WAIT)).outcome is Outcome.NOT_FOUND


# -- double texting: a second invocation of a session, on another replica -----------------------

# The end reason of the run a new invocation of its session stopped, by the install's strategy.
STOPPED = {"interrupt": "interrupted", "rollback": "rolled_back"}


@pytest.fixture(scope="module")
def texting_pair(redis_server: EmbeddedServer, replica_namespace: str) -> Iterator[list[Replica]]:
    """Replicas A and B for the double-texting tests (each installs its strategy); a long
    lease: a fresh replica's first invocation imports what ADK loads lazily (some 350 modules)
    on its loop, which on a loaded 2-core machine stalls it past a 3 s lease."""
    url = redis_server.url
    with running(ADK_REPLICA, 2, url, replica_namespace, lease_ttl=TEXTING_LEASE) as pair:
        yield pair


async def runs_of(ops: CancelBus, session: str) -> list[RunInfo]:
    """The bus runs of the session (from any node), newest first."""
    found = await ops.list_runs(status="all", app_name="story", user_id=USER)
    return [run for run in found if run.session_id == session]


def streamed_text(outcome: dict[str, Any]) -> str:
    return "".join(event["text"] for event in outcome["events"] if event["partial"])


async def invoke_on_a_then_b(runs: AdkRuns, ops: CancelBus, session: str) -> RunInfo:
    """An invocation of ``session`` on A, streaming ("Let me ", then its model waits at
    ``model:<session>``), then one on B, read (registering); A's bus run, as it was before B's
    invocation was asked for."""
    await runs.ask(session)
    await runs.read(session)
    await runs.streamed(session)
    first = await ops.session_run("story", USER, session)
    assert first is not None
    assert (first.status, first.owner) == (RunStatus.RUNNING, runs.a.node_id)
    await runs.ask(session, on=runs.b)
    await runs.read(session, on=runs.b)
    return first


async def completes(runs: AdkRuns, ops: CancelBus, session: str, on: Replica) -> RunInfo:
    """The invocation of ``session`` on ``on``, held at its model's gate, plays its story to
    the end (the tool, then the answer); its bus run, ended."""
    for gate in ("model", "tool"):
        await runs.open_on(on, f"{gate}:{session}")
    outcome = await runs.outcome(session, on=on)
    assert (outcome["error"], outcome["model_calls"]) == (None, 2)
    assert [event["error"] for event in outcome["events"]] == [None] * len(outcome["events"])
    assert streamed_text(outcome) == "Let me look. " + ANSWER
    assert outcome["events"][-1]["text"] == ANSWER
    [run] = [run for run in await runs_of(ops, session) if run.owner == on.node_id]
    final = await ops.wait(run.run_id, timeout=WAIT)
    assert final is not None and (final.status, final.end_reason) == (
        RunStatus.SUCCEEDED,
        "completed",
    )
    return final


async def test_a_second_invocation_of_a_session_on_another_replica_is_rejected_by_default(
    runs: AdkRuns, ops: CancelBus
) -> None:
    """Replicas installed without a strategy (``reject``): ``run_async`` of a session whose
    invocation runs on A, called on B, fails with ``SessionBusy`` before its model is called
    and leaves no run; A's invocation goes on untouched."""
    session = runs.session("texting")
    first = await invoke_on_a_then_b(runs, ops, session)

    rejected = await runs.outcome(session, on=runs.b)
    assert rejected["error"] == (
        f"SessionBusy: session story/{USER}/{session} already has an active run {first.run_id}"
    )
    assert (rejected["events"], rejected["model_calls"]) == ([], 0)
    still = await ops.get_run(first.run_id)
    assert still is not None and (still.status, still.cancel_requested_at) == (
        RunStatus.RUNNING,
        None,
    )
    assert (await completes(runs, ops, session, runs.a)).run_id == first.run_id
    assert [run.run_id for run in await runs_of(ops, session)] == [first.run_id]


@pytest.mark.parametrize(
    ("strategy", "mode"),
    [
        ("enqueue", "checkpoint"),
        ("interrupt", "checkpoint"),
        ("rollback", "checkpoint"),
        ("interrupt", "immediate"),
    ],
)
async def test_a_second_invocation_of_a_session_on_another_replica_follows_the_install_strategy(
    http: httpx.AsyncClient,
    texting_pair: list[Replica],
    ops: CancelBus,
    strategy: str,
    mode: str,
) -> None:
    """``install(bus, multitask_strategy=..., interrupt_mode=...)`` on both replicas:
    ``run_async`` of a session whose invocation runs on A, called on B, waits queued behind it
    until it ends (``enqueue``), or stops it (``interrupt``, ``rollback``: at its next event;
    ``immediate``: at once, its model's wait cut off; A's run ends so, asked by B's), then runs
    on B."""
    for replica in texting_pair:
        await replica.install_multitask(http, strategy, mode)
    runs = AdkRuns(http, texting_pair, "story", USER)
    session = runs.session("texting")
    first = await invoke_on_a_then_b(runs, ops, session)
    if strategy == "enqueue":
        second, streamed = await queued_behind(runs, ops, session, first)
    else:
        second, streamed = await interrupting(runs, ops, session, first, strategy, mode)
    a_outcome = await runs.outcome(session)  # A's invocation, aborted by ADK
    assert (a_outcome["error"], a_outcome["model_calls"]) == (None, 1)
    assert streamed_text(a_outcome) == streamed
    assert [event["error"] for event in a_outcome["events"]][-1:] == [ABORTED]
    stopped = await ops.get_run(first.run_id)
    assert stopped is not None and stopped.finished_at is not None
    assert second.started_at is not None and stopped.finished_at <= second.started_at
    assert (second.status, second.owner) == (RunStatus.RUNNING, runs.b.node_id)
    assert (await completes(runs, ops, session, runs.b)).run_id == second.run_id


async def queued_behind(
    runs: AdkRuns, ops: CancelBus, session: str, first: RunInfo
) -> tuple[RunInfo, str]:
    """``enqueue``: B's invocation is recorded queued while A's goes on, its model not called;
    A's is cancelled through the bus (``immediate``: its model's wait interrupted), then B's
    starts. -> B's run, started; what A's streamed."""

    async def queued() -> RunInfo | None:
        found = await runs_of(ops, session)
        return next((run for run in found if run.status is RunStatus.QUEUED), None)

    waiting = await eventually(queued)
    assert (waiting.owner, waiting.interrupted) == (runs.b.node_id, None)
    active = await ops.session_run("story", USER, session)
    assert active is not None and (active.run_id, active.status) == (
        first.run_id,
        RunStatus.RUNNING,
    )
    assert active.cancel_requested_at is None
    assert (await runs.played(session, on=runs.b))["model_calls"] == 0

    stop = await ops.cancel(first.run_id, mode="immediate", timeout=WAIT)
    assert stop.outcome is Outcome.CANCELLED
    await runs.streamed(session, on=runs.b)  # its turn: B's invocation streams "Let me "
    second = await ops.get_run(waiting.run_id)
    assert second is not None and second.interrupted is None
    assert await ops.session_run("story", USER, session) == second
    return second, "Let me "


async def interrupting(
    runs: AdkRuns, ops: CancelBus, session: str, first: RunInfo, strategy: str, mode: str
) -> tuple[RunInfo, str]:
    """``interrupt``/``rollback``: B's invocation cancels A's run (in ``mode``, its cause the
    strategy) and waits for its end, its model not called; ``checkpoint``: A's model goes on,
    and ADK aborts A's invocation at its next event; ``immediate``: ADK aborts it at once, its
    model's wait cut off. Then B's starts, naming the run it stopped. -> B's run, started;
    what A's streamed."""
    if mode == "checkpoint":
        await delivered(ops, first.run_id)
        stopping = await ops.get_run(first.run_id)
        assert stopping is not None and stopping.status is RunStatus.RUNNING
        assert (stopping.cancel_mode, stopping.cancel_cause) == (mode, StopCause(strategy))
        assert (await runs.played(session, on=runs.b))["model_calls"] == 0
        await runs.open(f"model:{session}")  # A's model streams "look. ": its next event
    await runs.streamed(session, on=runs.b)
    second = await ops.session_run("story", USER, session)
    assert second is not None and second.interrupted == first.run_id
    stopped = await ops.get_run(first.run_id)
    assert stopped is not None
    assert (stopped.status, stopped.end_reason, stopped.cancel_cause, stopped.requested_by) == (
        RunStatus.CANCELLED,
        STOPPED[strategy],
        StopCause(strategy),
        second.run_id,
    )
    assert stopped.cancel_mode == mode
    streamed = "Let me look. " if mode == "checkpoint" else "Let me "
    assert stopped.output == (streamed if strategy == "interrupt" else "")  # rolled back
    return second, streamed
