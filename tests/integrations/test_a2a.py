"""A2A (a2a-sdk 0.3) across OS processes: trpc-agent's A2A service on replicas A and B (and a
third that dies), one real Redis, driven by the real a2a-sdk client. The task runs on A; the
requests go to A (the owner) or B (another replica). What the spec's cancel section asks, on
every replica; and an A2A call made inside a run (``send_message``), canceled with the run."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from a2a.client import Client
from a2a.client.errors import A2AClientJSONRPCError
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.tasks import TaskUpdater
from a2a.types import (
    MessageSendParams,
    Part,
    Role,
    Task,
    TaskArtifactUpdateEvent,
    TaskIdParams,
    TaskNotCancelableError,
    TaskNotFoundError,
    TaskQueryParams,
    TaskState,
    TaskStatusUpdateEvent,
    TextPart,
)
from trpc_agent_sdk.configs import RunConfig
from trpc_agent_sdk.events import AgentCancelledEvent, Event
from trpc_agent_sdk.runners import Runner
from trpc_agent_sdk.server.a2a import TrpcRemoteA2aAgent
from trpc_agent_sdk.sessions import InMemorySessionService
from trpc_agent_sdk.types import Content
from trpc_agent_sdk.types import Part as TrpcPart

from cancel_bus import CancelBus, Outcome, RunHandle, RunInfo, RunStatus, StopCause
from cancel_bus.integrations import trpc_agent
from cancel_bus.integrations._a2a_calls import PHASE
from cancel_bus.integrations._a2a_runs import (
    CANCEL_PENDING,
    LEAKED_EVENT,
    OWNER_LOST,
    TASK_APP,
    task_session,
)
from cancel_bus.integrations.a2a import BusRequestHandler, BusTaskStore, send_message
from node.embedded import EmbeddedServer

from ..conftest import BusFactory
from ..helpers import WAIT, eventually
from .a2a_reads import read_again, reads
from .a2a_support import CANCEL_TIMEOUT, Stream, client, message, streaming, submit
from .conftest import TRPC_REPLICA
from .docs_examples import example
from .replica import Replica, running
from .tree_support import Call, children, remote_call
from .trpc_support import APP, BOSS, GATED

WHERE = ["owner", "other"]


@pytest.fixture
def namespace(replica_namespace: str) -> str:
    return replica_namespace


class Tasks:
    """The A2A side of replicas A and B."""

    def __init__(self, http: httpx.AsyncClient, replicas: list[Replica]) -> None:
        self.http = http
        self.a, self.b = replicas

    def client(self, where: str = "owner", *, streaming: bool = True) -> Client:
        replica = self.a if where == "owner" else self.b
        return client(self.http, f"{replica.url}/a2a/", streaming=streaming)

    async def states(self, task_id: str) -> list[TaskState]:
        """The task's state on every replica (tasks/get)."""
        tasks = [await self.get(task_id, where) for where in WHERE]
        return [task.status.state for task in tasks]

    async def get(self, task_id: str, where: str = "other") -> Task:
        return await self.client(where).get_task(TaskQueryParams(id=task_id))

    async def cancel(self, task_id: str, where: str) -> Task:
        return await self.client(where).cancel_task(TaskIdParams(id=task_id))

    async def refused(self, task_id: str, where: str) -> int:
        """The JSON-RPC error code a tasks/cancel gets."""
        with pytest.raises(A2AClientJSONRPCError) as refused:
            await self.cancel(task_id, where)
        code: int = refused.value.error.code
        return code

    async def open(self, gate: str) -> None:
        response = await self.http.post(f"{self.a.url}/gates/{gate}")
        response.raise_for_status()

    async def reads(self, task_id: str) -> int:
        return await reads(self.http, [self.a.url, self.b.url], task_id)

    async def read_again(self, task_id: str, before: int) -> None:
        await read_again(self.http, [self.a.url, self.b.url], task_id, before)


@pytest.fixture
def tasks(http: httpx.AsyncClient, trpc_replicas: list[Replica]) -> Tasks:
    return Tasks(http, trpc_replicas)


async def task_run(ops: CancelBus, task_id: str) -> RunInfo:
    """The bus record of the task's (last) execution."""
    app, task, _ = task_session(task_id)
    [run] = await ops.list_runs(status="all", app_name=app, user_id=task, limit=1)
    return run


async def agent_run(ops: CancelBus, context_id: str) -> RunInfo:
    """The bus record of the trpc-agent run of a task's context (trpc-agent's default user)."""
    [run] = await ops.list_runs(status="all", app_name=APP, user_id=f"A2A_USER_{context_id}")
    return run


def text(task: Task) -> str:
    """The text of the task's artifacts."""
    parts = [part.root for artifact in task.artifacts or [] for part in artifact.parts]
    return "".join(part.text for part in parts if isinstance(part, TextPart))


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("how", ["streaming", "non-blocking"])
async def test_tasks_cancel_on_any_replica_returns_the_task_canceled(
    tasks: Tasks, ops: CancelBus, how: str, where: str
) -> None:
    for _ in range(3):  # the owner's answer once depended on a race (now a sync point)
        if how == "streaming":
            stream = Stream(tasks.client(), "stream")
            task_id = await stream.started()
        else:
            task_id = (await submit(tasks.client(streaming=False), "stream")).id
            await streaming(tasks.client(), task_id)

        canceled = await tasks.cancel(task_id, where)

        assert canceled.status.state is TaskState.canceled
        assert text(canceled).startswith("t0 ")  # the partial output is kept
        assert await tasks.states(task_id) == [TaskState.canceled] * 2
        if how == "streaming":
            assert await stream.final_state() is TaskState.canceled
        run = await task_run(ops, task_id)
        assert (run.status, run.end_reason, run.owner) == (
            RunStatus.CANCELLED,
            "cancelled",
            tasks.a.node_id,
        )


async def test_cancel_of_an_unknown_task_is_task_not_found(tasks: Tasks) -> None:
    for where in WHERE:
        assert await tasks.refused("no-such-task", where) == TaskNotFoundError().code


async def test_neither_a_finished_task_nor_a_canceled_one_is_cancelable(tasks: Tasks) -> None:
    """As a2a-sdk answers: -32002 with the state (a second cancel once answered the task)."""
    completed = Stream(tasks.client(), "short")
    assert await completed.final_state() is TaskState.completed
    stream = Stream(tasks.client(), "stream")
    task_id = await stream.started()
    canceled = await tasks.cancel(task_id, "other")
    assert canceled.status.state is TaskState.canceled
    for where in WHERE:
        for ended, state in ((completed.task_id, "completed"), (task_id, "canceled")):
            with pytest.raises(A2AClientJSONRPCError) as refused:
                await tasks.cancel(ended, where)
            assert refused.value.error.code == TaskNotCancelableError().code
            assert refused.value.error.message == (
                f"Task cannot be canceled - current state: TaskState.{state}"
            )
    assert (await tasks.get(task_id)).status.state is TaskState.canceled


@pytest.mark.parametrize("where", WHERE)
async def test_a_follow_up_to_a_running_task_runs_after_it_and_never_stops_it(
    tasks: Tasks, where: str
) -> None:
    """The task runs on A (held at its gate); a follow-up message for it reaches A or B. It is
    queued behind the running execution, which goes on to its end, and then executed: both
    outputs in the task, both messages in its history. (It was once answered ``working`` and
    dropped on A, and failed on B with -32603.)"""
    context = f"hold-{uuid.uuid4().hex[:8]}"
    first = Stream(tasks.client(), "hold", context)
    task_id = await first.started()
    before = await tasks.reads(task_id)
    follow_up = Stream(tasks.client(where), "short", context, task_id)
    await tasks.read_again(task_id, before)  # the follow-up reached its replica's handler

    await tasks.open(context)

    assert await first.final_state() is TaskState.completed
    assert await follow_up.final_state() is TaskState.completed
    assert follow_up.updates[0].status.state is TaskState.working  # type: ignore[union-attr]
    task = await tasks.get(task_id)
    assert task.status.state is TaskState.completed
    assert text(task) == "t0 t1 t2 donet0 t1 t2 done"  # both executions' output, in order
    asked = [m.parts[0].root for m in task.history or [] if m.role is Role.user]
    # "hold" twice: a2a-sdk 0.3 moves the submitted status's message to the history too
    assert asked == [TextPart(text="hold")] * 2 + [TextPart(text="short")]


async def test_a_task_that_does_not_stop_in_time_answers_working_and_ends_canceled(
    tasks: Tasks, ops: CancelBus
) -> None:
    """The agent reaches no checkpoint: the cancel is pending, said so, and still honoured."""
    context = f"hold-{uuid.uuid4().hex[:8]}"
    stream = Stream(tasks.client(), "hold", context_id=context)
    task_id = await stream.started()

    pending = await tasks.cancel(task_id, "other")

    assert pending.status.state is TaskState.working
    assert pending.status.message is not None
    assert pending.status.message.parts[0].root == TextPart(text=CANCEL_PENDING)
    assert (await task_run(ops, task_id)).stopping
    await tasks.open(context)  # the agent completes its answer
    assert await stream.final_state() is TaskState.canceled
    assert await tasks.states(task_id) == [TaskState.canceled] * 2
    assert text(await tasks.get(task_id)).endswith("done")


async def test_a_cancel_before_the_agents_run_registered_stops_it_at_its_start(
    tasks: Tasks, ops: CancelBus
) -> None:
    """The agent's session lookup waits for a gate: the task exists, its trpc-agent run does
    not. The cancel reaches the task's execution and the run stops at its first checkpoint."""
    context = f"{GATED}{uuid.uuid4().hex[:8]}"
    task_id = (await submit(tasks.client(streaming=False), "stream", context)).id
    cancel = asyncio.create_task(tasks.cancel(task_id, "other"))

    async def delivered() -> bool:
        return (await task_run(ops, task_id)).cancel_delivered_at is not None

    await eventually(delivered)
    await tasks.open(f"start:{context}")

    canceled = await asyncio.wait_for(cancel, WAIT)
    assert canceled.status.state is TaskState.canceled
    assert text(canceled) == ""  # stopped before its first chunk
    run = await agent_run(ops, context)  # ended before the task's end was stored
    assert (run.status, run.end_reason) == (RunStatus.CANCELLED, "cancelled")


async def test_follow_ups_on_two_replicas_run_one_after_the_other(tasks: Tasks) -> None:
    """Two follow-ups, on A (the owner) and B, while the task runs: each waits its turn; the
    task ends with the three executions' outputs one after the other."""
    context = f"hold-{uuid.uuid4().hex[:8]}"
    first = Stream(tasks.client(), "hold", context)
    task_id = await first.started()
    before = await tasks.reads(task_id)
    follow_ups = [Stream(tasks.client(where), "short", context, task_id) for where in WHERE]
    await tasks.read_again(task_id, before + 1)  # both reached their replica's handler

    await tasks.open(context)

    for stream in (first, *follow_ups):
        assert await stream.final_state() is TaskState.completed
    task = await tasks.get(task_id)
    assert text(task) == "t0 t1 t2 done" * 3
    asked = [m.parts[0].root for m in task.history or [] if m.role is Role.user]
    assert asked == [TextPart(text="hold")] * 2 + [TextPart(text="short")] * 2


@pytest.mark.parametrize("where", WHERE)
async def test_a_cancel_of_the_task_stops_the_follow_up_queued_behind_it(
    tasks: Tasks, where: str
) -> None:
    """The follow-up waits behind the running execution; a cancel of the task stops that one,
    and the follow-up is not executed: it is answered with the task canceled."""
    first = Stream(tasks.client(), "stream")
    task_id = await first.started()
    before = await tasks.reads(task_id)
    follow_up = Stream(tasks.client(where), "short", first.task.context_id, task_id)  # type: ignore[union-attr]
    await tasks.read_again(task_id, before)

    canceled = await tasks.cancel(task_id, "other")

    assert canceled.status.state is TaskState.canceled
    assert await first.final_state() is TaskState.canceled
    await asyncio.wait_for(follow_up.done, WAIT)
    assert follow_up.task is not None and follow_up.task.status.state is TaskState.canceled
    task = await tasks.get(task_id)
    assert task.status.state is TaskState.canceled
    assert "done" not in text(task)  # the follow-up did not run
    asked = [m.parts[0].root for m in task.history or [] if m.role is Role.user]
    assert TextPart(text="short") not in asked


@pytest.fixture
def victim(redis_server: EmbeddedServer, replica_namespace: str) -> Iterator[Replica]:
    """A third replica, to be killed (a short lease: it is found dead soon)."""
    with running(TRPC_REPLICA, 1, redis_server.url, replica_namespace, lease_ttl=2.0) as [one]:
        yield one


async def test_a_task_whose_replica_died_ends_canceled(
    tasks: Tasks, victim: Replica, http: httpx.AsyncClient
) -> None:
    task_id = (await submit(client(http, f"{victim.url}/a2a/", streaming=False), "hold")).id
    await streaming(tasks.client(), task_id)
    victim.kill()

    answer = await tasks.cancel(task_id, "owner")  # A, a live replica

    assert answer.status.state in (TaskState.working, TaskState.canceled)

    async def ended() -> bool:
        return await tasks.states(task_id) == [TaskState.canceled] * 2

    await eventually(ended, timeout=3 * WAIT)  # its lease expires, a live node resolves its run
    message = (await tasks.get(task_id)).status.message
    assert message is not None and message.parts[0].root == TextPart(text=OWNER_LOST)


@pytest.mark.parametrize("where", WHERE)
async def test_tasks_resubscribe_on_any_replica_streams_the_task_to_its_end(
    tasks: Tasks, where: str
) -> None:
    stream = Stream(tasks.client(), "stream")
    task_id = await stream.started()
    updates: list[TaskStatusUpdateEvent | TaskArtifactUpdateEvent] = []
    following = asyncio.Event()

    async def resubscribe() -> None:
        async for _, update in tasks.client(where).resubscribe(TaskIdParams(id=task_id)):
            if update is not None:
                updates.append(update)
                following.set()

    resubscribed = asyncio.create_task(resubscribe())
    await asyncio.wait_for(following.wait(), WAIT)

    await tasks.cancel(task_id, "owner")

    await asyncio.wait_for(resubscribed, WAIT)
    assert isinstance(updates[0], TaskArtifactUpdateEvent)
    last = updates[-1]
    assert isinstance(last, TaskStatusUpdateEvent) and last.final
    assert last.status.state is TaskState.canceled


# The artifacts of a "turns" task (see StreamingAgent), stopped in its first turn at the gate:
# the chunks streamed, and after a whole turn its complete model message too.
TURN_TEXT = {
    "checkpoint": "Let me ",
    "immediate": "Let me ",
    "after_turn": "Let me look. Let me look. ",
}


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("mode", TURN_TEXT)
async def test_a_bus_cancel_of_a_task_honours_each_mode(
    tasks: Tasks, ops: CancelBus, http: httpx.AsyncClient, mode: str, where: str
) -> None:
    context = f"turns-{uuid.uuid4().hex[:8]}"
    stream = Stream(tasks.client(), "turns", context_id=context)
    task_id = await stream.started()  # "Let me ", then held at the gate
    replica = tasks.a if where == "owner" else tasks.b
    body = dict(zip(("app", "user", "session"), task_session(task_id), strict=True))
    immediate = mode == "immediate"
    response = await http.post(
        f"{replica.url}/bus/cancel", json={**body, "mode": mode, "wait": immediate}
    )

    if immediate:
        assert response.json()["outcome"] == "cancelled"  # without the gate: interrupted
    else:
        assert response.json()["outcome"] == "stopping"  # the agent is held at the gate

        async def delivered() -> bool:  # handed on to the agent's run
            return (await agent_run(ops, context)).cancel_delivered_at is not None

        await eventually(delivered)
        await tasks.open(context)

    assert await stream.final_state() is TaskState.canceled
    assert await tasks.states(task_id) == [TaskState.canceled] * 2
    assert text(await tasks.get(task_id)) == TURN_TEXT[mode]
    run = await task_run(ops, task_id)
    assert (run.status, run.end_reason, run.cancel_mode) == (RunStatus.CANCELLED, "cancelled", mode)
    assert run.app_name == TASK_APP
    if mode == "immediate":
        await tasks.open(context)


async def canceled_remotely(tasks: Tasks, ops: CancelBus, call: Call) -> None:
    """The remote task of ``call`` was canceled and its agent stopped at a checkpoint, and the
    call's run was recorded cancelled as the caller's child."""
    assert await tasks.states(call.task_id) == [TaskState.canceled] * 2
    remote = await tasks.get(call.task_id)
    assert text(remote).startswith("t0 ")  # it had streamed when the cancel came
    agent = await agent_run(ops, remote.context_id)
    assert (agent.status, agent.end_reason) == (RunStatus.CANCELLED, "cancelled")
    final = await ops.wait(call.run.run_id, timeout=WAIT)
    assert final is not None
    assert (final.status, final.end_reason, final.cancel_cause, final.parent) == (
        RunStatus.CANCELLED,
        "cancelled",
        StopCause.PARENT,
        call.caller.run_id,
    )


async def test_tasks_cancel_of_a_task_cancels_the_remote_task_its_agent_called(
    tasks: Tasks, ops: CancelBus, http: httpx.AsyncClient
) -> None:
    """Agent X (the boss, served at ``/x/``) calls agent Y (the streamer of B, another process)
    inside its run, with ``send_message``. ``tasks/cancel`` of X's task on B (not X's owner)
    cancels X's run, which sends ``tasks/cancel`` for Y's task: both end ``canceled``."""
    context = f"x-{uuid.uuid4().hex[:8]}"
    x = Stream(client(http, f"{tasks.a.url}/x/"), f"ask_remote {tasks.b.url}/a2a/", context)
    call = await remote_call(ops, BOSS, f"A2A_USER_{context}")
    await streaming(tasks.client(), call.task_id)
    assert x.task_id

    canceled = await client(http, f"{tasks.b.url}/x/").cancel_task(TaskIdParams(id=x.task_id))

    assert canceled.status.state is TaskState.canceled
    assert await x.final_state() is TaskState.canceled
    await canceled_remotely(tasks, ops, call)


async def test_a_bus_cancel_of_a_run_answers_for_the_remote_task_it_called(
    tasks: Tasks, ops: CancelBus, http: httpx.AsyncClient
) -> None:
    """The boss's run (trpc-agent, on A) calls Y (on B); the test's bus, another node, cancels
    the run: the answer lists the call, ``cancelled`` once Y's task is ``canceled``."""
    user, session = f"u-{uuid.uuid4().hex[:8]}", "s"
    body = {"app": BOSS, "user": user, "session": session}
    started = await http.post(
        f"{tasks.a.url}/trpc/runs", json={**body, "command": f"ask_remote {tasks.b.url}/a2a/"}
    )
    started.raise_for_status()
    call = await remote_call(ops, BOSS, user)
    await streaming(tasks.client(), call.task_id)

    result = await ops.cancel_session(BOSS, user, session, timeout=WAIT)

    assert result.outcome is Outcome.CANCELLED
    assert [(r.outcome, r.run.run_id if r.run else None) for r in result.descendants] == [
        (Outcome.CANCELLED, call.run.run_id)
    ]
    await canceled_remotely(tasks, ops, call)


class Caller:
    """A run of ``bus`` whose code calls A's streamer (another process) with ``send_message``:
    ``stream``, or ``hold`` (no checkpoint until its gate opens); it reads the task's events
    (leaving the block at the first artifact if ``leave_early``), then reaches a turn boundary."""

    def __init__(self, bus: CancelBus, tasks: Tasks, command: str, leave_early: bool = False):
        self.bus, self.tasks = bus, tasks
        self.context = f"hold-{uuid.uuid4().hex[:8]}"  # the gate of a "hold"
        self.streaming = asyncio.Event()
        self.remote: Task | None = None
        self.runs: list[RunHandle] = []
        self.done = asyncio.create_task(self._code(command, leave_early))

    async def _code(self, command: str, leave_early: bool) -> None:
        request = message(command, self.context)
        async with self.bus.run() as run:
            self.runs.append(run)
            async with send_message(self.bus, self.tasks.client(), request) as events:
                async for task, update in events:
                    self.remote = task
                    if isinstance(update, TaskArtifactUpdateEvent):
                        self.streaming.set()
                        if leave_early:
                            break
            run.turn_boundary()

    async def started(self) -> tuple[str, RunInfo]:
        """Once the remote agent streams: the caller's run id, and the call's run."""
        await asyncio.wait_for(self.streaming.wait(), WAIT)
        root = await self.bus.get_run(self.runs[0].run_id)
        assert root is not None
        [call] = await children(self.bus, root)
        return root.run_id, call

    async def ended(self, call: RunInfo) -> tuple[TaskState, RunInfo]:
        """Once the caller's code ended: the remote task's state (the same on A and B), and how
        the call's run ended."""
        await asyncio.wait_for(self.done, WAIT)
        assert self.remote is not None
        [state, same] = await self.tasks.states(self.remote.id)
        assert same is state
        final = await self.bus.wait(call.run_id, timeout=WAIT)
        assert final is not None and final.phase == f"{PHASE}{self.remote.id}"
        return state, final


# How the remote task and the call's run end when the caller's run is cancelled in each mode
# (the remote agent streams, or for after_turn holds at its gate), or when the caller leaves the
# block early without a cancel.
CALL_ENDS = {
    "checkpoint": (TaskState.canceled, RunStatus.CANCELLED, "cancelled"),
    "immediate": (TaskState.canceled, RunStatus.CANCELLED, "cancelled"),
    "after_turn": (TaskState.completed, RunStatus.CANCELLED, "completed"),  # no CancelTask
    "break": (TaskState.canceled, RunStatus.SUCCEEDED, "completed"),  # nobody cancelled the call
}


@pytest.mark.parametrize("case", CALL_ENDS)
async def test_send_message_cancels_the_remote_task_as_the_mode_asks(
    tasks: Tasks, make_bus: BusFactory, case: str
) -> None:
    """Another bus cancels the caller's run, or the caller leaves the block early."""
    bus = await make_bus()
    caller = Caller(bus, tasks, "hold" if case == "after_turn" else "stream", case == "break")
    root, call = await caller.started()
    other = await make_bus()
    if case in ("checkpoint", "immediate"):
        result = await other.cancel(root, mode=case, timeout=WAIT)
        assert [r.outcome for r in (result, *result.descendants)] == [Outcome.CANCELLED] * 2
    elif case == "after_turn":
        await other.cancel(root, mode=case, wait=False)
        await tasks.open(caller.context)  # the remote agent completes: the call was in the turn

    state, final = await caller.ended(call)

    assert (state, final.status, final.end_reason) == CALL_ENDS[case]
    if case == "break":
        await tasks.open(caller.context)


async def test_a_call_whose_remote_task_is_slow_to_stop_answers_stopping_until_it_has(
    tasks: Tasks, make_bus: BusFactory
) -> None:
    """The remote agent reaches no checkpoint until its gate opens: its ``tasks/cancel`` answers
    ``working`` (cancel pending); the call, still streaming, stays ``stopping`` until the remote
    task ends ``canceled``."""
    bus = await make_bus()
    caller = Caller(bus, tasks, "hold")
    root, call = await caller.started()
    other = await make_bus()

    result = await other.cancel(root, timeout=CANCEL_TIMEOUT + 2.0)  # past the remote's answer

    assert [r.outcome for r in (result, *result.descendants)] == [Outcome.STOPPING] * 2
    await tasks.open(caller.context)
    state, final = await caller.ended(call)
    assert (state, final.status, final.end_reason) == (
        TaskState.canceled,
        RunStatus.CANCELLED,
        "cancelled",
    )


async def test_a_call_left_with_its_remote_task_still_working_records_why(
    tasks: Tasks, make_bus: BusFactory
) -> None:
    """An immediate cancel interrupts the caller's read; the remote agent answers its
    ``tasks/cancel`` with the task still working: the call's run ends with an error saying so
    (nobody follows the task any more), and the task still ends ``canceled``."""
    bus = await make_bus()
    caller = Caller(bus, tasks, "hold")
    root, call = await caller.started()
    other = await make_bus()

    await other.cancel(root, mode="immediate", wait=False)

    state, final = await caller.ended(call)
    assert (state, final.status, final.end_reason) == (
        TaskState.working,
        RunStatus.CANCELLED,
        "error",
    )
    assert final.error is not None and "was not seen to end" in final.error
    await tasks.open(caller.context)

    async def canceled() -> bool:
        return await tasks.states(caller.remote.id) == [TaskState.canceled] * 2  # type: ignore[union-attr]

    await eventually(canceled)


class LeakyExecutor(AgentExecutor):
    """Completes its task at once, and leaves a writer behind that adds an artifact once
    ``late`` is set: after its task's run ended."""

    def __init__(self) -> None:
        self.late = asyncio.Event()
        self.writer: asyncio.Task[None] | None = None

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        updater = TaskUpdater(event_queue, context.task_id or "", context.context_id or "")
        await updater.submit()
        await updater.complete()

        async def write_late() -> None:
            await asyncio.wait_for(self.late.wait(), WAIT)
            await updater.add_artifact([Part(root=TextPart(text="late"))])

        self.writer = asyncio.create_task(write_late())

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise NotImplementedError


async def test_an_event_the_executor_writes_after_its_tasks_run_ended_is_a_leak(
    make_bus: BusFactory,
) -> None:
    bus = await make_bus()
    executor = LeakyExecutor()
    handler = BusRequestHandler(bus, agent_executor=executor, task_store=BusTaskStore(bus))
    task = await handler.on_message_send(MessageSendParams(message=message("hello")))
    assert isinstance(task, Task) and task.status.state is TaskState.completed
    run = await task_run(bus, task.id)
    ended = await bus.wait(run.run_id, timeout=WAIT)
    assert ended is not None and ended.status is RunStatus.SUCCEEDED

    executor.late.set()
    assert executor.writer is not None
    await asyncio.wait_for(executor.writer, WAIT)

    async def recorded() -> bool:
        info = await bus.get_run(run.run_id)
        return info is not None and info.leaked_after_cancel is not None

    await eventually(recorded)
    info = await bus.get_run(run.run_id)
    assert info is not None and info.leaked_after_cancel is not None
    assert info.leaked_after_cancel["calls"] == {LEAKED_EVENT: 1}


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # trpc-agent's use of a2a-sdk
async def test_trpc_agents_remote_agent_cancels_its_remote_task_on_a_cancel_from_any_node(
    tasks: Tasks, make_bus: BusFactory, ops: CancelBus
) -> None:
    """trpc-agent's own ``TrpcRemoteA2aAgent`` (the run's agent, on the test's bus) sends
    ``tasks/cancel`` itself when its run's cancel Event is set: a ``checkpoint`` cancel from
    another node reaches it, the remote task (on B) ends ``canceled``, and the run is recorded
    ``cancelled`` though it stopped on that Event rather than at a checkpoint."""
    bus = await make_bus()
    trpc_agent.install(bus)
    try:
        remote = TrpcRemoteA2aAgent(name="remote", agent_base_url=f"{tasks.b.url}/a2a/")
        assert await remote.initialize()
        runner = Runner(app_name="relay", agent=remote, session_service=InMemorySessionService())
        session = f"relay-{uuid.uuid4().hex[:8]}"  # the remote task's context
        await runner.session_service.create_session(
            app_name="relay", user_id="u", session_id=session
        )
        streaming_now = asyncio.Event()

        async def consume() -> list[Event]:
            events: list[Event] = []
            question = Content(role="user", parts=[TrpcPart.from_text(text="stream")])
            config = RunConfig(streaming=True)
            async for event in runner.run_async(
                user_id="u", session_id=session, new_message=question, run_config=config
            ):
                events.append(event)
                streaming_now.set()
            return events

        consuming = asyncio.create_task(consume())
        await asyncio.wait_for(streaming_now.wait(), WAIT)

        result = await ops.cancel_session("relay", "u", session, timeout=WAIT)

        assert result.outcome is Outcome.CANCELLED
        assert result.run is not None
        assert (result.run.status, result.run.end_reason) == (RunStatus.CANCELLED, "cancelled")
        assert isinstance((await asyncio.wait_for(consuming, WAIT))[-1], AgentCancelledEvent)
        agent = await agent_run(ops, session)  # the remote agent's run, on B
        final = await ops.wait(agent.run_id, timeout=WAIT)
        assert final is not None and (final.status, final.end_reason) == (
            RunStatus.CANCELLED,
            "cancelled",
        )
        await runner.close()
    finally:
        trpc_agent.uninstall()


async def test_the_docs_call_example_runs(tasks: Tasks, redis_url: str, capsys: Any) -> None:
    await example("a2a-call")(redis_url, f"{tasks.b.url}/a2a/")
    printed = capsys.readouterr().out.splitlines()
    assert any(line.startswith(f"cancelled cancelled {PHASE}") for line in printed)
    assert "canceled" in printed
