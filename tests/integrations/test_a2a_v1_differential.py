"""A2A (a2a-sdk 1.x) differentially: the same client script, sent with the SDK's own JSON-RPC
transport (and REST for the cancels), against stock a2a-sdk on one process (its
``DefaultRequestHandler`` and in-memory store: ``a2a_v1_stock_replica.py``) and against three
replicas (``BusRequestHandler``, one Redis, a shared task store and event stream) behind a
round-robin balancer; the answers must be the same, modulo ids and timing (ids and timestamps,
and how many chunks the agent streamed before a cancel reached it: ``a2a_differential.py``).
Collected only where a2a-sdk 1.x is installed (see conftest.py)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from a2a.client.transports.jsonrpc import JsonRpcTransport
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    SendMessageConfiguration,
    SubscribeToTaskRequest,
)
from a2a.utils.constants import PROTOCOL_VERSION_CURRENT, VERSION_HEADER
from a2a.utils.errors import A2AError
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message as Proto

from node.embedded import EmbeddedServer

from ..helpers import WAIT, eventually
from .a2a_differential import (
    Target,
    Transcript,
    artifact_text,
    chunks,
    difference,
    stock_and_replicas,
    stock_and_third,
)
from .a2a_v1_replica import card, send_request
from .conftest import A2A_V1_REPLICA
from .replica import Replica

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
STOCK = "tests.integrations.a2a_v1_stock_replica"


@pytest.fixture(scope="module")
def processes(redis_server: EmbeddedServer, replica_namespace: str) -> Iterator[list[Replica]]:
    """Stock on one process, and the third replica."""
    with stock_and_third(STOCK, A2A_V1_REPLICA, redis_server.url, replica_namespace) as spawned:
        yield spawned


@pytest.fixture
async def targets(
    http: httpx.AsyncClient, processes: list[Replica], a2a_v1_replicas: list[Replica]
) -> AsyncIterator[tuple[Target, Target]]:
    """Stock on one process, and the three replicas behind the balancer."""
    async with stock_and_replicas(http, processes, a2a_v1_replicas) as pair:
        yield pair


def as_json(answer: Any) -> Any:
    return MessageToDict(answer) if isinstance(answer, Proto) else answer


def error(exc: A2AError) -> dict[str, Any]:
    return {"error": type(exc).__name__, "message": exc.message, "data": exc.data}


class Script:
    """The client's steps against one target, each answer added to the transcript."""

    def __init__(self, target: Target) -> None:
        self.target = target
        target.http.headers.setdefault(VERSION_HEADER, PROTOCOL_VERSION_CURRENT)  # as a client
        self.rpc = JsonRpcTransport(target.http, card(target.url), f"{target.url}/a2a")
        self.log = Transcript()

    async def call(self, step: str, request: Any, kept: Any = None) -> Any:
        """The answer to ``request``, added to the transcript (as ``kept`` keeps it)."""
        answer = await self.answer(request)
        self.log.add(step, kept(answer) if kept else answer)
        return answer

    async def answer(self, request: Any) -> Any:
        try:
            return as_json(await request)
        except A2AError as exc:
            return error(exc)

    async def send(self, step: str, text: str, context_id: str = "", task_id: str = "") -> Any:
        return await self.call(step, self.sending(text, context_id, task_id))

    def sending(self, text: str, context_id: str = "", task_id: str = "") -> Any:
        """A blocking ``SendMessage``."""
        request = send_request(text, context_id, task_id)
        request.configuration.CopyFrom(SendMessageConfiguration(return_immediately=False))
        return self.rpc.send_message(request)

    async def get(self, step: str, task_id: str, kept: Any = None) -> Any:
        return await self.call(step, self.rpc.get_task(GetTaskRequest(id=task_id)), kept)

    async def cancel(self, step: str, task_id: str, kept: Any = None) -> Any:
        return await self.call(step, self.rpc.cancel_task(CancelTaskRequest(id=task_id)), kept)

    async def rest_cancel(self, step: str, task_id: str) -> None:
        """``POST /tasks/{id}:cancel`` on the REST binding: its status and body."""
        response = await self.target.http.post(f"{self.target.url}/rest/tasks/{task_id}:cancel")
        self.log.add(step, [response.status_code, response.json()])

    def stream(self, text: str, context_id: str = "", task_id: str = "") -> Streaming:
        """A ``SendStreamingMessage`` in the background."""
        return Streaming(self.rpc.send_message_streaming(send_request(text, context_id, task_id)))

    def subscribe(self, task_id: str) -> Streaming:
        return Streaming(self.rpc.subscribe(SubscribeToTaskRequest(id=task_id)))


class Streaming:
    """A stream's answers (JSON), read in the background: ``started`` at the first artifact."""

    def __init__(self, events: AsyncIterator[Any]) -> None:
        self.answers: list[Any] = []
        self.task_id = ""
        self.artifacts = 0
        self.seen = asyncio.Condition()
        self.done = asyncio.create_task(self._read(events))

    async def _read(self, events: AsyncIterator[Any]) -> None:
        try:
            async for event in events:
                answer = as_json(event)
                payload = next(iter(answer.values()))
                self.task_id = self.task_id or payload.get("taskId") or payload.get("id", "")
                await self._saw(answer, "artifactUpdate" in answer)
        except A2AError as exc:
            self.answers.append(error(exc))

    async def _saw(self, answer: Any, artifact: bool) -> None:
        async with self.seen:
            self.answers.append(answer)
            self.artifacts += artifact
            self.seen.notify_all()

    async def started(self, artifacts: int = 1) -> str:
        """Once the stream has had ``artifacts`` artifacts: the task's id."""
        async with self.seen:
            await asyncio.wait_for(self.seen.wait_for(lambda: self.artifacts >= artifacts), WAIT)
        return self.task_id

    async def answered(self) -> None:
        """Once the stream has had an answer."""
        async with self.seen:
            await asyncio.wait_for(self.seen.wait_for(lambda: bool(self.answers)), WAIT)

    async def ended(self) -> list[Any]:
        await asyncio.wait_for(self.done, WAIT)
        return self.answers


async def a_finished_task(script: Script) -> None:
    """Send, stream, get; what a finished or unknown task answers to the rest."""
    sent = (await script.send("send", "short"))["task"]
    streaming = script.stream("short")
    script.log.add("stream", await streaming.ended())
    task_id, context_id = sent["id"], sent["contextId"]
    await script.get("get", streaming.task_id)
    await script.cancel("cancel a completed task", task_id)
    await script.rest_cancel("REST: cancel a completed task", task_id)
    await script.send("a message for a completed task", "short", context_id, task_id)
    script.log.add("subscribe to a completed task", await script.subscribe(task_id).ended())
    await script.cancel("cancel an unknown task", "no-such-task")
    await script.rest_cancel("REST: cancel an unknown task", "no-such-task")
    await script.get("get an unknown task", "no-such-task")
    await script.send("a message for an unknown task", "short", "", "no-such-task")
    script.log.add("subscribe to an unknown task", await script.subscribe("no-such-task").ended())


async def cancel_twice(script: Script) -> None:
    """Cancel a streaming task, then again (JSON-RPC and REST); get it."""
    streaming = script.stream("stream")
    task_id = await streaming.started()
    await script.cancel("cancel", task_id, chunks)
    script.log.add("the stream's end", (await streaming.ended())[-1])
    await script.cancel("cancel again", task_id)
    await script.rest_cancel("REST: cancel again", task_id)
    await script.get("get", task_id, chunks)


async def subscribe(script: Script) -> None:
    """Subscribe to a task held at its gate: the task as it stands, then its events to its end.
    (Not to the end of a cancel: the SDK does not promise its subscribers the end of a task it
    cancels on its own process, and its subscription stays open.)"""
    context = f"hold-{uuid.uuid4().hex[:8]}"
    streaming = script.stream("hold", context)
    task_id = await streaming.started(artifacts=3)  # all it streams before its gate
    following = script.subscribe(task_id)
    await following.answered()
    await script.target.open(context)
    script.log.add("subscription", await following.ended())
    script.log.add("the stream", await streaming.ended())


async def a_follow_up(script: Script, where: str, how: str) -> None:
    """A message for a task still running (held at its gate), sent to the replica running it or
    another: it waits for the running execution's end, then runs (as the SDK runs it)."""
    context = f"hold-{uuid.uuid4().hex[:8]}"
    script.target.aim(0)
    first = script.stream("hold", context)
    task_id = await first.started(artifacts=3)  # all it streams before its gate
    script.target.aim(0 if where == "owner" else 1)
    before = await script.target.reads(task_id)
    if how == "stream":
        follow_up = script.stream("short", context, task_id)
        answer: Any = asyncio.create_task(follow_up.ended())
    else:
        answer = asyncio.create_task(script.answer(script.sending("short", context, task_id)))
    await script.target.read_again(task_id, before)
    await script.target.open(context)
    script.log.add("first", await first.ended())
    script.log.add("follow-up", await asyncio.wait_for(answer, WAIT))
    if how == "send":  # answered at the end of the execution before it: the follow-up runs on
        await asyncio.wait_for(answer, WAIT)
        await eventually(lambda: followed_up(script, task_id))
    await script.get("get", task_id)


async def followed_up(script: Script, task_id: str) -> bool:
    """Whether the task completed the follow-up ("short", the last message asked)."""
    task = as_json(await script.rpc.get_task(GetTaskRequest(id=task_id)))
    asked = [m["parts"][0]["text"] for m in task.get("history", []) if m["role"] == "ROLE_USER"]
    return task["status"]["state"] == "TASK_STATE_COMPLETED" and asked[-1:] == ["short"]


SCRIPTS = [a_finished_task, cancel_twice, subscribe]


async def transcripts(targets: tuple[Target, Target], script: Any, *args: Any) -> list[Any]:
    found = []
    for target in targets:
        run = Script(target)
        try:
            await script(run, *args)
        except Exception as exc:
            exc.add_note(f"against {target.name}; answers so far: {run.log.answers}")
            raise
        found.append(run.log.scrubbed())
    return found


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda script: script.__name__)
async def test_the_replicas_answer_as_stock_a2a_sdk(
    targets: tuple[Target, Target], script: Any
) -> None:
    stock, replicas = await transcripts(targets, script)
    assert replicas == stock, difference(stock, replicas)


@pytest.mark.parametrize("how", ["stream", "send"])
@pytest.mark.parametrize("where", ["owner", "other"])
async def test_a_follow_up_is_answered_as_stock_a2a_sdk_answers_it(
    targets: tuple[Target, Target], where: str, how: str
) -> None:
    stock, replicas = await transcripts(targets, a_follow_up, where, how)
    assert replicas == stock, difference(stock, replicas)
    texts = [artifact_text(artifact) for artifact in dict(replicas)["get"]["artifacts"]]
    assert texts == ["t0 ", "t1 ", "t2 ", "done"] * 2
