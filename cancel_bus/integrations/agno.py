"""agno: agno's own cancel API, cluster-wide. ``Agent.cancel_run`` / ``acancel_run``,
``Team.cancel_run`` and AgentOS's cancel routes, called on any node, stop the run wherever it runs.

    bus = CancelBus(redis_url, namespace="agents")
    await bus.start()
    agno.install(bus)  # on the bus's event loop, before AgentOS wires a job queue
    ...
    await Agent.acancel_run(run_id)  # on any replica

agno sends every cancel and checkpoint through one process-wide manager
(``agno.run.cancel.set_cancellation_manager``); ``install`` puts a
:class:`BusRunCancellationManager` there. Each agno run is a bus run of the same id, owned by the
node that runs it; a team's member runs are its children. ``is_cancelled`` and
``raise_if_cancelled`` read this node's memory (no Redis command per checkpoint). ``install``
also wraps the four methods of agno's ``Model`` that make one model request (every provider
inherits them), to check at the start of each request: the turn boundary ``after_turn`` needs,
and where the streamed text is emitted to the bus run.

Modes: ``checkpoint`` (what ``cancel_run`` sends) stops the run at agno's next check (after each
streamed event, between phases, and before each model request); ``immediate`` also interrupts
the await in progress of an async run (its task, the one that last checked); ``after_turn`` lets
the model request in progress and the tool calls it asked for complete, and stops the run before
its next model request. agno ends the run as it ends any cancelled run (status ``cancelled``, the
content so far kept and stored).
"""

from __future__ import annotations

import asyncio
import functools
import importlib.metadata
import inspect
import sys
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, TypeVar

import agno.run.cancel as _cancel
from agno.exceptions import RunCancelledException
from agno.models.base import Model
from agno.run.base import RunStatus
from agno.run.cancellation_management.base import BaseRunCancellationManager

from cancel_bus import CancelBus, CancelResult, Outcome, RunCancelled, RunExists

from ._agno_run import AgnoRun
from ._sessions import bus_id, running_loop

__all__ = ["SUPPORTED", "BusRunCancellationManager", "install", "uninstall"]

SUPPORTED = "agno>=3.1,<4"
CANCEL_REASON = "agno cancel_run"
METADATA = {"integration": "agno"}
MAX_CONTINUATIONS = 16  # bus ids tried for a run id agno runs again (continue_run)
T = TypeVar("T")

# agno's functions that must reach the manager through the module global, and the Model
# methods (one model request each) whose ``run_response`` parameter the check reads.
_FUNCTIONS = (
    "register_run",
    "aregister_run",
    "cancel_run",
    "acancel_run",
    "is_cancelled",
    "ais_cancelled",
    "cleanup_run",
    "acleanup_run",
    "raise_if_cancelled",
    "araise_if_cancelled",
    "register_member_run",
    "aregister_member_run",
    "get_member_run_ids",
    "aget_member_run_ids",
)
_REQUESTS = (
    "_process_model_response",
    "_aprocess_model_response",
    "process_response_stream",
    "aprocess_response_stream",
)
_ORIGINALS = {name: getattr(Model, name) for name in _REQUESTS}
_INSTALL_LOCK = threading.Lock()


class BusRunCancellationManager(BaseRunCancellationManager):
    """agno's cancellation manager, cluster-wide through ``bus`` (its loop: ``loop``)."""

    def __init__(self, bus: CancelBus, loop: asyncio.AbstractEventLoop) -> None:
        self._bus = bus
        self._loop = loop
        self._runs: dict[str, AgnoRun] = {}
        self._parents: dict[str, str] = {}  # member run id -> its team's run id

    # -- checks: local, no I/O --------------------------------------------------------------

    def is_cancelled(self, run_id: str) -> bool:
        """Whether a cancel reached this node's run ``run_id`` (``after_turn``: only at a model
        request). Reads local memory, no Redis command."""
        run = self._runs.get(run_id)
        return run is not None and run.stopping()

    async def ais_cancelled(self, run_id: str) -> bool:
        """:meth:`is_cancelled`; the calling task becomes the one an ``immediate`` cancel
        interrupts."""
        run = self._runs.get(run_id)
        if run is None:
            return False
        run.task = asyncio.current_task()
        return run.stopping()

    def raise_if_cancelled(self, run_id: str) -> None:
        """Raise agno's ``RunCancelledException`` if :meth:`is_cancelled`."""
        if self.is_cancelled(run_id):
            raise RunCancelledException(f"Run {run_id} was cancelled")

    async def araise_if_cancelled(self, run_id: str) -> None:
        """Raise agno's ``RunCancelledException`` if :meth:`ais_cancelled`."""
        if await self.ais_cancelled(run_id):
            raise RunCancelledException(f"Run {run_id} was cancelled")

    def turn(self, response: Any) -> None:
        """The check at the start of each model request (of the run ``response`` is the
        output of): a turn boundary."""
        run = self._runs.get(getattr(response, "run_id", None) or "")
        if run is None:
            return
        run.response = response
        if run.stopping(boundary=True):
            raise RunCancelledException(f"Run {run.agno_id} was cancelled")

    def emit(self, response: Any, text: Any) -> None:
        """Keep a model response's text as the bus run's output."""
        run = self._runs.get(getattr(response, "run_id", None) or "")
        if run is None or run.handle is None or not isinstance(text, str) or not text:
            return
        if self._on_loop():
            run.handle.emit(text)
        else:
            self._loop.call_soon_threadsafe(run.handle.emit, text)

    # -- a run's start and end --------------------------------------------------------------

    def register_run(self, run_id: str) -> None:
        """Start the bus run of the agno run, owned by this node (a team member's as a child of its
        team's); from a thread, on the bus's loop."""
        self._blocking(self._register(run_id))

    async def aregister_run(self, run_id: str) -> None:
        """:meth:`register_run` for an async run, in a task of its own on the bus's loop: the bus
        interrupts none of agno's tasks itself (an ``immediate`` cancel goes through the run's
        last check)."""
        await self._on_bus(self._register(run_id), task=True)

    def cleanup_run(self, run_id: str) -> None:
        """End the run's bus run: ``cancelled`` if it saw a cancel, else as its code ended (the
        exception being handled, if any)."""
        self._blocking(self._cleanup(run_id, sys.exc_info()[1]))

    async def acleanup_run(self, run_id: str) -> None:
        """:meth:`cleanup_run` for an async run; one an ``immediate`` cancel interrupted raises the
        bus's ``RunCancelled`` in place of ``CancelledError``."""
        await self._on_bus(self._cleanup(run_id, sys.exc_info()[1]))

    async def _register(self, run_id: str) -> None:
        """Enter the bus run of an agno run (again: nothing; agno registers a background run
        twice). A run cancelled before it started is kept as stopped."""
        if run_id in self._runs:
            return
        parent = self._parents.get(run_id)
        first = bus_id(run_id)
        for n in range(1, MAX_CONTINUATIONS + 1):
            bus_run_id = first if n == 1 else f"{first}.{n}"  # agno ran the id before
            scope = self._bus.run(bus_run_id, metadata=METADATA, parent=parent)
            try:
                handle = await scope.__aenter__()
            except RunCancelled as exc:  # a cancel before its start, its team's, a tombstone
                self._runs[run_id] = AgnoRun(run_id, bus_run_id, None, None, observed=exc)
                return
            except RunExists as exc:
                if exc.status in ("running", "queued", "waiting"):
                    raise
                continue
            run = AgnoRun(run_id, bus_run_id, scope, handle)
            handle.add_cancel_callback(run.interrupt)
            self._runs[run_id] = run
            return
        raise RunExists(first, f"ran {MAX_CONTINUATIONS} times")

    async def _cleanup(self, run_id: str, error: BaseException | None) -> None:
        """End the run's bus scope: cancelled if it saw a cancel, else as its code ended. An
        async run our ``immediate`` cancel interrupted raises ``RunCancelled`` (the bus's) in
        place of agno's ``CancelledError``: its task is not being cancelled."""
        run = self._runs.pop(run_id, None)
        for member in run.members if run is not None else ():
            self._parents.pop(member, None)
        if run is None or run.scope is None:
            return
        run.ending = True
        task, ours = run.interrupted, False
        if isinstance(error, asyncio.CancelledError) and task is asyncio.current_task():
            assert task is not None
            ours = task.uncancel() == 0  # else another cancellation is pending: it goes on
            run.stopping()
        if run.observed is None and getattr(run.response, "status", None) is RunStatus.cancelled:
            run.stopping(boundary=True)  # agno ended it cancelled (a team: its member's cancel)
        exc = run.observed if run.observed is not None else error
        if isinstance(exc, GeneratorExit):  # the caller stopped reading: not the run's failure
            exc = None
        if exc is None:
            await run.scope.__aexit__(None, None, None)
        else:
            await run.scope.__aexit__(type(exc), exc, exc.__traceback__)
        if ours and run.observed is not None:
            raise run.observed from error

    # -- cancels, from any node ---------------------------------------------------------------

    def cancel_run(self, run_id: str) -> bool:
        """Cancel the run and its members wherever they run (not waited for); True only if a run
        that had started took the cancel. An id no node has run yet is recorded cancelled: it never
        starts."""
        return self._blocking(self._cancel(run_id))

    async def acancel_run(self, run_id: str) -> bool:
        """:meth:`cancel_run`, awaited."""
        return await self._on_bus(self._cancel(run_id))

    async def _cancel(self, run_id: str) -> bool:
        """Cancel the run (and its members: the bus's tree) wherever it runs. True only if a
        run that had started took the cancel. A run id no node has run yet is recorded as a
        queued run, cancelled: the run, when it starts (on any node), never does."""
        bus, first = self._bus, bus_id(run_id)
        result = await bus.cancel(first, reason=CANCEL_REASON, wait=False)
        if result.outcome is Outcome.NOT_FOUND:
            with suppress(RunExists):  # it started meanwhile: the second cancel reaches it
                await bus.enqueue(first, metadata=METADATA)
            result = await bus.cancel(first, reason=CANCEL_REASON, wait=False)
        for n in range(2, MAX_CONTINUATIONS + 1):  # a run id agno ran again
            if result.outcome is not Outcome.ALREADY_FINISHED:
                break
            later = await bus.cancel(f"{first}.{n}", reason=CANCEL_REASON, wait=False)
            if later.outcome is Outcome.NOT_FOUND:
                break
            result = later
        return _taken(result)

    # -- team members -------------------------------------------------------------------------

    def register_member_run(self, team_run_id: str, member_run_id: str) -> None:
        """Note a team's member run: it registers as a child of the team's bus run, so a cancel of
        the team reaches it from any node. Local memory only."""
        team = self._runs.get(team_run_id)
        self._parents[member_run_id] = team.bus_run_id if team is not None else bus_id(team_run_id)
        if team is not None:
            team.members.add(member_run_id)

    async def aregister_member_run(self, team_run_id: str, member_run_id: str) -> None:
        """:meth:`register_member_run`, awaited."""
        self.register_member_run(team_run_id, member_run_id)

    def get_member_run_ids(self, team_run_id: str) -> set[str]:
        """The member runs of a team run of this node (a cancel from another node reaches the
        members through the bus's tree)."""
        team = self._runs.get(team_run_id)
        return set(team.members) if team is not None else set()

    async def aget_member_run_ids(self, team_run_id: str) -> set[str]:
        """:meth:`get_member_run_ids`, awaited."""
        return self.get_member_run_ids(team_run_id)

    def cleanup_member_runs(self, team_run_id: str) -> None:
        """Forget the team's member runs (their bus runs end with their own cleanup). Local memory
        only."""
        team = self._runs.get(team_run_id)
        for member in team.members if team is not None else ():
            self._parents.pop(member, None)

    async def acleanup_member_runs(self, team_run_id: str) -> None:
        """:meth:`cleanup_member_runs`, awaited."""
        self.cleanup_member_runs(team_run_id)

    # -- this node's runs ---------------------------------------------------------------------

    def get_active_runs(self) -> dict[str, bool]:
        """This node's runs and whether a cancel reached them (``bus.list_runs`` for all)."""
        return {
            run_id: run.handle is None or run.handle.cancel_requested is not None
            for run_id, run in list(self._runs.items())
        }

    async def aget_active_runs(self) -> dict[str, bool]:
        """:meth:`get_active_runs`, awaited."""
        return self.get_active_runs()

    # -- the bus's loop -----------------------------------------------------------------------

    def _on_loop(self) -> bool:
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    async def _on_bus(self, job: Coroutine[Any, Any, T], task: bool = False) -> T:
        """Run ``job`` on the bus's loop: in a task of its own there if ``task`` (so that it
        is no task of agno's the bus would interrupt), else in the caller's."""
        if not self._on_loop():
            return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(job, self._loop))
        return await (asyncio.ensure_future(job) if task else job)

    def _blocking(self, job: Coroutine[Any, Any, T]) -> T:
        """Run ``job`` on the bus's loop for agno's synchronous API (a run in a thread)."""
        if self._on_loop():
            job.close()
            raise RuntimeError(
                "agno's synchronous run or cancel API was called on the event loop of the bus: "
                "it would block the loop; use arun/acancel_run, or call it from a thread"
            )
        return asyncio.run_coroutine_threadsafe(job, self._loop).result()


def _taken(result: CancelResult) -> bool:
    """Whether a run that had started took the cancel."""
    started = result.run is not None and result.run.started_at is not None
    return started and result.outcome in (Outcome.CANCELLED, Outcome.STOPPING)


# -- the model requests: a turn boundary each, and the text the bus run keeps -------------------


def _manager() -> BusRunCancellationManager | None:
    manager = _cancel.get_cancellation_manager()
    return manager if isinstance(manager, BusRunCancellationManager) else None


def _request(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def request(self: Model, *args: Any, **kwargs: Any) -> Any:
        manager, response = _manager(), kwargs.get("run_response")
        if manager is not None:
            manager.turn(response)
        result = original(self, *args, **kwargs)
        if manager is not None:
            manager.emit(response, getattr(kwargs.get("assistant_message"), "content", None))
        return result

    return request


def _arequest(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def request(self: Model, *args: Any, **kwargs: Any) -> Any:
        manager, response = _manager(), kwargs.get("run_response")
        if manager is not None:
            manager.turn(response)
        result = await original(self, *args, **kwargs)
        if manager is not None:
            manager.emit(response, getattr(kwargs.get("assistant_message"), "content", None))
        return result

    return request


def _stream(original: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
    @functools.wraps(original)
    def request(self: Model, *args: Any, **kwargs: Any) -> Iterator[Any]:
        manager, response = _manager(), kwargs.get("run_response")
        if manager is not None:
            manager.turn(response)
        for delta in original(self, *args, **kwargs):
            if manager is not None:
                manager.emit(response, getattr(delta, "content", None))
            yield delta

    return request


def _astream(original: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
    @functools.wraps(original)
    async def request(self: Model, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        manager, response = _manager(), kwargs.get("run_response")
        if manager is not None:
            manager.turn(response)
        async for delta in original(self, *args, **kwargs):
            if manager is not None:
                manager.emit(response, getattr(delta, "content", None))
            yield delta

    return request


_WRAPPERS: dict[str, Callable[[Any], Callable[..., Any]]] = {
    "_process_model_response": _request,
    "_aprocess_model_response": _arequest,
    "process_response_stream": _stream,
    "aprocess_response_stream": _astream,
}


@dataclass
class _Installed:
    manager: BusRunCancellationManager
    previous: BaseRunCancellationManager
    previous_explicit: bool


_INSTALLED: list[_Installed] = []  # at most one: agno's manager is process-wide


def install(bus: CancelBus) -> BusRunCancellationManager:
    """Make agno's cancel API cluster-wide through ``bus`` (started; call it on its loop, once
    per process, before AgentOS wires a job queue: that wiring keeps a manager set explicitly).
    Raises ``RuntimeError`` if this agno version moved what this module relies on."""
    loop = running_loop("install")
    with _INSTALL_LOCK:
        if _INSTALLED:
            raise RuntimeError("a bus is already installed for agno; uninstall() it first")
        _check()
        manager = BusRunCancellationManager(bus, loop)
        previous = _cancel.get_cancellation_manager()
        explicit = _cancel.cancellation_manager_explicitly_set()
        _INSTALLED.append(_Installed(manager, previous, explicit))
        _cancel.set_cancellation_manager(manager)
        for name, wrap in _WRAPPERS.items():
            setattr(Model, name, wrap(_ORIGINALS[name]))
    return manager


def uninstall() -> None:
    """Undo :func:`install`: agno's previous manager is back. Raises ``RuntimeError`` while
    runs of this node are still active."""
    with _INSTALL_LOCK:
        if not _INSTALLED:
            return
        installed = _INSTALLED[0]
        if installed.manager._runs:
            raise RuntimeError(
                f"{len(installed.manager._runs)} agno runs are still active; "
                "uninstall after they end"
            )
        module: Any = _cancel
        module._cancellation_manager = installed.previous
        module._cancellation_manager_explicitly_set = installed.previous_explicit
        for name, original in _ORIGINALS.items():
            setattr(Model, name, original)
        _INSTALLED.clear()


def _check() -> None:
    """That agno still has the shape this module relies on."""
    module: Any = _cancel
    problems: list[str] = []
    for name in _FUNCTIONS:
        function = getattr(module, name, None)
        code = getattr(function, "__code__", None)
        if code is None or "_cancellation_manager" not in code.co_names:
            problems.append(f"agno.run.cancel.{name}() does not use _cancellation_manager")
    for name, original in _ORIGINALS.items():
        if "run_response" not in inspect.signature(original).parameters:
            problems.append(f"Model.{name} takes no run_response")
    if problems:
        version = importlib.metadata.version("agno")
        raise RuntimeError(
            f"cancel_bus.integrations.agno supports {SUPPORTED}; agno {version} changed: "
            + "; ".join(problems)
        )
