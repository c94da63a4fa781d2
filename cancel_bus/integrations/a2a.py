"""A2A (a2a-sdk 0.3, trpc-agent's A2A service): every replica answers as one a2a-sdk server does:
``tasks/cancel`` and ``tasks/resubscribe`` of a task on any replica, and a message for a task
still running on any replica queued behind it.

    trpc_agent.install(bus)  # every replica, on the loop of the A2A server
    handler = BusRequestHandler(
        bus, agent_executor=TrpcA2aAgentService(...), task_store=BusTaskStore(bus)
    )
    app = A2AStarletteApplication(agent_card=card, http_handler=handler).build()

Each execution of a task is a bus run (see ``_a2a_runs.py``). ``tasks/cancel`` on any replica
cancels it and answers as a2a-sdk does: the task ``canceled`` once it stopped (the owner's
executor stored it before the run ended), ``working`` with a status message if it did not stop
within ``cancel_timeout`` (it still ends ``canceled``: a final ``completed`` after a cancel is
stored ``canceled``), ``TaskNotFoundError`` for an unknown task, ``TaskNotCancelableError`` for a
task in a terminal state (``canceled`` included). A task whose replica died is ended ``canceled``
by the replica that took the cancel. :class:`BusTaskStore` keeps tasks in the bus's Redis.

A message for an existing task (a follow-up) is accepted as a2a-sdk accepts it (the task exists
and is not terminal) and gets an event queue of its own; its execution waits for the task's
execution before it, wherever that runs, then runs on the task as that one left it (a task that
ended, other than ``canceled``, is reopened ``working``; a task canceled meanwhile is answered as
it is, the message not executed). Its answer is its own execution's: its events (``message/
stream``), the task at its end (blocking ``message/send``), the task once it starts (non-blocking).

A call to another A2A agent made inside a run, with :func:`send_message`, is a child of that run:
cancelling the run (or its tree) sends ``tasks/cancel`` for the remote task (``_a2a_calls.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any, cast

from a2a.client import Client, ClientEvent
from a2a.client.errors import A2AClientJSONRPCError
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.context import ServerCallContext
from a2a.server.events import Event, EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.tasks import ResultAggregator, TaskManager, TaskStore
from a2a.types import (
    InvalidParamsError,
    Message,
    MessageSendParams,
    Task,
    TaskIdParams,
    TaskNotCancelableError,
    TaskNotFoundError,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
    UnsupportedOperationError,
)
from a2a.utils import new_agent_text_message
from a2a.utils.errors import ServerError
from pydantic import TypeAdapter

from cancel_bus import CancelBus, CancelMode, RunHandle

from ._a2a_calls import Remote, TaskEnd, remote_call
from ._a2a_runs import (
    CANCEL_PENDING,
    LEAKED_EVENT,
    OWNER_LOST,
    RELAY_EVENT,
    TaskRuns,
    Verdict,
)
from ._a2a_store import ENDS, TERMINAL, BusTaskStore, EndsStore

__all__ = ["BusRequestHandler", "BusTaskStore", "send_message"]

STORE_TIMEOUT = 5.0  # how long an execution waits for its end to be stored
_NOT_RELAYED = "this execution of the task is a follow-up's: resubscribe needs relay=True"
_EVENT: TypeAdapter[Event] = TypeAdapter(Event)
# a follow-up's turn came: the task as the execution before it left it -> as its execution starts
Turn = Callable[[Task], Awaitable[Task]]


@asynccontextmanager
async def send_message(
    bus: CancelBus,
    client: Client,
    message: Message,
    *,
    parent: str | None = None,
    **options: Any,
) -> AsyncIterator[AsyncIterator[ClientEvent | Message]]:
    """``client.send_message(message, **options)`` as a bus run of its own, a child of the run
    whose code calls it (or of the run id ``parent``), registered before the message is sent.

    A cancel of that run (the tree cancel of the calling run, from any node) sends the remote
    agent ``tasks/cancel`` for the task; the stream then goes on to the task's final status. The
    call's run ends when the remote task has: ``cancelled`` once the remote agent said
    ``canceled``. Leaving the block while the task goes on cancels it too: use a streaming
    client (a blocking ``message/send`` cannot be cancelled before it answers, the task id unknown
    until then; a non-blocking one answers at once). Raises ``RunCancelled`` if the parent's
    cancel was already accepted."""

    async def cancel(task_id: str) -> TaskEnd | None:
        try:
            task = await client.cancel_task(TaskIdParams(id=task_id))
        except A2AClientJSONRPCError as exc:
            if exc.error.code in (TaskNotCancelableError().code, TaskNotFoundError().code):
                return TaskEnd.OTHER  # it ended otherwise, or is gone
            raise
        return _end_of(task.status.state)

    events = cast(AsyncGenerator[ClientEvent | Message], client.send_message(message, **options))
    async with remote_call(bus, events, Remote(_task_of, cancel), parent) as stream:
        yield stream


def _task_of(event: ClientEvent | Message) -> tuple[str | None, TaskEnd | None]:
    if isinstance(event, Message):  # a direct answer: no task goes on
        return event.task_id, TaskEnd.OTHER
    task, _ = event
    return task.id, _end_of(task.status.state)


def _end_of(state: TaskState) -> TaskEnd | None:
    if state is TaskState.canceled:
        return TaskEnd.CANCELED
    return TaskEnd.OTHER if state in ENDS else None


class BusRequestHandler(DefaultRequestHandler):
    """a2a-sdk's request handler with each task execution a bus run: ``tasks/cancel`` and
    ``tasks/resubscribe`` work on every replica, and a message for a task still running on any
    replica is queued behind it.

    ``cancel_timeout``: how long a cancel waits for the task to stop before answering it
    ``working`` (cancel pending). ``cancel_mode``: the bus mode of ``tasks/cancel``. ``relay``:
    relay each task's events so any replica can stream them."""

    def __init__(
        self,
        bus: CancelBus,
        *,
        agent_executor: AgentExecutor,
        task_store: TaskStore,
        cancel_timeout: float = 5.0,
        cancel_mode: CancelMode = CancelMode.CHECKPOINT,
        relay: bool = True,
        **options: Any,
    ) -> None:
        self._runs = TaskRuns(bus, timeout=cancel_timeout, mode=cancel_mode, relay=relay)
        self._store = EndsStore(task_store)
        self._executor = _TaskExecutor(agent_executor, self._runs, self._store)
        self._own_queues: dict[asyncio.Task[None], RequestContext] = {}  # follow-ups' producers
        super().__init__(agent_executor=self._executor, task_store=self._store, **options)

    async def on_cancel_task(
        self, params: TaskIdParams, context: ServerCallContext | None = None
    ) -> Task | None:
        """``tasks/cancel`` on any replica: cancels the bus run of the task's execution wherever it
        runs, and answers the task ``canceled`` once it stopped, or ``working`` with a status
        message if it did not stop within ``cancel_timeout``. A task with no execution, or whose
        replica was lost, is stored ``canceled`` here; one in a terminal state (``canceled``
        too), or that ended otherwise, raises ``TaskNotCancelableError`` (as a2a-sdk does)."""
        task = await self._stored(params.id, context)
        if task.status.state in TERMINAL:
            raise ServerError(_not_cancelable(task))
        found, result = await self._runs.cancel(task.id)
        if found is Verdict.STOPPING:
            if result.run is not None:
                self._runs.end_if_lost(result.run.run_id, lambda: self._end_lost(task.id))
            message = new_agent_text_message(CANCEL_PENDING, task.context_id, task.id)
            status = TaskStatus(state=TaskState.working, message=message)
            return task.model_copy(update={"status": status})
        if found is Verdict.LOST:
            task = await self._end(task.id, OWNER_LOST)
        elif found is Verdict.IDLE:  # no execution: nothing else stores its end
            task = await self._end(task.id, "Task was canceled.")
        else:
            task = await self._stored(task.id, context)
            if task.status.state not in TERMINAL:  # the execution ended waiting for input
                task = await self._end(task.id, "Task was canceled.")
        if task.status.state is not TaskState.canceled:
            raise ServerError(_not_cancelable(task))
        return task

    async def on_resubscribe_to_task(
        self, params: TaskIdParams, context: ServerCallContext | None = None
    ) -> AsyncGenerator[Event]:
        """The task's events from its owner's relay, on every replica; with ``relay=False``, the
        SDK's own stream on the replica executing the task."""
        if not self._runs.relay and params.id in self._runs.local:
            if await self._queue_manager.get(params.id) is None:  # a follow-up's own queue
                raise ServerError(UnsupportedOperationError(message=_NOT_RELAYED))
            async for event in super().on_resubscribe_to_task(params, context):
                yield event
            return
        task = await self._stored(params.id, context)
        if task.status.state in TERMINAL:
            raise ServerError(
                InvalidParamsError(
                    message=f"Task {task.id} is in terminal state: {task.status.state.value}"
                )
            )
        problem = await self._runs.relay_problem(task.id)
        if problem is not None:
            raise ServerError(UnsupportedOperationError(message=problem))
        async for data in self._runs.relayed(task.id):
            event = _EVENT.validate_python(data)
            yield event
            if _is_final(event):
                return
        yield await self._stored(task.id, context)  # ended without a final event: as stored

    async def _setup_message_execution(
        self, params: MessageSendParams, context: ServerCallContext | None = None
    ) -> tuple[TaskManager, str, EventQueue, ResultAggregator, asyncio.Task[None]]:
        """The SDK's setup; for a message naming a task, the same checks and an event queue of
        its own (the SDK's would tap the queue of the task's running execution, and the first of
        the two to end would close the other's), its execution taking the task's next turn."""
        message = params.message
        if not message.task_id:
            return await super()._setup_message_execution(params, context)
        manager = TaskManager(
            task_id=message.task_id,
            context_id=message.context_id,
            task_store=self.task_store,
            initial_message=message,
            context=context,
        )
        task = await manager.get_task()
        if task is None:
            missing = f"Task {message.task_id} was specified but does not exist"
            raise ServerError(TaskNotFoundError(message=missing))
        if task.status.state in TERMINAL:
            raise ServerError(
                InvalidParamsError(
                    message=f"Task {task.id} is in terminal state: {task.status.state.value}"
                )
            )
        task = manager.update_with_message(message, task)
        request = await self._request_context_builder.build(
            params=params,
            task_id=task.id,
            context_id=message.context_id,
            task=task,
            context=context,
        )
        push = params.configuration.push_notification_config if params.configuration else None
        if self._push_config_store and push:
            await self._push_config_store.set_info(task.id, push)

        async def turn(stored: Task) -> Task:
            return await self._turn(manager, message, request, stored)

        self._executor.turns[request] = turn
        queue = EventQueue()
        producer = asyncio.create_task(self._run_event_stream(request, queue))
        self._own_queues[producer] = request
        return manager, task.id, queue, ResultAggregator(manager), producer

    async def _turn(
        self, manager: TaskManager, message: Message, request: RequestContext, stored: Task
    ) -> Task:
        """A follow-up's turn came: the task as the execution before it left it, the message
        added to its history, and reopened ``working`` if it ended (not if it was canceled)."""
        if stored.status.state is TaskState.canceled:
            return stored
        task = manager.update_with_message(message, stored)
        if task.status.state in TERMINAL:
            now = datetime.now(UTC).isoformat()
            task.status = TaskStatus(state=TaskState.working, timestamp=now)
            if not await self._store.reopen(task):  # canceled meanwhile
                return await self._stored(task.id, None)
        request.current_task = task
        return task

    async def _cleanup_producer(self, producer_task: asyncio.Task[None], task_id: str) -> None:
        """The SDK's cleanup; a follow-up's queue is its own (the SDK's would close the task's)."""
        request = self._own_queues.pop(producer_task, None)
        if request is None:
            await super()._cleanup_producer(producer_task, task_id)
            return
        try:
            with contextlib.suppress(asyncio.CancelledError):
                await producer_task
        finally:
            self._executor.turns.pop(request, None)  # if it was cancelled before it started

    async def _stored(self, task_id: str, context: ServerCallContext | None) -> Task:
        task = await self.task_store.get(task_id, context)
        if task is None:
            raise ServerError(TaskNotFoundError())
        return task

    async def _end_lost(self, task_id: str) -> None:
        await self._end(task_id, OWNER_LOST)

    async def _end(self, task_id: str, text: str) -> Task:
        """Store the task canceled unless it already ended (no execution will store its end);
        the task as stored."""
        task = await self._stored(task_id, None)
        await _store_end(self.task_store, task, _canceled_status(task, text))
        return await self._stored(task_id, None)


class _TaskExecutor(AgentExecutor):
    """Runs the wrapped executor as the task's bus run, in the task's turn; the run ends once the
    task's end is stored (so a canceller that saw the run end reads it, and the next message's
    execution starts from it)."""

    def __init__(self, executor: AgentExecutor, runs: TaskRuns, store: EndsStore) -> None:
        self._executor = executor
        self._runs = runs
        self._store = store
        self.turns: dict[RequestContext, Turn] = {}  # the follow-ups set up, not started

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task_id = cast(str, context.task_id)
        turn = self.turns.pop(context, None)
        async with self._runs.executing(task_id) as execution:
            stored = await self._store.get(task_id)
            if stored is not None and turn is not None:
                stored = await turn(stored)
            if stored is not None and (
                stored.status.state is TaskState.canceled
                or (turn is None and stored.status.state in TERMINAL)
            ):
                await event_queue.enqueue_event(stored)  # canceled before this execution began
                return
            ended = self._store.expect_end(task_id)
            run = execution.run
            events = _TaskEvents(event_queue, run, relay=self._runs.relay)
            try:
                await self._executor.execute(context, events)
            finally:
                try:
                    if run.cancel_requested is not None and events.final is None:
                        await events.enqueue_event(_canceled_event(context, "Task was canceled."))
                    if isinstance(events.final, TaskStatusUpdateEvent):
                        with contextlib.suppress(TimeoutError):  # saved by the request's consumer
                            await asyncio.wait_for(ended.wait(), STORE_TIMEOUT)
                        task = stored or _new_task(context)
                        await _store_end(self._store, task, events.final.status)
                finally:
                    self._store.forget(task_id)
                    execution.canceled = events.canceled

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        await self._runs.cancel(cast(str, context.task_id))


class _TaskEvents(EventQueue):
    """What the wrapped executor writes to: each event goes to the task's queue and its relay;
    once a cancel was requested, a final state other than failed becomes canceled. An event
    written after the task's run ended is a leak of the run (reported, and not relayed)."""

    def __init__(self, queue: EventQueue, run: RunHandle, *, relay: bool) -> None:
        super().__init__()
        self._queue = queue
        self._run = run
        self._relay = relay
        self.final: Event | None = None

    @property
    def canceled(self) -> bool:
        final = self.final
        return isinstance(final, TaskStatusUpdateEvent) and final.status.state is TaskState.canceled

    async def enqueue_event(self, event: Event) -> None:
        ended = self._run.final_status is not None
        if ended:
            self._run.report_leak(LEAKED_EVENT)
        elif _is_final(event):
            if (
                self._run.cancel_requested is not None
                and isinstance(event, TaskStatusUpdateEvent)
                and event.status.state not in (TaskState.canceled, TaskState.failed)
            ):
                event = event.model_copy(
                    update={"status": event.status.model_copy(update={"state": TaskState.canceled})}
                )
            self.final = event
        if self._relay and not ended:
            self._run.emit_event(RELAY_EVENT, event.model_dump(mode="json", exclude_none=True))
        await self._queue.enqueue_event(event)


def _is_final(event: Event) -> bool:
    return (
        isinstance(event, Message)
        or (isinstance(event, TaskStatusUpdateEvent) and event.final)
        or (isinstance(event, Task) and event.status.state in TERMINAL)
    )


async def _store_end(store: TaskStore, task: Task, status: TaskStatus) -> None:
    """Store the task's final status, unless it is already terminal (the latest stored state,
    with the artifacts saved so far)."""
    current = await store.get(task.id) or task
    if current.status.state not in TERMINAL:
        await store.save(current.model_copy(update={"status": status}))


def _new_task(context: RequestContext) -> Task:
    return Task(
        id=cast(str, context.task_id),
        context_id=cast(str, context.context_id),
        status=TaskStatus(state=TaskState.submitted),
        history=[context.message] if context.message is not None else None,
    )


def _canceled_status(task: Task, text: str) -> TaskStatus:
    message = new_agent_text_message(text, task.context_id, task.id)
    return TaskStatus(state=TaskState.canceled, message=message)


def _canceled_event(context: RequestContext, text: str) -> TaskStatusUpdateEvent:
    task = _new_task(context)
    return TaskStatusUpdateEvent(
        task_id=task.id, context_id=task.context_id, status=_canceled_status(task, text), final=True
    )


def _not_cancelable(task: Task) -> TaskNotCancelableError:
    # a2a-sdk's words (the state as its enum formats: "TaskState.canceled")
    return TaskNotCancelableError(
        message=f"Task cannot be canceled - current state: {task.status.state}"
    )
