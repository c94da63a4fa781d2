"""A2A (a2a-sdk 0.3, trpc-agent's A2A service): ``tasks/cancel`` and ``tasks/resubscribe`` on
any replica of a task.

    trpc_agent.install(bus)  # every replica, on the loop of the A2A server
    handler = BusRequestHandler(
        bus, agent_executor=TrpcA2aAgentService(...), task_store=BusTaskStore(bus)
    )
    app = A2AStarletteApplication(agent_card=card, http_handler=handler).build()

Each execution of a task is a bus run (see ``_a2a_runs.py``). ``tasks/cancel`` on any replica
cancels it and answers as the A2A spec asks: the task ``canceled`` once it stopped (the owner's
executor stored it before the run ended), ``working`` with a status message if it did not stop
within ``cancel_timeout`` (it still ends ``canceled``: a final ``completed`` after a cancel is
stored ``canceled``), ``TaskNotFoundError`` for an unknown task, ``TaskNotCancelableError`` for a
task that ended otherwise, and the stored task again for one already canceled. A task whose
replica died is ended ``canceled`` by the replica that took the cancel. :class:`BusTaskStore`
keeps tasks in the bus's Redis; a task that reached a terminal state keeps it.

A call to another A2A agent made inside a run, with :func:`send_message`, is a child of that run:
cancelling the run (or its tree) sends ``tasks/cancel`` for the remote task (``_a2a_calls.py``).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

from a2a.client import Client, ClientEvent
from a2a.client.errors import A2AClientJSONRPCError
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.context import ServerCallContext
from a2a.server.events import Event, EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.tasks import TaskStore
from a2a.types import (
    InvalidParamsError,
    Message,
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

__all__ = ["BusRequestHandler", "BusTaskStore", "send_message"]

TERMINAL = frozenset(
    {TaskState.completed, TaskState.canceled, TaskState.failed, TaskState.rejected}
)
# where a task's execution ends (a task waiting for input goes on with the next message)
ENDS = TERMINAL | {TaskState.input_required, TaskState.auth_required}
_TERMINAL_VALUES = sorted(state.value for state in TERMINAL)
_EVENT: TypeAdapter[Event] = TypeAdapter(Event)

# KEYS[1] the task; ARGV[1] its state, ARGV[2] its JSON, ARGV[3] the ttl (ms), ARGV[4..] the
# terminal states. Stores the task unless the stored one is terminal in another state (a
# terminal state is final; a late save from a lagging writer must not undo it). Returns 1 if
# stored, 0 if not.
_SAVE = """
local task_key = KEYS[1]
local state, task, ttl_ms = ARGV[1], ARGV[2], ARGV[3]
local stored = redis.call('HGET', task_key, 'state')
if stored and stored ~= state then
  for i = 4, #ARGV do
    if ARGV[i] == stored then return 0 end
  end
end
redis.call('HSET', task_key, 'state', state, 'task', task)
redis.call('PEXPIRE', task_key, ttl_ms)
return 1
"""


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


class BusTaskStore(TaskStore):
    """A2A tasks in the bus's Redis (under its namespace), kept ``ttl`` seconds. A task that
    reached a terminal state keeps it: a save that would move it elsewhere is ignored."""

    def __init__(self, bus: CancelBus, *, ttl: float = 86400.0) -> None:
        self._redis, prefix = bus._adapter_store()
        self._prefix = f"{prefix}a2a:task:"
        self._ttl_ms = int(ttl * 1000)
        self._save = self._redis.register_script(_SAVE)

    async def save(self, task: Task, context: ServerCallContext | None = None) -> None:
        """Store the task for ``ttl`` seconds (one script call), unless the stored one is terminal
        in another state: a late save never undoes a terminal state."""
        args = [task.status.state.value, task.model_dump_json(), self._ttl_ms]
        await self._save(keys=[self._prefix + task.id], args=[*args, *_TERMINAL_VALUES])

    async def get(self, task_id: str, context: ServerCallContext | None = None) -> Task | None:
        """The stored task; None if it was never stored, or expired."""
        raw = cast(str | None, await self._redis.hget(self._prefix + task_id, "task"))
        return Task.model_validate_json(raw) if raw is not None else None

    async def delete(self, task_id: str, context: ServerCallContext | None = None) -> None:
        """Remove the stored task."""
        await self._redis.delete(self._prefix + task_id)


class BusRequestHandler(DefaultRequestHandler):
    """a2a-sdk's request handler with each task execution a bus run: ``tasks/cancel`` and
    ``tasks/resubscribe`` work on every replica.

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
        executor = _TaskExecutor(agent_executor, self._runs, task_store)
        super().__init__(agent_executor=executor, task_store=task_store, **options)

    async def on_cancel_task(
        self, params: TaskIdParams, context: ServerCallContext | None = None
    ) -> Task | None:
        """``tasks/cancel`` on any replica: cancels the bus run of the task's execution wherever it
        runs, and answers the task ``canceled`` once it stopped, or ``working`` with a status
        message if it did not stop within ``cancel_timeout``. A task with no execution, or whose
        replica was lost, is stored ``canceled`` here; one that ended otherwise raises
        ``TaskNotCancelableError``."""
        task = await self._stored(params.id, context)
        if task.status.state is TaskState.canceled:
            return task
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
        """The SDK's own stream on the replica executing the task; elsewhere its relay."""
        if params.id in self._runs.local:
            async for event in super().on_resubscribe_to_task(params, context):
                yield event
            return
        task = await self._stored(params.id, context)
        if task.status.state in TERMINAL:
            raise ServerError(
                InvalidParamsError(message=f"Task {task.id} is in terminal state: {task.status}")
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
    """Runs the wrapped executor as the task's bus run; stores the task's end before the run
    ends, so a canceller that saw the run end reads it."""

    def __init__(self, executor: AgentExecutor, runs: TaskRuns, store: TaskStore) -> None:
        self._executor = executor
        self._runs = runs
        self._store = store

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task_id = cast(str, context.task_id)
        async with self._runs.executing(task_id) as execution:
            stored = await self._store.get(task_id)
            if stored is not None and stored.status.state in TERMINAL:
                await event_queue.enqueue_event(stored)  # canceled before this execution began
                return
            run = execution.run
            events = _TaskEvents(event_queue, run, relay=self._runs.relay)
            try:
                await self._executor.execute(context, events)
            finally:
                if run.cancel_requested is not None and events.final is None:
                    await events.enqueue_event(_canceled_event(context, "Task was canceled."))
                if isinstance(events.final, TaskStatusUpdateEvent):
                    await _store_end(self._store, stored or _new_task(context), events.final.status)
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
    return TaskNotCancelableError(
        message=f"Task cannot be canceled - current state: {task.status.state.value}"
    )
