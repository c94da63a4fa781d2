"""A2A (a2a-sdk 1.x) across OS processes: trpc-agent's ``a2a_v1`` service on replicas A and B
(and a third that dies) sharing a task store, one real Redis, driven by the real a2a-sdk client.
The task runs on A; the requests go to A (the owner) or B; an A2A call made inside a run
(``send_message``) is canceled with the run. Collected only where a2a-sdk 1.x is installed (see
conftest.py)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from a2a.client import Client
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.context import ServerCallContext
from a2a.server.events import EventQueue
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import (
    Artifact,
    CancelTaskRequest,
    GetTaskRequest,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    Task,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatus,
)
from a2a.utils.errors import TaskNotCancelableError, TaskNotFoundError

from cancel_bus import CancelBus, Outcome, RunInfo, RunStatus, StopCause
from cancel_bus.integrations._a2a_calls import PHASE
from cancel_bus.integrations._a2a_runs import (
    CANCEL_PENDING,
    LEAKED_EVENT,
    OWNER_LOST,
    task_session,
)
from cancel_bus.integrations.a2a_v1 import BusRequestHandler
from node.embedded import EmbeddedServer

from ..conftest import BusFactory
from ..helpers import WAIT, eventually
from .a2a_reads import read_again, reads
from .a2a_v1_replica import card, client, send_request
from .conftest import A2A_V1_REPLICA
from .docs_examples import example
from .replica import Replica, running
from .tree_support import remote_call
from .trpc_support import APP, BOSS, GATED

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
WHERE = ["owner", "other"]
CANCELED, WORKING = TaskState.TASK_STATE_CANCELED, TaskState.TASK_STATE_WORKING
COMPLETED = TaskState.TASK_STATE_COMPLETED


@pytest.fixture
def namespace(replica_namespace: str) -> str:
    return replica_namespace


class Stream:
    """A streaming ``SendMessage`` in the background; ``started`` once the agent streams."""

    def __init__(self, client: Client, text: str, context_id: str = "", task_id: str = "") -> None:
        self.responses: list[StreamResponse] = []
        self.task_id = task_id
        self.working = asyncio.Event()
        request = send_request(text, context_id, task_id)
        self.done = asyncio.create_task(self._consume(client, request))

    async def _consume(self, client: Client, request: SendMessageRequest) -> None:
        async for response in client.send_message(request):
            self.responses.append(response)
            if response.HasField("task"):
                self.task_id = response.task.id
            if response.HasField("artifact_update"):
                self.task_id = response.artifact_update.task_id
                self.working.set()

    async def started(self) -> str:
        await asyncio.wait_for(self.working.wait(), WAIT)
        return self.task_id

    async def final_state(self) -> TaskState:
        await asyncio.wait_for(self.done, WAIT)
        return state(self.responses[-1])


def state(response: StreamResponse) -> TaskState:
    if response.HasField("task"):
        return response.task.status.state
    assert response.HasField("status_update")
    return response.status_update.status.state


class Tasks:
    """The A2A side of replicas A and B."""

    def __init__(self, http: httpx.AsyncClient, replicas: list[Replica]) -> None:
        self.http = http
        self.a, self.b = replicas

    def url(self, where: str) -> str:
        return (self.a if where == "owner" else self.b).url

    def client(self, where: str = "owner", *, streaming: bool = True) -> Client:
        return client(self.http, self.url(where), streaming=streaming)

    async def submit(self, text: str, context_id: str = "") -> str:
        """A non-blocking ``SendMessage`` on A: the task's id as soon as it exists."""
        [response] = [
            r
            async for r in self.client(streaming=False).send_message(send_request(text, context_id))
        ]
        return response.task.id

    async def streaming(self, task_id: str) -> None:
        async def check() -> bool:
            return bool((await self.get(task_id)).artifacts)

        await eventually(check)

    async def get(self, task_id: str, where: str = "other") -> Task:
        return await self.client(where).get_task(GetTaskRequest(id=task_id))

    async def states(self, task_id: str) -> list[TaskState]:
        return [(await self.get(task_id, where)).status.state for where in WHERE]

    async def cancel(self, task_id: str, where: str) -> Task:
        return await self.client(where).cancel_task(CancelTaskRequest(id=task_id))

    async def open(self, gate: str) -> None:
        (await self.http.post(f"{self.a.url}/gates/{gate}")).raise_for_status()

    async def reads(self, task_id: str) -> int:
        return await reads(self.http, [self.a.url, self.b.url], task_id)

    async def read_again(self, task_id: str, before: int) -> None:
        await read_again(self.http, [self.a.url, self.b.url], task_id, before)


@pytest.fixture
def tasks(http: httpx.AsyncClient, a2a_v1_replicas: list[Replica]) -> Tasks:
    return Tasks(http, a2a_v1_replicas)


async def task_run(ops: CancelBus, task_id: str) -> RunInfo:
    app, task, _ = task_session(task_id)
    [run] = await ops.list_runs(status="all", app_name=app, user_id=task, limit=1)
    return run


async def agent_run(ops: CancelBus, context_id: str) -> RunInfo:
    [run] = await ops.list_runs(status="all", app_name=APP, user_id=f"A2A_USER_{context_id}")
    return run


def text(task: Task) -> str:
    return "".join(part.text for artifact in task.artifacts for part in artifact.parts)


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("how", ["streaming", "non-blocking"])
async def test_cancel_task_on_any_replica_returns_the_task_canceled(
    tasks: Tasks, ops: CancelBus, how: str, where: str
) -> None:
    if how == "streaming":
        stream = Stream(tasks.client(), "stream")
        task_id = await stream.started()
    else:
        task_id = await tasks.submit("stream")
        await tasks.streaming(task_id)

    canceled = await tasks.cancel(task_id, where)

    assert canceled.status.state == CANCELED
    assert text(canceled).startswith("t0 ")  # the partial output is kept
    assert await tasks.states(task_id) == [CANCELED] * 2
    if how == "streaming":
        assert await stream.final_state() == CANCELED
    run = await task_run(ops, task_id)
    assert (run.status, run.end_reason, run.owner) == (
        RunStatus.CANCELLED,
        "cancelled",  # stopped at a checkpoint, not killed
        tasks.a.node_id,
    )


async def test_unknown_finished_and_canceled_tasks(tasks: Tasks, http: httpx.AsyncClient) -> None:
    """As a2a-sdk answers: not found; not cancelable for a task in a terminal state, a canceled
    one too (a second cancel once answered the task)."""
    completed = Stream(tasks.client(), "short")
    assert await completed.final_state() == TaskState.TASK_STATE_COMPLETED
    stream = Stream(tasks.client(), "stream")
    canceled = await tasks.cancel(await stream.started(), "other")
    assert canceled.status.state == CANCELED
    for where in WHERE:
        with pytest.raises(TaskNotFoundError):
            await tasks.cancel("no-such-task", where)
        response = await http.post(f"{tasks.url(where)}/rest/tasks/no-such-task:cancel")
        assert response.status_code == 404
        for ended in (completed.task_id, canceled.id):
            with pytest.raises(TaskNotCancelableError, match=r"^Task cannot be canceled$"):
                await tasks.cancel(ended, where)
            response = await http.post(f"{tasks.url(where)}/rest/tasks/{ended}:cancel")
            assert response.status_code == 400
            assert "TASK_NOT_CANCELABLE" in response.text
    assert (await tasks.get(canceled.id)).status.state == CANCELED


async def test_a_task_that_does_not_stop_in_time_answers_working_and_ends_canceled(
    tasks: Tasks, ops: CancelBus
) -> None:
    context = f"hold-{uuid.uuid4().hex[:8]}"
    stream = Stream(tasks.client(), "hold", context)
    task_id = await stream.started()

    pending = await tasks.cancel(task_id, "other")

    assert pending.status.state == WORKING
    assert pending.status.message.parts[0].text == CANCEL_PENDING
    assert (await task_run(ops, task_id)).stopping
    await tasks.open(context)
    assert await stream.final_state() == CANCELED
    assert await tasks.states(task_id) == [CANCELED] * 2
    assert text(await tasks.get(task_id)).endswith("done")


async def test_a_cancel_before_the_agents_run_registered_stops_it_at_its_start(
    tasks: Tasks, ops: CancelBus
) -> None:
    context = f"{GATED}{uuid.uuid4().hex[:8]}"
    task_id = await tasks.submit("stream", context)
    cancel = asyncio.create_task(tasks.cancel(task_id, "other"))

    async def delivered() -> bool:
        return (await task_run(ops, task_id)).cancel_delivered_at is not None

    await eventually(delivered)
    await tasks.open(f"start:{context}")

    canceled = await asyncio.wait_for(cancel, WAIT)
    assert canceled.status.state == CANCELED
    assert text(canceled) == ""
    run = await agent_run(ops, context)  # ended before the task's end was stored
    assert (run.status, run.end_reason) == (RunStatus.CANCELLED, "cancelled")


@pytest.mark.parametrize("where", WHERE)
async def test_a_follow_up_to_a_running_task_runs_after_it_and_never_stops_it(
    tasks: Tasks, where: str
) -> None:
    """The task runs on A (held at its gate); a follow-up message for it reaches A or B. It is
    queued behind the running execution, which goes on to its end, and then executed: both
    outputs in the task, both messages in its history. (Once, on A it was dropped: the SDK shut
    the task's request queue at the running execution's end, before taking the message from it;
    on B it failed with -32603, and B's failed execution wrote ``FAILED`` over the shared task,
    which made A's execution stop at its next save.)"""
    context = f"hold-{uuid.uuid4().hex[:8]}"
    first = Stream(tasks.client(), "hold", context)
    task_id = await first.started()
    before = await tasks.reads(task_id)
    follow_up = Stream(tasks.client(where), "short", context, task_id)
    await tasks.read_again(task_id, before)  # the follow-up reached its replica's handler

    await tasks.open(context)

    assert await first.final_state() == COMPLETED
    assert await follow_up.final_state() == COMPLETED
    task = await tasks.get(task_id)
    assert task.status.state == COMPLETED
    assert text(task) == "t0 t1 t2 donet0 t1 t2 done"  # both executions' output, in order
    asked = [m.parts[0].text for m in task.history if m.role == Role.ROLE_USER]
    assert asked == ["hold", "short"]


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
        assert await stream.final_state() == COMPLETED
    task = await tasks.get(task_id)
    assert text(task) == "t0 t1 t2 done" * 3
    asked = [m.parts[0].text for m in task.history if m.role == Role.ROLE_USER]
    assert asked == ["hold", "short", "short"]


@pytest.mark.parametrize("where", WHERE)
async def test_a_cancel_of_the_task_stops_the_follow_up_queued_behind_it(
    tasks: Tasks, where: str
) -> None:
    """The follow-up waits behind the running execution; a cancel of the task stops that one,
    and the follow-up is not executed: its stream ends with the execution's ``CANCELED``."""
    first = Stream(tasks.client(), "stream")
    task_id = await first.started()
    context_id = (await tasks.get(task_id)).context_id
    before = await tasks.reads(task_id)
    follow_up = Stream(tasks.client(where), "short", context_id, task_id)
    await tasks.read_again(task_id, before)

    canceled = await tasks.cancel(task_id, "other")

    assert canceled.status.state == CANCELED
    assert await first.final_state() == CANCELED
    assert await follow_up.final_state() == CANCELED
    task = await tasks.get(task_id)
    assert task.status.state == CANCELED
    assert "done" not in text(task)  # the follow-up did not run
    assert "short" not in [m.parts[0].text for m in task.history if m.role == Role.ROLE_USER]


@pytest.fixture
def victim(redis_server: EmbeddedServer, replica_namespace: str) -> Iterator[Replica]:
    with running(A2A_V1_REPLICA, 1, redis_server.url, replica_namespace, lease_ttl=2.0) as [one]:
        yield one


async def test_a_task_whose_replica_died_ends_canceled(
    tasks: Tasks, victim: Replica, http: httpx.AsyncClient
) -> None:
    [response] = [
        r
        async for r in client(http, victim.url, streaming=False).send_message(send_request("hold"))
    ]
    task_id = response.task.id
    await tasks.streaming(task_id)
    victim.kill()

    answer = await tasks.cancel(task_id, "owner")

    assert answer.status.state in (WORKING, CANCELED)

    async def ended() -> bool:
        return await tasks.states(task_id) == [CANCELED] * 2

    await eventually(ended, timeout=3 * WAIT)  # its lease expires, a live node resolves its run
    assert (await tasks.get(task_id)).status.message.parts[0].text == OWNER_LOST


@pytest.mark.parametrize("where", WHERE)
async def test_subscribe_to_task_on_any_replica_streams_the_task_to_its_end(
    tasks: Tasks, where: str
) -> None:
    stream = Stream(tasks.client(), "stream")
    task_id = await stream.started()
    responses: list[StreamResponse] = []
    following = asyncio.Event()

    async def subscribe() -> None:
        async for response in tasks.client(where).subscribe(SubscribeToTaskRequest(id=task_id)):
            responses.append(response)
            if response.HasField("artifact_update"):
                following.set()

    subscribed = asyncio.create_task(subscribe())
    await asyncio.wait_for(following.wait(), WAIT)

    await tasks.cancel(task_id, "owner")

    await asyncio.wait_for(subscribed, WAIT)
    assert state(responses[-1]) == CANCELED


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
    stream = Stream(tasks.client(), "turns", context)
    task_id = await stream.started()
    body = dict(zip(("app", "user", "session"), task_session(task_id), strict=True))
    immediate = mode == "immediate"
    response = await http.post(
        f"{tasks.url(where)}/bus/cancel", json={**body, "mode": mode, "wait": immediate}
    )

    if immediate:
        assert response.json()["outcome"] == "cancelled"
    else:
        assert response.json()["outcome"] == "stopping"

        async def delivered() -> bool:
            return (await agent_run(ops, context)).cancel_delivered_at is not None

        await eventually(delivered)
        await tasks.open(context)

    assert await stream.final_state() == CANCELED
    assert await tasks.states(task_id) == [CANCELED] * 2
    assert text(await tasks.get(task_id)) == TURN_TEXT[mode]
    run = await task_run(ops, task_id)
    assert (run.status, run.end_reason, run.cancel_mode) == (RunStatus.CANCELLED, "cancelled", mode)
    if immediate:
        await tasks.open(context)


@pytest.mark.parametrize("how", ["CancelTask", "bus"])
async def test_cancelling_a_run_cancels_the_remote_task_its_agent_called(
    tasks: Tasks, ops: CancelBus, http: httpx.AsyncClient, how: str
) -> None:
    """Agent X (the boss, served at ``/x``) calls agent Y (the streamer of B, another process)
    inside its run, with ``send_message``. ``CancelTask`` of X's task on B (not X's owner), or a
    bus cancel of X's run from the test's bus, cancels the run, which sends ``CancelTask`` for Y's
    task: both end ``CANCELED``, and the bus answer lists the call."""
    context = f"x-{uuid.uuid4().hex[:8]}"
    x = Stream(client(http, f"{tasks.a.url}/x"), f"ask_remote {tasks.b.url}", context)
    call = await remote_call(ops, BOSS, f"A2A_USER_{context}")
    await tasks.streaming(call.task_id)
    assert x.task_id

    if how == "CancelTask":
        canceled = await client(http, f"{tasks.b.url}/x").cancel_task(
            CancelTaskRequest(id=x.task_id)
        )
        assert canceled.status.state == CANCELED
    else:
        result = await ops.cancel(call.caller.run_id, timeout=WAIT)
        assert result.outcome is Outcome.CANCELLED
        assert [(r.outcome, r.run.run_id if r.run else None) for r in result.descendants] == [
            (Outcome.CANCELLED, call.run.run_id)
        ]

    assert await x.final_state() == CANCELED
    assert await tasks.states(call.task_id) == [CANCELED] * 2
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


class LeakyExecutor(AgentExecutor):
    """Completes its task at once, and leaves a writer behind that adds an artifact once
    ``late`` is set: after its task's run ended."""

    def __init__(self) -> None:
        self.late = asyncio.Event()
        self.writer: asyncio.Task[None] | None = None

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task_id, context_id = context.task_id or "", context.context_id or ""
        submitted = TaskStatus(state=TaskState.TASK_STATE_SUBMITTED)
        await event_queue.enqueue_event(Task(id=task_id, context_id=context_id, status=submitted))
        await TaskUpdater(event_queue, task_id, context_id).complete()

        async def write_late() -> None:
            await asyncio.wait_for(self.late.wait(), WAIT)
            artifact = Artifact(artifact_id="late", parts=[Part(text="late")])
            late = TaskArtifactUpdateEvent(
                task_id=task_id, context_id=context_id, artifact=artifact
            )
            await event_queue.enqueue_event(late)

        self.writer = asyncio.create_task(write_late())

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise NotImplementedError


@pytest.mark.filterwarnings("ignore:A VersionedTaskStore was configured without an event_stream")
async def test_an_event_the_executor_writes_after_its_tasks_run_ended_is_a_leak(
    make_bus: BusFactory,
) -> None:
    bus = await make_bus()
    executor = LeakyExecutor()
    handler = BusRequestHandler(
        bus,
        agent_executor=executor,
        task_store=InMemoryTaskStore(),
        agent_card=card("http://127.0.0.1:1"),
    )
    task = await handler.on_message_send(send_request("hello"), ServerCallContext())
    assert isinstance(task, Task) and task.status.state == TaskState.TASK_STATE_COMPLETED
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


async def test_the_docs_call_example_runs(tasks: Tasks, redis_url: str, capsys: Any) -> None:
    await example("a2a-v1-call")(redis_url, tasks.b.url)
    printed = capsys.readouterr().out.splitlines()
    assert any(line.startswith(f"cancelled cancelled {PHASE}") for line in printed)
    assert "TASK_STATE_CANCELED" in printed
