"""google-adk: every ``Runner.run_async`` invocation is a bus run of its session, and a cancel
from any node sets the invocation's abort signal.

    bus = CancelBus(redis_url, namespace="agents")
    await bus.start()
    google_adk.install(bus)  # on the loop that runs the Runners
    ...
    await google_adk.cancel_session(bus, app_name, user_id, session_id)  # on any replica

ADK has an abort signal (``run_async(abort_signal=...)``) but no cancel API: ``install`` wraps
``Runner.run_async`` (every runner, ``get_fast_api_app``'s included) so that each invocation
registers a bus run of ``(app_name, user_id, session_id)`` before ADK starts, hands ADK an abort
signal of its own, and sets it as the cancel's mode asks. ADK then ends the invocation its own
way: the work in flight is cancelled, its abort events are yielded and stored, and the session
history is as ADK leaves it. :func:`add_cancel_routes` gives ADK's FastAPI app the cancel routes
a caller without the library uses; :func:`cancel_session` is the same cancel for a caller with it.

Modes: ``immediate`` sets the signal at once (ADK interrupts the model stream or tool in flight);
``checkpoint`` sets it at the invocation's next event (each event is a checkpoint: the event in
flight is delivered, then ADK aborts); ``after_turn`` sets it once a turn completed (a model
response and the results of every function call it asked for), before the next model call.

Cancel-before-start: an invocation registers when its stream is first read, after ``run_async``
was called. A cancel by session through the routes or :func:`cancel_session` that finds no
invocation is held for up to ``start_grace`` seconds (see ``_held.py``); an invocation of the
session asked for before the cancel that registers meanwhile claims it and is aborted at its
first step (ADK is handed a signal already set), and the cancel answers for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import inspect
import threading
from collections.abc import AsyncGenerator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from google.adk.events import Event
from google.adk.runners import Runner
from pydantic import BaseModel, Field

from cancel_bus import (
    CancelBus,
    CancelMode,
    CancelRequest,
    CancelResult,
    InvalidId,
    MultitaskStrategy,
    Outcome,
    RunCancelled,
    RunHandle,
)

from ._held import HeldCancels
from ._sessions import (
    Multitask,
    Turns,
    bus_session,
    enter_session_run,
    event_text,
    running_loop,
)

__all__ = [
    "SUPPORTED",
    "CancelBody",
    "add_cancel_routes",
    "cancel_session",
    "install",
    "uninstall",
]

SUPPORTED = "google-adk>=2.13,<3"
METADATA = {"integration": "google-adk"}
START_GRACE = 1.0  # seconds a session cancel that finds no invocation waits for one to register
STATUS = {  # the HTTP answer of each outcome, as the node service's
    Outcome.CANCELLED: 200,
    Outcome.STOPPING: 202,
    Outcome.ALREADY_FINISHED: 409,
    Outcome.NOT_FOUND: 404,
    Outcome.OWNER_LOST: 200,
}
_RUN_ASYNC = (
    "self",
    "user_id",
    "session_id",
    "invocation_id",
    "new_message",
    "state_delta",
    "run_config",
    "yield_user_message",
    "abort_signal",
)
_SESSION = {"user_id", "session_id"}  # run_async's parameters that name the session
_ORIGINAL_RUN_ASYNC = Runner.run_async
_INSTALL_LOCK = threading.Lock()
# The bus run of the invocation whose code runs here: a nested Runner (``AgentTool``) is its child.
_CURRENT: ContextVar[str | None] = ContextVar("cancel_bus_adk_run", default=None)


@dataclass(eq=False)
class _Invocation(Turns):
    """One ``run_async`` invocation under its bus run."""

    handle: RunHandle
    abort: asyncio.Event
    aborted: bool = False  # by a cancel (else by ADK's caller, or not at all)
    observed: RunCancelled | None = None

    def delivered(self, request: CancelRequest) -> None:
        """A bus callback: ``immediate`` aborts at once."""
        if request.mode is CancelMode.IMMEDIATE:
            self.stop()

    def check(self) -> None:
        """After each event the invocation yielded: abort as a delivered cancel asks."""
        if self.aborted:
            return
        try:
            if self.at_boundary:
                self.handle.turn_boundary()
            else:
                self.handle.checkpoint()
        except RunCancelled as exc:
            self.observed = exc
            self.stop()

    def stop(self) -> None:
        self.aborted = True
        self.abort.set()

    def follow(self, event: Event) -> None:
        """Track the turn, keep the model's text as output, show ops the tool in progress."""
        streamed = bool(self.partial)
        self.track(event)
        if event.author == "user":
            return
        if event.partial or not streamed:
            text = event_text(event)
            if text:
                self.handle.emit(text)
        if not event.partial and event.content is not None:
            calls = event.get_function_calls()
            if calls:
                self.handle.phase = f"tool:{calls[0].name or 'unknown'}"
            elif event.get_function_responses():
                self.handle.phase = "model"

    def ending(self, error: BaseException | None) -> BaseException | None:
        """What the run's scope exits with: the cancel, if one aborted the invocation."""
        if self.aborted and self.observed is None:  # an immediate cancel
            try:
                self.handle.turn_boundary()
            except RunCancelled as exc:
                self.observed = exc
        if self.observed is not None:
            return self.observed
        return None if isinstance(error, GeneratorExit) else error


@dataclass
class _Installed:
    bus: CancelBus
    loop: asyncio.AbstractEventLoop
    busy_timeout: float
    held: HeldCancels
    multitask: Multitask


_INSTALLED: list[_Installed] = []  # at most one: the wrapper is process-wide


def install(
    bus: CancelBus,
    *,
    busy_timeout: float = 10.0,
    multitask_strategy: MultitaskStrategy | str = MultitaskStrategy.REJECT,
    interrupt_mode: CancelMode | str = CancelMode.CHECKPOINT,
) -> None:
    """Make every ``Runner.run_async`` on the running loop (the bus's) a bus run of its session.

    ``multitask_strategy``: what a new invocation of a session does to the session's active run
    on any node (double texting: ``reject`` — the default: ``SessionBusy`` —, ``enqueue``,
    ``interrupt``, ``rollback``; ``interrupt_mode``: the mode the last two cancel it in,
    ``immediate`` to abort its model's stream at once). ``busy_timeout``: how long a new
    invocation of a session waits for the session's stopping run to end before ``SessionBusy``
    (and an interrupt's timeout).
    Raises ``RuntimeError`` if this ADK version changed ``Runner.run_async``'s parameters."""
    loop = running_loop("install")
    multitask = Multitask.checked(multitask_strategy, interrupt_mode)
    with _INSTALL_LOCK:
        if _INSTALLED:
            raise RuntimeError("a bus is already installed for google-adk; uninstall() it first")
        parameters = tuple(inspect.signature(_ORIGINAL_RUN_ASYNC).parameters)
        if parameters != _RUN_ASYNC:
            version = importlib.metadata.version("google-adk")
            raise RuntimeError(
                f"cancel_bus.integrations.google_adk supports {SUPPORTED}; google-adk {version} "
                f"changed Runner.run_async's parameters to {parameters}"
            )
        _INSTALLED.append(_Installed(bus, loop, busy_timeout, HeldCancels(bus), multitask))
        Runner.run_async = _run_async  # type: ignore[method-assign]


def uninstall() -> None:
    """Undo :func:`install` (invocations already going keep their bus runs)."""
    with _INSTALL_LOCK:
        _INSTALLED.clear()
        Runner.run_async = _ORIGINAL_RUN_ASYNC  # type: ignore[method-assign]


def _run_async(self: Runner, **kwargs: Any) -> AsyncGenerator[Event, None]:
    """``Runner.run_async`` while installed; on another loop than the bus's, ADK's own."""
    installed = _INSTALLED[0] if _INSTALLED else None
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if installed is None or running is not installed.loop or not _SESSION.issubset(kwargs):
        return _ORIGINAL_RUN_ASYNC(self, **kwargs)  # (ADK's own says what is missing)
    session = bus_session(self.app_name, kwargs["user_id"], kwargs["session_id"])
    # the session's hold as of now, read by Redis after this call: a hold it sees was recorded
    # before the invocation was asked for, and is not the invocation's to claim
    seen = asyncio.ensure_future(installed.held.seen(session))
    return _bus_run(installed, self, kwargs, session, seen)


async def _bus_run(
    installed: _Installed,
    runner: Runner,
    kwargs: dict[str, Any],
    session: tuple[str, str, str],
    seen: asyncio.Future[str | None],
) -> AsyncGenerator[Event, None]:
    """The invocation under a bus run of its session, registered at the first read; a cancel
    held for the session since ``run_async`` was called (one that ``seen`` did not see) is
    applied then."""
    # entered in a task of its own: an immediate cancel aborts ADK, it does not cancel our task
    scope, handle = await asyncio.ensure_future(
        enter_session_run(
            installed.bus,
            session,
            busy_timeout=installed.busy_timeout,
            metadata=METADATA,
            parent=_CURRENT.get(),
            multitask=installed.multitask,
        )
    )
    invocation = _Invocation(handle=handle, abort=asyncio.Event())
    handle.add_cancel_callback(invocation.delivered)
    caller = kwargs.get("abort_signal")
    relay = asyncio.ensure_future(_relay(caller, invocation.abort)) if caller else None
    current = _CURRENT.set(handle.run_id)
    error: BaseException | None = None
    try:
        await _claim_held(installed, session, handle, await seen)
        invocation.check()  # the start is a turn boundary: a cancel delivered by now aborts ADK
        events = _ORIGINAL_RUN_ASYNC(runner, **{**kwargs, "abort_signal": invocation.abort})
        async with contextlib.aclosing(events):
            async for event in events:
                invocation.follow(event)
                yield event
                invocation.check()
    except BaseException as exc:
        error = exc
        raise
    finally:
        with contextlib.suppress(ValueError):  # closed from another context
            _CURRENT.reset(current)
        if relay is not None:
            relay.cancel()
        end = invocation.ending(error)
        if end is None:
            await scope.__aexit__(None, None, None)
        else:
            await scope.__aexit__(type(end), end, end.__traceback__)


async def _claim_held(
    installed: _Installed, session: tuple[str, str, str], handle: RunHandle, seen: str | None
) -> None:
    """Apply the cancel held for the session since the invocation was asked for (a hold other
    than ``seen``, the one held then; ``None``: unknown, none is claimed), if any: it is
    recorded on the bus like any cancel, and delivered here before this returns."""
    if seen is None:
        return
    request = await installed.held.claim(session, handle.run_id, seen)
    if request is not None:
        await installed.bus.cancel(
            handle.run_id, mode=request.mode, reason=request.reason, wait=False
        )


async def _relay(caller: asyncio.Event, abort: asyncio.Event) -> None:
    """ADK's caller's abort signal (a client that went away) aborts the invocation too."""
    await caller.wait()
    abort.set()


# -- the cancel routes of ADK's FastAPI app ---------------------------------------------------


class CancelBody(BaseModel):
    """A cancel request, as the node service's ``POST .../cancel`` takes it."""

    mode: CancelMode = CancelMode.CHECKPOINT
    reason: str | None = Field(default=None, max_length=1000)
    wait: bool = True
    timeout: float = Field(default=5.0, ge=0.1, le=60.0)


async def cancel_session(
    bus: CancelBus,
    app_name: str,
    user_id: str,
    session_id: str,
    *,
    mode: CancelMode | str = CancelMode.CHECKPOINT,
    reason: str | None = None,
    wait: bool = True,
    timeout: float = 5.0,
    start_grace: float = START_GRACE,
) -> CancelResult:
    """Cancel the ADK session's invocation, wherever it runs (from any node with a bus; no
    :func:`install` needed here): ``bus.cancel_session`` of the session's bus key.

    If no invocation of the session is active, the cancel is held up to ``start_grace`` seconds:
    an invocation asked for (``run_async`` called) before it that registers meanwhile is aborted
    at its first step, and the answer is for it; ``not_found`` only if none did (a later
    invocation is never touched). ``wait``/``timeout`` as the bus's, counted after the grace
    when the cancel was held."""
    return await HeldCancels(bus).cancel_session(
        bus_session(app_name, user_id, session_id),
        mode=CancelMode(mode),
        reason=reason,
        grace=start_grace,
        wait=wait,
        timeout=timeout,
    )


def add_cancel_routes(app: FastAPI, bus: CancelBus, *, start_grace: float = START_GRACE) -> None:
    """Add to ADK's app (``get_fast_api_app``):

    * ``POST /apps/{app_name}/users/{user_id}/sessions/{session_id}/cancel``: the session's
      active invocation, wherever it runs (:func:`cancel_session`: a cancel that finds none is
      held up to ``start_grace`` seconds for one asked for before it);
    * ``POST /runs/{run_id}/cancel``: a bus run by its id.

    Both take :class:`CancelBody` and answer the bus's ``CancelResult`` as JSON, with the node
    service's status codes (200 cancelled or owner_lost, 202 stopping, 404 not found, 409 already
    finished)."""

    @app.post("/apps/{app_name}/users/{user_id}/sessions/{session_id}/cancel")
    async def cancel_session_route(
        app_name: str, user_id: str, session_id: str, body: CancelBody | None = None
    ) -> JSONResponse:
        request = body or CancelBody()
        result = await cancel_session(
            bus,
            app_name,
            user_id,
            session_id,
            mode=request.mode,
            reason=request.reason,
            wait=request.wait,
            timeout=request.timeout,
            start_grace=start_grace,
        )
        return _answer(result)

    @app.post("/runs/{run_id}/cancel")
    async def cancel_run(run_id: str, body: CancelBody | None = None) -> JSONResponse:
        request = body or CancelBody()
        try:
            result = await bus.cancel(
                run_id,
                mode=request.mode,
                reason=request.reason,
                wait=request.wait,
                timeout=request.timeout,
            )
        except InvalidId:  # no run can have it
            result = CancelResult(outcome=Outcome.NOT_FOUND)
        return _answer(result)


def _answer(result: CancelResult) -> JSONResponse:
    return JSONResponse(result.model_dump(mode="json"), status_code=STATUS[result.outcome])
