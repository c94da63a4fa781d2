"""trpc-agent: ``Runner.cancel_run_async`` and the rest of trpc-agent's cancel API, from any node.

    bus = CancelBus(redis_url, namespace="agents")
    await bus.start()
    trpc_agent.install(bus)  # on the event loop that runs the Runners
    ...
    await runner.cancel_run_async(user_id, session_id)  # on any replica

Every cancel path of trpc-agent (``Runner.cancel_run_async``, ``cancel.cancel_run`` used by AG-UI,
``ctx.raise_if_cancelled()``, the A2A executors) goes through one process-wide manager,
``trpc_agent_sdk.cancel._cancel._manager``; ``install`` puts a :class:`BusCancellationManager`
there, and wraps ``Runner.run_async``. Each run is a bus run of its session key, so the key has one
active run in the cluster and a ``cancel_run`` on any node reaches it; ``is_cancelled`` and
``get_cancel_event`` stay local.

Modes: ``checkpoint`` stops at the next ``ctx.raise_if_cancelled()``; ``after_turn`` at the first
checkpoint after a turn (a model response and the tool calls it asked for) completed;
``immediate`` interrupts the await in progress. Each ends the run as trpc-agent ends a cancelled
one: ``AgentCancelledEvent``, the partial text saved in the session with its cancel marker. A
cancel that lands between ``run_async`` and the run's registration is held for it (see
``_held.py``).

Fixed on the way (trpc-agent's own manager has these single-node defects): every ``cancel_run``
caller gets an Event that is set, not only the last one; a finished run's ``cleanup_run`` never
removes a newer run of the same key; a run that never reaches a checkpoint is shown ``stopping``
by ``bus.get_run``/``list_runs`` and recorded ``cancelled`` with ``end_reason`` ``completed``.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from collections.abc import AsyncGenerator, Coroutine, Iterator, Mapping
from contextlib import aclosing, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypeVar

from trpc_agent_sdk.cancel import SessionKey, _cancel  # type: ignore[import-untyped]
from trpc_agent_sdk.events import AgentCancelledEvent  # type: ignore[import-untyped]
from trpc_agent_sdk.runners import Runner  # type: ignore[import-untyped]

from cancel_bus import (
    BusClosed,
    BusUnavailable,
    CancelBus,
    CancelMode,
    CancelRequest,
    MultitaskStrategy,
    Outcome,
)

from . import _trpc_agui as agui
from ._held import HeldCancels
from ._sessions import Multitask, bus_session, enter_session_run, running_loop
from ._trpc_run import LocalRun
from ._trpc_shape import ORIGINAL_RUN_ASYNC, SUPPORTED, checked_cancel_module

__all__ = [
    "SUPPORTED",
    "BusCancellationManager",
    "RunGroup",
    "bus_session",
    "install",
    "uninstall",
]

log = logging.getLogger("cancel_bus.integrations.trpc_agent")

CANCEL_REASON = "trpc-agent cancel_run"
WAIT_SLICE_SECONDS = 60.0  # one bus.wait of a remote run's end; repeated until it ends
RETRY_SECONDS = 1.0

T = TypeVar("T")
_INSTALL_LOCK = threading.Lock()


@dataclass(eq=False)
class _Start:
    """One ``Runner.run_async`` call until its run registers: the session's held cancel as Redis
    had it when the run was asked for (``seen``: see ``_held.py``) and the group it was started
    in."""

    key: Any  # SessionKey
    seen: asyncio.Future[str | None]
    group: RunGroup | None
    run: LocalRun | None = None


class RunGroup:
    """The trpc-agent runs started while :meth:`collecting` (an A2A task's execution): a cancel
    of the group reaches each of them with its mode, including runs that register later."""

    def __init__(self) -> None:
        self.request: CancelRequest | None = None
        self.runs: list[LocalRun] = []
        self._nodes: list[_Node] = []

    @contextmanager
    def collecting(self) -> Iterator[None]:
        """Runs started (``run_async`` called) in this block join the group."""
        token = _GROUP.set(self)
        try:
            yield
        finally:
            _GROUP.reset(token)

    def cancel(self, request: CancelRequest) -> None:
        """Cancel the group's runs, now and as they register (a stronger mode escalates). Safe
        to call from a bus callback: the cancels are sent in the background."""
        if self.request is not None and request.mode.strength <= self.request.mode.strength:
            return
        self.request = request
        for node, run in zip(self._nodes, self.runs, strict=True):
            node.spawn(node.forward(run, request))

    async def _attach(self, node: _Node, run: LocalRun) -> None:
        self._nodes.append(node)
        self.runs.append(run)
        if self.request is not None:
            await node.forward(run, self.request)


class StreamRuns(RunGroup):
    """The runs one AG-UI stream started (see ``_trpc_agui.py``): the ``cancel_run`` AG-UI sends
    when the stream ends stops these, not the thread's run, which may be another message's."""


def _open_stream() -> None:
    _GROUP.set(StreamRuns())  # not reset: the stream's finally reads it


# The runs registered in this context, by key: ``cleanup_run`` ends the caller's own run.
_CONTEXT_RUNS: ContextVar[Mapping[Any, LocalRun]] = ContextVar(
    "cancel_bus_trpc_runs", default=MappingProxyType({})
)
_GROUP: ContextVar[RunGroup | None] = ContextVar("cancel_bus_trpc_group", default=None)


class _Node:
    """The runs of one bus (one event loop): session key -> its current local run."""

    def __init__(
        self, bus: CancelBus, busy_timeout: float, start_grace: float, multitask: Multitask
    ) -> None:
        self.bus = bus
        self.busy_timeout = busy_timeout
        self.multitask = multitask
        self.start_grace = start_grace
        self.held = HeldCancels(bus)
        self.runs: dict[Any, LocalRun] = {}
        self.starting: dict[Any, list[_Start]] = {}
        self.remote: dict[str, list[asyncio.Event]] = {}
        self.tasks: set[asyncio.Task[Any]] = set()

    def take_start(self, key: Any) -> _Start:
        """The oldest ``run_async`` call of ``key`` that has not registered (or, for a direct
        ``register_run``, a start asked for now)."""
        waiting = self.starting.get(key)
        if waiting:
            return waiting.pop(0)
        return self.asked(key)

    def asked(self, key: Any) -> _Start:
        """A start asked for now: the session's hold is read at once (Redis orders that read
        after the ask; a hold it sees came first and is not this run's to claim)."""
        session = bus_session(key.app_name, key.user_id, key.session_id)
        return _Start(key, asyncio.ensure_future(self.held.seen(session)), _GROUP.get())

    async def start(self, start: _Start) -> LocalRun:
        """Register a bus run for the start's key and apply the cancels meant for it: one held
        since it was asked for (any node), its group's."""
        run = await self._register(start.key)
        start.run = run
        try:
            session = bus_session(start.key.app_name, start.key.user_id, start.key.session_id)
            seen = await start.seen  # None: Redis could not say; nothing is claimed
            held = None if seen is None else await self.held.claim(session, run.handle.run_id, seen)
            if held is not None:
                await self.forward(run, held)
            if start.group is not None:
                await start.group._attach(self, run)
        except BaseException:
            await self.finish(run)  # trpc-agent calls no cleanup_run for a failed registration
            raise
        return run

    async def forward(self, run: LocalRun, request: CancelRequest) -> None:
        """Cancel ``run`` as ``request`` asks (recorded on the bus; delivered here)."""
        if not run.finished:
            await self.bus.cancel(
                run.handle.run_id,
                mode=request.mode,
                reason=request.reason,
                requested_by=request.requested_by,
                wait=False,
            )

    async def _register(self, key: Any) -> LocalRun:
        """Register a bus run for ``key``; a run of the key that is stopping is waited for."""
        scope, handle = await enter_session_run(
            self.bus,
            bus_session(key.app_name, key.user_id, key.session_id),
            busy_timeout=self.busy_timeout,
            metadata={"integration": "trpc-agent"},
            multitask=self.multitask,
        )
        run = LocalRun(key, scope, handle)
        self.runs[key] = run
        return run

    async def cancel(self, key: Any) -> asyncio.Event | None:
        result = await self.held.cancel_session(
            bus_session(key.app_name, key.user_id, key.session_id),
            reason=CANCEL_REASON,
            grace=self.start_grace,
        )
        if result.outcome is Outcome.NOT_FOUND:
            return None
        done = asyncio.Event()
        if result.outcome is not Outcome.STOPPING or result.run is None:
            done.set()  # it was not executing (queued, waiting) or its owner died: it is over
            return done
        local = self.runs.get(key)
        if local is not None and local.handle.run_id == result.run.run_id:
            local.cancel_event.set()
            local.cleanup_events.append(done)
        elif result.run.run_id in self.remote:
            self.remote[result.run.run_id].append(done)
        else:
            self.remote[result.run.run_id] = [done]
            self.spawn(self._await_remote_end(result.run.run_id))
        return done

    async def cancel_group(self, group: RunGroup) -> asyncio.Event | None:
        """Cancel the group's runs (one that registers later at its start) -> an Event set once
        those registered ran their cleanup; None if none is active."""
        group.cancel(CancelRequest(CancelMode.CHECKPOINT, CANCEL_REASON, None, time.time()))
        ends = []
        for run in group.runs:
            if not run.finished:
                ends.append(asyncio.Event())
                run.cleanup_events.append(ends[-1])
        if not ends:
            return None
        done = asyncio.Event()

        async def all_ended() -> None:
            for end in ends:
                await end.wait()
            done.set()

        self.spawn(all_ended())
        return done

    async def finish(self, run: LocalRun) -> None:
        """End the run's bus scope: cancelled if it saw the cancel, else as its code ended."""
        run.finished = True
        if self.runs.get(run.key) is run:
            del self.runs[run.key]
        exc = run.observed or sys.exc_info()[1]
        try:
            if exc is None:
                await run.scope.__aexit__(None, None, None)
            else:
                ours = await run.scope.__aexit__(type(exc), exc, exc.__traceback__)
                run.interrupted = isinstance(exc, asyncio.CancelledError) and bool(ours)
        finally:
            for event in run.cleanup_events:
                event.set()

    def close(self) -> None:
        if self.runs:
            raise RuntimeError(
                f"{len(self.runs)} trpc-agent runs are still active on this loop; "
                "uninstall after they end"
            )
        for task in self.tasks:
            task.cancel()

    async def _await_remote_end(self, run_id: str) -> None:
        """Set the Events of a run owned elsewhere once it has ended (its owner's cleanup ran)."""
        while True:
            try:
                run = await self.bus.wait(run_id, timeout=WAIT_SLICE_SECONDS)
            except BusUnavailable as exc:
                log.warning("cancel-bus: waiting for the end of %s: %s", run_id, exc)
                await asyncio.sleep(RETRY_SECONDS)
                continue
            except BusClosed:
                return
            if run is None or not run.is_active:
                break
        for event in self.remote.pop(run_id, ()):
            event.set()

    def spawn(self, job: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Run ``job`` in the background, referenced until it ends; close() cancels it."""
        task = asyncio.create_task(job)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task


class BusCancellationManager:
    """Drop-in for trpc-agent's ``_RunCancellationManager``, cluster-wide through the bus bound
    to the calling event loop. A loop without a bus keeps trpc-agent's own (single-node) manager.
    """

    def __init__(self, fallback: Any) -> None:
        self.fallback = fallback
        self._nodes: dict[asyncio.AbstractEventLoop, _Node] = {}

    async def register_run(self, app_name: str, user_id: str, session_id: str) -> Any:
        """Register a run of the key as a bus run owned here; returns its ``SessionKey``.

        Raises ``SessionBusy`` if the key has an active run anywhere that is not stopping (or
        that does not stop within the install's ``busy_timeout``)."""
        node = self._node()
        if node is None:
            return await self.fallback.register_run(app_name, user_id, session_id)
        key = SessionKey(app_name, user_id, session_id)
        run = await node.start(node.take_start(key))
        _CONTEXT_RUNS.set(MappingProxyType({**_CONTEXT_RUNS.get(), key: run}))
        return key

    async def cancel_run(
        self, app_name: str, user_id: str, session_id: str
    ) -> asyncio.Event | None:
        """Ask the key's run to stop, on whichever node runs it. None if no node runs the key,
        else an Event (of the caller's loop) set once the run's cleanup ran on its owner.

        The cancel is carried out even if the caller is being cancelled: trpc-agent's AG-UI
        service calls this in the ``finally`` of a stream its client closed, under an anyio
        cancel scope that fails every await there."""
        node = self._node()
        if node is None:
            result: asyncio.Event | None = await self.fallback.cancel_run(
                app_name, user_id, session_id
            )
            return result
        group = _GROUP.get()
        if isinstance(group, StreamRuns):  # AG-UI's end of a stream: its own runs only
            return await asyncio.shield(node.spawn(node.cancel_group(group)))
        return await asyncio.shield(
            node.spawn(node.cancel(SessionKey(app_name, user_id, session_id)))
        )

    async def is_cancelled(self, session_key: Any) -> bool:
        """True once a cancel was delivered to this node's run of the key (no I/O)."""
        node = self._node()
        if node is None:
            cancelled: bool = await self.fallback.is_cancelled(session_key)
            return cancelled
        run = node.runs.get(session_key)
        return run is not None and run.poll()

    async def cleanup_run(self, app_name: str, user_id: str, session_id: str) -> None:
        """End the caller's run of the key (recorded on the bus) and set its ``cancel_run``
        Events. A cleanup from a run that already ended, or of an unknown key, does nothing."""
        node = self._node()
        if node is None:
            await self.fallback.cleanup_run(app_name, user_id, session_id)
            return
        key = SessionKey(app_name, user_id, session_id)
        run = _CONTEXT_RUNS.get().get(key) or node.runs.get(key)
        if run is not None and not run.finished:
            await node.finish(run)

    def get_active_sessions(self) -> dict[tuple[str, str, str], bool]:
        """This node's runs and whether a cancel reached them (``bus.list_runs`` for all)."""
        node = self._node()
        if node is None:
            sessions: dict[tuple[str, str, str], bool] = self.fallback.get_active_sessions()
            return sessions
        return {
            (k.app_name, k.user_id, k.session_id): run.handle.cancel_requested is not None
            for k, run in node.runs.items()
        }

    async def get_cancel_event(self, session_key: Any) -> asyncio.Event | None:
        """The Event set when a cancel reaches this node's run of the key; None if not here."""
        node = self._node()
        if node is None:
            event: asyncio.Event | None = await self.fallback.get_cancel_event(session_key)
            return event
        run = node.runs.get(session_key)
        return run.event() if run is not None else None

    def _node(self) -> _Node | None:
        try:
            return self._nodes.get(asyncio.get_running_loop())
        except RuntimeError:
            return None


def install(
    bus: CancelBus,
    *,
    busy_timeout: float = 10.0,
    start_grace: float = 1.0,
    multitask_strategy: MultitaskStrategy | str = MultitaskStrategy.REJECT,
    interrupt_mode: CancelMode | str = CancelMode.CHECKPOINT,
) -> None:
    """Make trpc-agent's cancel API cluster-wide through ``bus`` on the running event loop.

    Call it on the loop that runs the Runners, once the bus is started. ``multitask_strategy``:
    what a new run of a session key does to the key's active run on any node (double texting:
    ``reject`` — the default: ``SessionBusy`` —, ``enqueue``, ``interrupt``, ``rollback``; also
    AG-UI's new run on a thread; ``interrupt_mode``: the mode an interrupt or a rollback
    cancels the active run in, ``immediate`` to cut off its model's stream at once).
    ``busy_timeout``: how long a new run of a session key waits
    for the key's stopping run to end before ``SessionBusy`` (and an interrupt's timeout).
    ``start_grace``: how long a ``cancel_run`` that finds no run of the key waits for one asked
    for before it to register (and then cancels it). Raises ``RuntimeError`` if this trpc-agent
    version moved the internals this relies on."""
    loop = running_loop("install")
    multitask = Multitask.checked(multitask_strategy, interrupt_mode)
    with _INSTALL_LOCK:
        module = checked_cancel_module()
        agui.wrap(_open_stream)  # first: it may refuse this trpc-agent version
        manager = module._manager
        if not isinstance(manager, BusCancellationManager):
            manager = BusCancellationManager(fallback=manager)
        if loop in manager._nodes:
            raise RuntimeError("a bus is already installed for trpc-agent on this event loop")
        manager._nodes[loop] = _Node(bus, busy_timeout, start_grace, multitask)
        module._manager = manager
        Runner.run_async = _run_async


def uninstall() -> None:
    """Undo :func:`install` on the running loop; trpc-agent's own manager is back once no loop
    has a bus. Raises ``RuntimeError`` while runs of this loop are still active."""
    loop = running_loop("uninstall")
    with _INSTALL_LOCK:
        module: Any = _cancel
        manager = module._manager
        if not isinstance(manager, BusCancellationManager) or loop not in manager._nodes:
            return
        manager._nodes[loop].close()
        del manager._nodes[loop]
        if not manager._nodes:
            module._manager = manager.fallback
            Runner.run_async = ORIGINAL_RUN_ASYNC
            agui.unwrap()


def _run_async(self: Any, **kwargs: Any) -> AsyncGenerator[Any, None]:
    """``Runner.run_async`` while installed: notes when the run was asked for, follows its
    events, ends a cancelled run's cleanup when it yields ``AgentCancelledEvent``, and ends a run
    interrupted by an ``immediate`` cancel as a cancelled one."""
    events = ORIGINAL_RUN_ASYNC(self, **kwargs)
    manager = _cancel._manager
    node = manager._node() if isinstance(manager, BusCancellationManager) else None
    if node is None:
        return events  # type: ignore[no-any-return]
    key = SessionKey(self.app_name, kwargs["user_id"], kwargs["session_id"])
    return _followed(node, self, node.asked(key), events)


async def _followed(
    node: _Node, runner: Any, start: _Start, events: AsyncGenerator[Any, None]
) -> AsyncGenerator[Any, None]:
    waiting = node.starting.setdefault(start.key, [])
    waiting.append(start)
    try:
        async with aclosing(events):
            async for event in events:
                if start.run is not None:
                    start.run.track(event)
                if isinstance(event, AgentCancelledEvent):
                    if start.run is not None:
                        start.run.ended_cancelled()
                    # only its cleanup follows: run it now, not when the consumer's reference is
                    # collected (trpc-agent's A2A executors return without closing the stream)
                    await events.aclose()
                yield event
    except asyncio.CancelledError:
        if start.run is None or not start.run.interrupted:
            raise
        yield await start.run.end_interrupted(runner)
    finally:
        if start in waiting:  # it ended before registering
            waiting.remove(start)
        if not waiting and node.starting.get(start.key) is waiting:
            del node.starting[start.key]
