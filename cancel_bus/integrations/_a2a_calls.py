"""The bus side of an A2A call made inside a run, for both a2a-sdk lines (no a2a-sdk import).

``send_message`` (``a2a.py``, ``a2a_v1.py``) registers a bus run for the call before the message
is sent: a child of the run whose code makes the call (or of ``parent=``), so that cancelling
that run's tree, from any node, cancels the call. The call's run learns the remote task's id from
the task's events and, when a cancel reaches it, sends the remote agent ``tasks/cancel`` /
``CancelTask`` (``after_turn`` sends none: the call is part of the turn that completes). It ends
when the remote task has: its final event or the cancel's answer says so. A tree cancel therefore
answers ``cancelled`` for the call only once the remote agent said ``canceled``, ``stopping`` until
then. Leaving the block while the remote task goes on cancels it the same way; nobody follows the
task after that, so the call then ends at the cancel's answer (an error if the task goes on).
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass
from typing import Generic, TypeVar

from cancel_bus import CancelBus, CancelMode, CancelRequest, RunHandle
from cancel_bus._errors import RemoteTaskRunning

log = logging.getLogger("cancel_bus.integrations.a2a")

E = TypeVar("E")
PHASE = "remote_task:"  # the call's phase once the remote task is known: its id follows
METADATA = {"integration": "a2a-client"}
_HOLDERS: set[asyncio.Task[None]] = set()  # call runs whose block was left while they end


class TaskEnd(enum.Enum):
    """How a remote task's execution ended."""

    CANCELED = "canceled"
    OTHER = "other"  # completed, failed, rejected, or waiting for input


@dataclass(frozen=True)
class Remote(Generic[E]):
    """What the calls need from an a2a-sdk line: an event's task id and how it says the task
    ended (None: not ended); and sending ``CancelTask``, answering how the task ended (None: it
    has not, e.g. the remote agent answered ``working`` with its cancel pending)."""

    task_of: Callable[[E], tuple[str | None, TaskEnd | None]]
    cancel: Callable[[str], Awaitable[TaskEnd | None]]


@asynccontextmanager
async def remote_call(
    bus: CancelBus, events: AsyncGenerator[E, None], remote: Remote[E], parent: str | None
) -> AsyncIterator[AsyncIterator[E]]:
    """``events`` (a not yet started ``client.send_message(...)``) as a bus run of its own.

    Raises what ``bus.run`` raises (``RunCancelled`` if the parent's cancel was already accepted)
    before anything is sent."""
    call = _Call(remote)
    holder = asyncio.create_task(call.hold(bus, parent))  # copies the caller's context: parent
    try:
        await asyncio.shield(call.entered)
    except BaseException:
        holder.cancel()
        raise
    stream = call.follow(events)
    try:
        yield stream
    finally:
        call.leave()
        _HOLDERS.add(holder)
        holder.add_done_callback(_HOLDERS.discard)
        try:
            await stream.aclose()
        finally:
            await asyncio.shield(holder)  # its run ends once the remote task is dealt with


class _Call(Generic[E]):
    """One call: its run (held by a task of its own, so that an ``immediate`` cancel of it
    interrupts nothing of the caller's) and what is known of its remote task."""

    def __init__(self, remote: Remote[E]) -> None:
        self.remote = remote
        self.entered: asyncio.Future[RunHandle] = asyncio.get_running_loop().create_future()
        self.task_id: str | None = None
        self.end: TaskEnd | None = None
        self.left = False  # the caller's block is over: nobody reads the task's events now
        self.cancelling: asyncio.Task[None] | None = None
        self.cancel_error: str | None = None
        self.changed = asyncio.Event()

    async def follow(self, events: AsyncGenerator[E, None]) -> AsyncGenerator[E, None]:
        async with aclosing(events):
            async for event in events:
                self._saw(event)
                yield event

    def leave(self) -> None:
        self.left = True
        self.changed.set()

    async def hold(self, bus: CancelBus, parent: str | None) -> None:
        try:
            async with bus.run(parent=parent, metadata=METADATA) as run:
                self.entered.set_result(run)
                run.add_cancel_callback(self._requested)
                await self._until_over(run)
                if self.end is None and self.task_id is not None:
                    raise RemoteTaskRunning(self._still_running())
                if self.end is TaskEnd.CANCELED and self.cancelling is not None:
                    run.turn_boundary()  # if it was asked to stop: RunCancelled, recorded cancelled
        except RemoteTaskRunning:
            pass  # recorded as the run's error
        except BaseException as exc:
            if not self.entered.done():
                self.entered.set_exception(exc)
            elif not isinstance(exc, asyncio.CancelledError):
                log.exception("cancel-bus: the bus run of an A2A call failed")

    def _saw(self, event: E) -> None:
        task_id, end = self.remote.task_of(event)
        if task_id and self.task_id is None:
            self.task_id = task_id
            self.entered.result().phase = PHASE + task_id
        self.end = self.end or end
        self.changed.set()

    def _requested(self, request: CancelRequest) -> None:
        if request.mode is not CancelMode.AFTER_TURN:
            self.changed.set()

    async def _until_over(self, run: RunHandle) -> None:
        """Until the remote task ended, or the block was left and what was due is done: the
        cancel it needed (a cancel of this run, or leaving the block first) sent and answered."""
        while True:
            self.changed.clear()
            request = run.cancel_requested
            wanted = self.left or (
                request is not None and request.mode is not CancelMode.AFTER_TURN
            )
            if wanted and self.task_id is not None and self.end is None and self.cancelling is None:
                self.cancelling = asyncio.create_task(self._cancel(self.task_id))
            if self._over():
                return
            try:
                await self.changed.wait()
            except asyncio.CancelledError:
                if run.cancel_requested is None:
                    raise
                # an immediate cancel of this run: carried out by the CancelTask sent above

    def _over(self) -> bool:
        if self.cancelling is not None and not self.cancelling.done():
            return False  # its answer is due
        if self.end is not None:
            return True
        return self.left and (self.cancelling is not None or self.task_id is None)

    async def _cancel(self, task_id: str) -> None:
        try:
            self.end = self.end or await self.remote.cancel(task_id)
        except Exception as exc:
            log.warning("cancel-bus: CancelTask of remote task %s failed: %s", task_id, exc)
            self.cancel_error = f"{type(exc).__name__}: {exc}"
        finally:
            self.changed.set()

    def _still_running(self) -> str:
        answer = self.cancel_error or "the remote agent answered it was still working"
        return f"remote task {self.task_id} was not seen to end after CancelTask ({answer})"
