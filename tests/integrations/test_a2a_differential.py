"""A2A (a2a-sdk 0.3) differentially: the same client script, sent with the SDK's own JSON-RPC
transport, against stock a2a-sdk on one process (its ``DefaultRequestHandler`` and in-memory
store: ``a2a_stock_replica.py``) and against three replicas (``BusRequestHandler``, one Redis)
behind a round-robin balancer; the answers must be the same, modulo ids and timing.

What is timing, scrubbed: ids and timestamps (``a2a_differential.py``), and how many chunks the
agent streamed before a cancel reached it ("t0 ", "t1 ", ... up to where it stopped: kept as
"t0 ..."). One answer is not compared: a2a-sdk 0.3 runs a follow-up message concurrently with the
task's running execution, on one event queue, and the first of the two to end closes the other's
stream (the running execution's last events and output are lost). The replicas queue the
follow-up behind the execution instead (as a2a-sdk 1.x does on one process): the follow-up's own
answer and the task's end are compared; the replicas' first stream is checked on its own."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from a2a.client.errors import A2AClientJSONRPCError
from a2a.client.transports.jsonrpc import JsonRpcTransport
from a2a.types import (
    MessageSendConfiguration,
    MessageSendParams,
    TaskArtifactUpdateEvent,
    TaskIdParams,
    TaskQueryParams,
)
from pydantic import BaseModel

from node.embedded import EmbeddedServer

from ..helpers import WAIT
from .a2a_differential import (
    Target,
    Transcript,
    artifact_text,
    chunks,
    difference,
    stock_and_replicas,
    stock_and_third,
)
from .a2a_support import message
from .conftest import TRPC_REPLICA
from .replica import Replica

STOCK = "tests.integrations.a2a_stock_replica"


@pytest.fixture(scope="module")
def processes(redis_server: EmbeddedServer, replica_namespace: str) -> Iterator[list[Replica]]:
    """Stock on one process, and the third replica."""
    with stock_and_third(STOCK, TRPC_REPLICA, redis_server.url, replica_namespace) as spawned:
        yield spawned


@pytest.fixture
async def targets(
    http: httpx.AsyncClient, processes: list[Replica], trpc_replicas: list[Replica]
) -> AsyncIterator[tuple[Target, Target]]:
    """Stock on one process, and the three replicas behind the balancer."""
    async with stock_and_replicas(http, processes, trpc_replicas) as pair:
        yield pair


def as_json(answer: Any) -> Any:
    if isinstance(answer, BaseModel):
        return answer.model_dump(mode="json", exclude_none=True, by_alias=True)
    return answer


class Script:
    """The client's steps against one target, each answer added to the transcript."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.rpc = JsonRpcTransport(target.http, url=f"{target.url}/a2a/")
        self.log = Transcript()

    async def call(self, step: str, request: Any, kept: Any = None) -> Any:
        """The answer to ``request``, added to the transcript (as ``kept`` keeps it)."""
        answer = await self.answer(request)
        self.log.add(step, kept(answer) if kept else answer)
        return answer

    async def answer(self, request: Any) -> Any:
        try:
            return as_json(await request)
        except A2AClientJSONRPCError as exc:
            return {"error": as_json(exc.error)}

    async def send(
        self, step: str, text: str, context_id: str | None = None, task_id: str | None = None
    ) -> Any:
        return await self.call(step, self.sending(text, context_id, task_id))

    def sending(self, text: str, context_id: str | None = None, task_id: str | None = None) -> Any:
        """A blocking ``message/send``."""
        params = MessageSendParams(
            message=message(text, context_id, task_id),
            configuration=MessageSendConfiguration(blocking=True),
        )
        return self.rpc.send_message(params)

    async def get(self, step: str, task_id: str, kept: Any = None) -> Any:
        return await self.call(step, self.rpc.get_task(TaskQueryParams(id=task_id)), kept)

    async def cancel(self, step: str, task_id: str, kept: Any = None) -> Any:
        return await self.call(step, self.rpc.cancel_task(TaskIdParams(id=task_id)), kept)

    def stream(
        self, text: str, context_id: str | None = None, task_id: str | None = None
    ) -> Streaming:
        """A ``message/stream`` in the background."""
        params = MessageSendParams(message=message(text, context_id, task_id))
        return Streaming(self.rpc.send_message_streaming(params))

    def resubscribe(self, task_id: str) -> Streaming:
        return Streaming(self.rpc.resubscribe(TaskIdParams(id=task_id)))


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
                self.answers.append(as_json(event))
                self.task_id = self.task_id or getattr(event, "task_id", None) or event.id
                await self._saw(isinstance(event, TaskArtifactUpdateEvent))
        except A2AClientJSONRPCError as exc:
            self.answers.append({"error": as_json(exc.error)})

    async def _saw(self, artifact: bool) -> None:
        async with self.seen:
            self.artifacts += artifact
            self.seen.notify_all()

    async def started(self, artifacts: int = 1) -> str:
        """Once the stream has had ``artifacts`` artifacts: the task's id."""
        async with self.seen:
            await asyncio.wait_for(self.seen.wait_for(lambda: self.artifacts >= artifacts), WAIT)
        return self.task_id

    async def ended(self) -> list[Any]:
        await asyncio.wait_for(self.done, WAIT)
        return self.answers


async def a_finished_task(script: Script) -> None:
    """Send, stream, get; what a finished or unknown task answers to the rest."""
    sent = await script.send("send", "short")
    streaming = script.stream("short")
    script.log.add("stream", await streaming.ended())
    task_id, context_id = sent["id"], sent["contextId"]
    await script.get("get", streaming.task_id)
    await script.cancel("cancel a completed task", task_id)
    await script.send("a message for a completed task", "short", context_id, task_id)
    script.log.add("resubscribe a completed task", await script.resubscribe(task_id).ended())
    await script.cancel("cancel an unknown task", "no-such-task")
    await script.get("get an unknown task", "no-such-task")
    await script.send("a message for an unknown task", "short", None, "no-such-task")
    script.log.add("resubscribe an unknown task", await script.resubscribe("no-such-task").ended())


async def cancel_twice(script: Script) -> None:
    """Cancel a streaming task, then again; get it."""
    streaming = script.stream("stream")
    task_id = await streaming.started()
    await script.cancel("cancel", task_id, chunks)
    script.log.add("the stream's end", (await streaming.ended())[-1])
    await script.cancel("cancel again", task_id)
    await script.get("get", task_id, chunks)


async def resubscribe(script: Script) -> None:
    """Resubscribe to a streaming task, cancel it: the resubscription streams to its end."""
    streaming = script.stream("stream")
    task_id = await streaming.started()
    following = script.resubscribe(task_id)
    await following.started()
    # stock's answer here carries a race of its own: the cancel's consumer reads the task after
    # the resubscription's saved its end, or before (its status message then in its history too)
    await script.cancel("cancel", task_id, lambda task: task["status"]["state"])
    script.log.add("resubscription", chunks(await following.ended()))
    await streaming.ended()


async def a_follow_up(script: Script, where: str, how: str) -> None:
    """A message for a task still running (held at its gate), sent to the replica running it or
    another: it waits for the running execution's end, then runs (stock: at once, beside it)."""
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
    await script.get("get", task_id)


SCRIPTS = [a_finished_task, cancel_twice, resubscribe]


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


def outline(transcript: list[Any]) -> list[Any]:
    """What stock a2a-sdk 0.3 answers to a follow-up whatever the timing: the follow-up's answer
    (a stream from ``working`` to a final ``completed``, or the task ``completed``) and the
    task's end (``completed``, the follow-up last in its history). Not the rest: the two
    executions run side by side on one queue, and which ends first decides it."""
    kept: list[Any] = []
    for step, answer in transcript:
        if step == "follow-up" and isinstance(answer, list):
            first, last = answer[0], answer[-1]
            kept.append((step, [first["status"]["state"], last["status"]["state"], last["final"]]))
        elif step in ("follow-up", "get"):
            asked = [m["parts"][0]["text"] for m in answer["history"] if m["role"] == "user"]
            kept.append((step, [answer["kind"], answer["status"]["state"], asked[-1]]))
    return kept


def artifact_texts(answer: Any) -> list[str]:
    if isinstance(answer, list):
        return [artifact_text(event["artifact"]) for event in answer if "artifact" in event]
    return [artifact_text(artifact) for artifact in answer["artifacts"]]


@pytest.mark.parametrize("how", ["stream", "send"])
@pytest.mark.parametrize("where", ["owner", "other"])
async def test_a_follow_up_is_answered_as_stock_a2a_sdk_answers_it(
    targets: tuple[Target, Target], where: str, how: str
) -> None:
    """The follow-up answered as stock answers it; on the replicas, it also ran after the task's
    execution, which went on to its end: both outputs in order, the first stream complete."""
    stock, replicas = await transcripts(targets, a_follow_up, where, how)
    assert outline(replicas) == outline(stock), difference(stock, replicas)
    answers = dict(replicas)
    first = answers["first"]
    assert [first[-1]["status"]["state"], first[-1]["final"]] == ["completed", True]
    assert artifact_texts(first) == ["t0 ", "t1 ", "t2 ", "done"]
    if how == "stream":
        assert artifact_texts(answers["follow-up"]) == ["t0 ", "t1 ", "t2 ", "done"]
    assert artifact_texts(answers["get"]) == ["t0 ", "t1 ", "t2 ", "done"] * 2
