"""A2A (a2a-sdk 1.x, trpc-agent's ``a2a_v1`` service): every replica answers as one a2a-sdk server
does: ``CancelTask`` (JSON-RPC and REST) of a task on any replica, and a message for a task still
running on any replica queued behind it.

    trpc_agent.install(bus)  # every replica, on the loop of the A2A server
    handler = BusRequestHandler(
        bus,
        agent_executor=service,  # trpc_agent_sdk.server.a2a_v1.TrpcA2aAgentService
        task_store=VersionedDatabaseTaskStore(engine),  # shared by the replicas
        event_stream=DatabaseTaskEventStream(engine),  # SubscribeToTask on any replica
        agent_card=card,
    )
    app = create_a2a_application(service, request_handler=handler)

a2a-sdk 1.x cancels a task running on another replica by writing ``CANCELED`` to the shared
store; the owner notices at its next save and kills its producer mid-await, losing the agent's
partial output. Here each execution of a task is a bus run instead (see ``_a2a_runs.py``), and
``CancelTask`` on any replica cancels it cooperatively: the agent stops at its next checkpoint
(or as the bus mode asks), trpc-agent keeps its partial output, the owner's executor ends the task
``CANCELED`` and the run ends once the store has it. The answers: ``CANCELED`` once stopped,
``WORKING`` with a status message while a cancel is pending (the task still ends ``CANCELED``),
``TaskNotFoundError``, ``TaskNotCancelableError`` (REST 400 ``TASK_NOT_CANCELABLE``) for a task in
a terminal state (``CANCELED`` too, as a2a-sdk answers), and ``CANCELED`` for a task whose
replica died.

A message for a task takes the task's turn first (:class:`~._a2a_runs.Turn`): an execution of the
task still going on another replica would otherwise run beside it, and its failure there (the
bus run of the task is one at a time) write ``FAILED`` over the task, which stops the running
execution at its next save. Then it runs as a2a-sdk runs a message queued behind an execution on
one process: its stream carries the events of the executions before it (from the shared
``event_stream``, or this replica's) and then its own; a blocking send answers the task as the
execution before it left it, the message running on after; a task that ended is reopened
``WORKING`` for it; one canceled meanwhile is answered as it is, the message not executed.

A call to another A2A agent made inside a run, with :func:`send_message`, is a child of that run:
cancelling the run (or its tree) sends ``CancelTask`` for the remote task (``_a2a_calls.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from typing import Any, cast

from a2a.client import Client
from a2a.helpers import new_text_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.agent_execution.active_task import INTERRUPTED_TASK_STATES, TERMINAL_TASK_STATES
from a2a.server.cluster import (
    ConcurrentTaskModificationError,
    LegacyTaskStoreAdapter,
    StoredTask,
    TaskVersion,
    VersionedTaskStore,
)
from a2a.server.context import ServerCallContext
from a2a.server.events.event_queue import Event, EventQueue
from a2a.server.request_handlers import DefaultRequestHandlerV2
from a2a.server.tasks import TaskStore
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    Task,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from a2a.utils.errors import TaskNotCancelableError, TaskNotFoundError, UnsupportedOperationError
from a2a.utils.proto_utils import validate_proto_required_fields
from a2a.utils.task import apply_history_length, validate_history_length

from cancel_bus import CancelBus, CancelMode, RunHandle

from ._a2a_calls import Remote, TaskEnd, remote_call
from ._a2a_runs import CANCEL_PENDING, LEAKED_EVENT, OWNER_LOST, TaskRuns, Turn, Verdict

__all__ = ["BusRequestHandler", "send_message"]

log = logging.getLogger("cancel_bus.integrations.a2a")

CANCELED = TaskState.TASK_STATE_CANCELED
WORKING = TaskState.TASK_STATE_WORKING
ENDS = TERMINAL_TASK_STATES | INTERRUPTED_TASK_STATES  # the states an execution ends in
STORE_TIMEOUT = 5.0  # how long an execution waits for its end to be stored


@asynccontextmanager
async def send_message(
    bus: CancelBus,
    client: Client,
    request: SendMessageRequest,
    *,
    parent: str | None = None,
    **options: Any,
) -> AsyncIterator[AsyncIterator[StreamResponse]]:
    """``client.send_message(request, **options)`` as a bus run of its own, a child of the run
    whose code calls it (or of the run id ``parent``), registered before the message is sent.

    A cancel of that run (the tree cancel of the calling run, from any node) sends the remote
    agent ``CancelTask`` for the task; the stream then goes on to the task's final status. The
    call's run ends when the remote task has: ``cancelled`` once the remote agent said
    ``CANCELED``. Leaving the block while the task goes on cancels it too: use a streaming
    client (a blocking ``SendMessage`` cannot be cancelled before it answers, the task id unknown
    until then; a non-blocking one answers at once). Raises ``RunCancelled`` if the parent's
    cancel was already accepted."""

    async def cancel(task_id: str) -> TaskEnd | None:
        try:
            task = await client.cancel_task(CancelTaskRequest(id=task_id))
        except (TaskNotCancelableError, TaskNotFoundError):
            return TaskEnd.OTHER  # it ended otherwise, or is gone
        return _end_of(task.status.state)

    events = cast(AsyncGenerator[StreamResponse], client.send_message(request, **options))
    async with remote_call(bus, events, Remote(_task_of, cancel), parent) as stream:
        yield stream


def _task_of(response: StreamResponse) -> tuple[str | None, TaskEnd | None]:
    kind = response.WhichOneof("payload")
    if kind == "task":
        return response.task.id, _end_of(response.task.status.state)
    if kind == "status_update":
        return response.status_update.task_id, _end_of(response.status_update.status.state)
    if kind == "artifact_update":
        return response.artifact_update.task_id, None
    return response.message.task_id or None, TaskEnd.OTHER  # a direct answer: no task goes on


def _end_of(state: TaskState) -> TaskEnd | None:
    if state == CANCELED:
        return TaskEnd.CANCELED
    return TaskEnd.OTHER if state in ENDS else None


class BusRequestHandler(DefaultRequestHandlerV2):
    """a2a-sdk's request handler with each task execution a bus run: ``CancelTask`` works on
    every replica.

    ``cancel_timeout``: how long a cancel waits for the task to stop before answering it
    ``WORKING`` (cancel pending). ``cancel_mode``: the bus mode of ``CancelTask``. Pass the
    SDK's ``event_stream=`` for ``SubscribeToTask`` on any replica."""

    def __init__(
        self,
        bus: CancelBus,
        *,
        agent_executor: AgentExecutor,
        task_store: TaskStore | VersionedTaskStore,
        cancel_timeout: float = 5.0,
        cancel_mode: CancelMode = CancelMode.CHECKPOINT,
        **options: Any,
    ) -> None:
        self._runs = TaskRuns(bus, timeout=cancel_timeout, mode=cancel_mode, relay=False)
        if not isinstance(task_store, VersionedTaskStore):
            task_store = LegacyTaskStoreAdapter(task_store)
        store = _EndsStore(task_store)
        executor = _TaskExecutor(agent_executor, self._runs, store)
        super().__init__(agent_executor=executor, task_store=store, **options)
        self._store = store
        self._sends: set[asyncio.Task[None]] = set()  # messages running on after their answer

    async def on_cancel_task(
        self, params: CancelTaskRequest, context: ServerCallContext
    ) -> Task | None:
        """``CancelTask`` on any replica: cancels the bus run of the task's execution wherever it
        runs, and answers the task ``CANCELED`` once it stopped, or ``WORKING`` with a status
        message if it did not stop within ``cancel_timeout``. A task with no execution, or whose
        replica was lost, is stored ``CANCELED`` here; one in a terminal state (``CANCELED``
        too), or that ended otherwise, raises ``TaskNotCancelableError`` (as a2a-sdk does)."""
        task = await self._stored(params.id, context)
        if task.status.state in TERMINAL_TASK_STATES:
            raise TaskNotCancelableError
        found, result = await self._runs.cancel(task.id)
        if found is Verdict.STOPPING:
            if result.run is not None:
                self._runs.end_if_lost(result.run.run_id, lambda: self._end_lost(task.id))
            pending = Task()
            pending.CopyFrom(task)
            pending.status.CopyFrom(_status(task, TaskState.TASK_STATE_WORKING, CANCEL_PENDING))
            return pending
        if found is Verdict.LOST:
            task = await self._end(task.id, OWNER_LOST, context)
        elif found is Verdict.IDLE:  # no execution: nothing else stores its end
            task = await self._end(task.id, "Task was canceled.", context)
        else:
            task = await self._stored(task.id, context)
            if task.status.state not in TERMINAL_TASK_STATES:  # it ended waiting for input
                task = await self._end(task.id, "Task was canceled.", context)
        if task.status.state != CANCELED:
            raise TaskNotCancelableError
        return task

    async def on_message_send(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> Message | Task:
        """The SDK's; a message for a task in the task's turn (see the module's docstring)."""
        queued = await self._queued(params, context)
        if queued is None:
            return cast(Message | Task, await super().on_message_send(params, context))
        turn: Turn[Event] | None = queued[0]
        try:
            execution = await queued[0].wait()
            ended = await self._ready(params.message.task_id, context)
            if ended.status.state == CANCELED:  # nothing runs
                return apply_history_length(ended, params.configuration)
            if not execution.waited:
                return cast(Message | Task, await super().on_message_send(params, context))
            self._on_after(self._send_after(params, context, queued[0]))
            turn = None  # released by the message running on
            return apply_history_length(ended, params.configuration)
        finally:
            if turn is not None:
                await turn.release()

    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event, None]:
        """The SDK's; a message for a task in the task's turn, its stream carrying the events of
        the task's executions before it (see the module's docstring)."""
        queued = await self._queued(params, context)
        if queued is None:
            async for event in super().on_message_send_stream(params, context):
                yield event
            return
        turn, arrival = queued
        task_id = params.message.task_id
        try:
            async for event in turn.earlier(self._events(task_id, arrival), _ends):
                yield event
            if (await self._ready(task_id, context)).status.state != CANCELED:
                async for event in super().on_message_send_stream(params, context):
                    yield event
        finally:
            await turn.release()

    async def _queued(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> tuple[Turn[Event], TaskVersion] | None:
        """The turn a message for a task waits for, and the task's version as it came; None if
        it names no task, or one the SDK refuses (unknown, of another context, ended: the SDK's
        own error then)."""
        validate_proto_required_fields(params)
        validate_history_length(params.configuration)
        message = params.message
        stored = await self._store.get(message.task_id, context) if message.task_id else None
        if (
            stored is None
            or stored.task.status.state in TERMINAL_TASK_STATES
            or (message.context_id and message.context_id != stored.task.context_id)
        ):
            return None
        return Turn(self._runs, message.task_id), stored.version

    async def _events(self, task_id: str, after: TaskVersion) -> AsyncIterator[Event]:
        """The task's events after version ``after``: from the shared event stream, or (from
        now on) this replica's."""
        if self._event_stream is not None:
            async for versioned in self._event_stream.subscribe(task_id, after=after):
                yield versioned.event
            return
        active = await self._active_task_registry.get(task_id)
        if active is not None:
            with contextlib.suppress(UnsupportedOperationError):  # it ended
                async for event in active.subscribe():
                    yield event

    async def _ready(self, task_id: str, context: ServerCallContext) -> Task:
        """The message's turn came: the task as the execution before it left it (or as it is).
        One that ended otherwise than ``CANCELED`` is stored again ``WORKING``, reopened for the
        message's execution (the SDK starts none on a terminal task)."""
        while True:
            stored = await self._store.get(task_id, context)
            if stored is None:
                raise TaskNotFoundError
            task = stored.task
            if task.status.state not in TERMINAL_TASK_STATES or task.status.state == CANCELED:
                return task
            reopened = Task()
            reopened.CopyFrom(task)
            reopened.status.CopyFrom(TaskStatus(state=WORKING))
            reopened.status.timestamp.GetCurrentTime()
            with contextlib.suppress(ConcurrentTaskModificationError):  # read it again
                await self._store.save(
                    reopened, event=None, prev=task, prev_version=stored.version, context=context
                )
                return task

    async def _send_after(
        self, params: SendMessageRequest, context: ServerCallContext, turn: Turn[Event]
    ) -> None:
        """A blocking message answered at the end of the execution before it: it runs on."""
        try:
            await super().on_message_send(params, context)
        except Exception:
            log.exception("cancel-bus: the message for A2A task %s failed", params.message.task_id)
        finally:
            await turn.release()

    def _on_after(self, send: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(send)
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)

    async def on_subscribe_to_task(
        self, params: SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event, None]:
        """The SDK's; on a replica not executing the task without an ``event_stream``, an error
        that says so (instead of the SDK's "not found")."""
        if self._event_stream is None and params.id not in self._runs.local:
            executing = await self._runs.executing_on(params.id)
            if executing is not None:
                raise UnsupportedOperationError(
                    message=f"task {params.id} executes on replica {executing}: subscribe there,"
                    " or give the replicas a shared event_stream"
                )
        async for event in super().on_subscribe_to_task(params, context):
            yield event

    async def _stored(self, task_id: str, context: ServerCallContext) -> Task:
        stored = await self._store.get(task_id, context)
        if stored is None:
            raise TaskNotFoundError
        return stored.task

    async def _end_lost(self, task_id: str) -> None:
        await self._end(task_id, OWNER_LOST, ServerCallContext())

    async def _end(self, task_id: str, text: str, context: ServerCallContext) -> Task:
        """Store the task canceled unless it already ended (no execution will store its end);
        the task as stored."""
        stored = await self._store.get(task_id, context)
        if stored is None:
            raise TaskNotFoundError
        task = stored.task
        if task.status.state in TERMINAL_TASK_STATES:
            return task
        current = Task()
        current.CopyFrom(task)
        current.status.CopyFrom(_status(task, CANCELED, text))
        try:
            return await self._write_cancel(task_id, current, stored.version, context)
        except ConcurrentTaskModificationError:  # it ended meanwhile
            return await self._stored(task_id, context)


class _EndsStore(VersionedTaskStore):
    """The task store, telling the executions when their task's end is stored."""

    def __init__(self, store: VersionedTaskStore) -> None:
        self._store = store
        self._waiting: dict[str, asyncio.Event] = {}

    def expect_end(self, task_id: str) -> asyncio.Event:
        return self._waiting.setdefault(task_id, asyncio.Event())

    def forget(self, task_id: str) -> None:
        self._waiting.pop(task_id, None)

    async def save(
        self,
        task: Task,
        *,
        event: Event | None,
        prev: Task | None,
        prev_version: TaskVersion,
        context: ServerCallContext,
    ) -> TaskVersion:
        version = await self._store.save(
            task, event=event, prev=prev, prev_version=prev_version, context=context
        )
        if task.status.state in ENDS and task.id in self._waiting:
            self._waiting[task.id].set()
        return version

    async def get(self, task_id: str, context: ServerCallContext) -> StoredTask | None:
        return await self._store.get(task_id, context)

    async def list(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        return await self._store.list(params, context)

    async def delete(self, task_id: str, context: ServerCallContext) -> None:
        await self._store.delete(task_id, context)


class _TaskExecutor(AgentExecutor):
    """Runs the wrapped executor as the task's bus run; the run ends once the task's end is
    stored, so a canceller that saw the run end reads it."""

    def __init__(self, executor: AgentExecutor, runs: TaskRuns, store: _EndsStore) -> None:
        self._executor = executor
        self._runs = runs
        self._store = store

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task_id = cast(str, context.task_id)
        async with self._runs.executing(task_id) as execution:
            stored = self._store.expect_end(task_id)
            events = _TaskEvents(event_queue, execution.run)
            try:
                await self._executor.execute(context, events)
                if execution.run.cancel_requested is not None and events.final is None:
                    await events.enqueue_event(_canceled_event(context))
                if events.final is not None:
                    with contextlib.suppress(TimeoutError):  # then a canceller reads it later
                        await asyncio.wait_for(stored.wait(), STORE_TIMEOUT)
            finally:
                self._store.forget(task_id)
                execution.canceled = events.canceled

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        await self._runs.cancel(cast(str, context.task_id))


class _TaskEvents(EventQueue):
    """What the wrapped executor writes to: once a cancel was requested, an end other than
    failed becomes canceled. An event written after the task's run ended is a leak of the run
    (reported)."""

    def __init__(self, queue: EventQueue, run: RunHandle) -> None:
        self._queue = queue
        self._run = run
        self.final: TaskStatusUpdateEvent | None = None

    @property
    def canceled(self) -> bool:
        return self.final is not None and self.final.status.state == CANCELED

    async def enqueue_event(self, event: Event) -> None:
        if self._run.final_status is not None:
            self._run.report_leak(LEAKED_EVENT)
        elif isinstance(event, TaskStatusUpdateEvent) and event.status.state in ENDS:
            if (
                self._run.cancel_requested is not None
                and event.status.state != TaskState.TASK_STATE_FAILED
            ):
                canceled = TaskStatusUpdateEvent()
                canceled.CopyFrom(event)
                canceled.status.state = CANCELED
                event = canceled
            self.final = event
        await self._queue.enqueue_event(event)


def _status(task: Task, state: TaskState, text: str) -> TaskStatus:
    message = new_text_message(text, context_id=task.context_id, task_id=task.id)
    return TaskStatus(state=state, message=message)


def _canceled_event(context: RequestContext) -> TaskStatusUpdateEvent:
    task = Task(id=cast(str, context.task_id), context_id=cast(str, context.context_id))
    return TaskStatusUpdateEvent(
        task_id=task.id,
        context_id=task.context_id,
        status=_status(task, CANCELED, "Task was canceled."),
    )


def _ends(event: Event) -> bool:
    """Whether the event ends an execution of its task."""
    if isinstance(event, Message):
        return True
    return isinstance(event, TaskStatusUpdateEvent | Task) and event.status.state in ENDS
