"""A2A (a2a-sdk 0.3) across OS processes: trpc-agent's A2A service on replicas A and B (and a
third that dies), one real Redis, driven by the real a2a-sdk client. The task runs on A; the
requests go to A (the owner) or B (another replica). What the spec's cancel section asks, on
every replica."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from a2a.client import Client
from a2a.client.errors import A2AClientJSONRPCError
from a2a.types import (
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

from cancel_bus import CancelBus, RunInfo, RunStatus
from cancel_bus.integrations._a2a_runs import CANCEL_PENDING, OWNER_LOST, TASK_APP, task_session
from node.embedded import EmbeddedServer

from ..conftest import BusFactory
from ..helpers import WAIT, eventually
from .a2a_support import Stream, client, streaming, submit
from .conftest import TRPC_REPLICA
from .replica import Replica, running
from .trpc_support import APP, GATED

WHERE = ["owner", "other"]


@pytest.fixture
def namespace(replica_namespace: str) -> str:
    return replica_namespace


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=WAIT * 2) as client:
        yield client


@pytest.fixture
async def ops(make_bus: BusFactory) -> CancelBus:
    """A bus of the test's own, to look at the records."""
    return await make_bus()


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


async def test_a_finished_task_is_not_cancelable_and_a_canceled_one_is_returned_again(
    tasks: Tasks,
) -> None:
    completed = Stream(tasks.client(), "short")
    assert await completed.final_state() is TaskState.completed
    for where in WHERE:
        assert await tasks.refused(completed.task_id, where) == TaskNotCancelableError().code

    stream = Stream(tasks.client(), "stream")
    task_id = await stream.started()
    canceled = await tasks.cancel(task_id, "other")
    for where in WHERE:
        again = await tasks.cancel(task_id, where)
        assert again == await tasks.get(task_id)
        assert again.status.state is TaskState.canceled
    assert canceled.status.state is TaskState.canceled


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
