"""The owner side of one run: its local cancel token, checkpoints, output, and the run scope.

``checkpoint()`` is the hot path: one attribute test, no I/O, no lock, no allocation. Everything
that writes to Redis (phase, delivery time, relayed output) is handed to the node and batched.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any, Protocol

from ._errors import RunCancelled
from ._types import CancelMode, CancelRequest, RunInfo, RunStatus, StopCause

log = logging.getLogger("cancel_bus")


class RunOwner(Protocol):
    """What a run needs from its node (implemented by :class:`CancelBus`)."""

    def clock(self) -> float: ...

    async def start_run(self, spec: RunSpec) -> RunHandle: ...

    async def finish_run(self, handle: RunHandle, status: RunStatus, error: str | None) -> None: ...

    async def set_waiting(self, handle: RunHandle, waiting: bool) -> None: ...

    def run_changed(self, handle: RunHandle) -> None: ...


@dataclass(frozen=True, slots=True)
class RunSpec:
    run_id: str
    session: tuple[str, str, str] | None
    metadata: dict[str, Any] | None
    relay: bool


class RunHandle:
    """What the code of a run holds: ``checkpoint()``, ``emit()``, ``phase`` and the request."""

    __slots__ = (
        "_callbacks",
        "_exiting",
        "_local_stop",
        "_owner",
        "_phase",
        "_request",
        "_stop_at_checkpoint",
        "_task",
        "_task_cancel_sent",
        "app_name",
        "created_at",
        "delivered_at",
        "delivery_dirty",
        "epoch",
        "final_status",
        "max_output_chars",
        "metadata",
        "observed_at",
        "output_chunks",
        "output_size",
        "output_truncated",
        "pending_relay",
        "phase_dirty",
        "relay",
        "run_id",
        "session_id",
        "started_at",
        "user_id",
    )

    def __init__(
        self, info: RunInfo, owner: RunOwner, *, epoch: str, relay: bool, max_output_chars: int
    ) -> None:
        self.run_id = info.run_id
        self.epoch = epoch
        self.app_name = info.app_name
        self.user_id = info.user_id
        self.session_id = info.session_id
        self.metadata = info.metadata
        self.created_at = info.created_at
        self.started_at = info.started_at
        self.relay = relay
        self.max_output_chars = max_output_chars
        self.output_chunks: list[str] = []
        self.output_size = 0
        self.output_truncated = False
        self.pending_relay: list[tuple[str, str, str]] = []
        self.phase_dirty = False
        self.delivered_at: float | None = None
        self.delivery_dirty = False
        self.observed_at: float | None = None
        self.final_status: RunStatus | None = None
        self._owner = owner
        self._phase: str | None = None
        self._request: CancelRequest | None = None  # recorded in Redis
        self._local_stop: CancelRequest | None = None  # its node stopped it (no request)
        self._stop_at_checkpoint = False
        self._task: asyncio.Task[Any] | None = None
        self._task_cancel_sent = False
        self._exiting = False
        self._callbacks: list[Callable[[CancelRequest], None]] = []

    # -- the run's code calls these ----------------------------------------------------------

    def checkpoint(self) -> None:
        """Raise :class:`RunCancelled` if a cancel (other than ``after_turn``) was delivered."""
        if self._stop_at_checkpoint:
            self._observe()

    def turn_boundary(self) -> None:
        """Like :meth:`checkpoint`, and also honours ``after_turn`` requests."""
        if self._request is not None or self._local_stop is not None:
            self._observe()

    @property
    def cancel_requested(self) -> CancelRequest | None:
        """Why the run must stop: the recorded request, else its node's own stop (see
        :attr:`CancelRequest.cause`); None while it may go on."""
        return self._request or self._local_stop

    @property
    def stop_cause(self) -> StopCause | None:
        """Why its node stopped the run without a request (lease lost, Redis unreachable,
        drain), if it did."""
        return self._local_stop.cause if self._local_stop is not None else None

    def add_cancel_callback(self, callback: Callable[[CancelRequest], None]) -> None:
        """Call ``callback(request)`` when a cancel reaches this run, and again when a stronger
        mode escalates it (at once if one already has). For adapters that must react at once,
        e.g. by handing the cancel to a framework; it runs in the node's listener: be quick."""
        self._callbacks.append(callback)
        request = self.cancel_requested
        if request is not None:
            callback(request)

    @property
    def session(self) -> tuple[str, str, str] | None:
        if self.app_name is None or self.user_id is None or self.session_id is None:
            return None
        return (self.app_name, self.user_id, self.session_id)

    def emit(self, text: str) -> None:
        """Append output; it is kept as partial output if the run is cancelled."""
        room = self.max_output_chars - self.output_size
        if room <= 0:
            self.output_truncated = True
            return
        if len(text) > room:
            text = text[:room]
            self.output_truncated = True
        self.output_chunks.append(text)
        self.output_size += len(text)
        if self.relay:
            self._relay("output", {"text": text})

    def emit_event(self, event_type: str, data: dict[str, Any]) -> None:
        """Relay an application event (a tool call, a tool result...) to followers of the run."""
        if self.relay:
            self._relay(event_type, data)

    @property
    def output(self) -> str:
        return "".join(self.output_chunks)

    @property
    def phase(self) -> str | None:
        return self._phase

    @phase.setter
    def phase(self, value: str | None) -> None:
        if value != self._phase:
            self._phase = value
            self.phase_dirty = True
            self._owner.run_changed(self)

    async def pause(self) -> None:
        """Hand control back (status ``waiting``, e.g. awaiting a human). While waiting, a cancel
        ends the run at once; raises :class:`RunCancelled` if a cancel is already pending."""
        self.checkpoint()
        await self._owner.set_waiting(self, True)

    async def resume(self) -> None:
        """Back to ``running``; raises :class:`RunCancelled` if it was cancelled while waiting."""
        await self._owner.set_waiting(self, False)
        self.turn_boundary()

    # -- the node calls these ----------------------------------------------------------------

    def deliver(self, request: CancelRequest) -> bool:
        """Set the local token (idempotent; a stronger mode escalates). True if anything changed."""
        current = self._request
        if current is None:
            self._request = request
            self.delivered_at = self._owner.clock()
            self.delivery_dirty = True
        elif request.mode.strength > current.mode.strength:
            self._request = replace(current, mode=request.mode)
        else:
            return False
        self._arm(self._request)
        self._owner.run_changed(self)
        return True

    def stop(self, cause: StopCause) -> None:
        """Stop the run without a request in Redis: its node was fenced, lost Redis for too
        long, or is closing. Like an ``immediate`` cancel; recorded with the cause, and as
        ``cancelled`` only for a drain (which records its own request)."""
        if self._local_stop is not None:
            return
        now = self._owner.clock()
        self._local_stop = CancelRequest(CancelMode.IMMEDIATE, cause.value, None, now, cause)
        self._arm(self._local_stop)

    def _arm(self, request: CancelRequest) -> None:
        """Make checkpoints raise (and interrupt the task) as ``request`` asks; tell callbacks."""
        self._stop_at_checkpoint = self._stop_at_checkpoint or (
            request.mode is not CancelMode.AFTER_TURN
        )
        if request.mode is CancelMode.IMMEDIATE:
            self._interrupt()
        for callback in self._callbacks:
            try:
                callback(request)
            except Exception:
                log.exception("cancel-bus: a cancel callback of run %s failed", self.run_id)

    def bind_task(self, task: asyncio.Task[Any] | None) -> None:
        """The task an ``immediate`` cancel interrupts: the one that entered the run scope (a
        cancel that came while the run was being registered interrupts it now)."""
        self._task = task
        request = self.cancel_requested
        if request is not None and (
            request.mode is CancelMode.IMMEDIATE or self._local_stop is not None
        ):
            self._interrupt()

    def record(self) -> dict[str, str]:
        """The run as this node knows it, to re-create a record Redis lost."""
        record: dict[str, str] = {"status": "running", "created_at": f"{self.created_at:.6f}"}
        if self.started_at is not None:
            record["started_at"] = f"{self.started_at:.6f}"
        if self.session is not None:
            record.update(app_name=self.app_name or "", user_id=self.user_id or "")
            record["session_id"] = self.session_id or ""
        if self.metadata is not None:
            record["metadata"] = json.dumps(self.metadata, separators=(",", ":"))
        if self.relay:
            record["relay"] = "1"
        if self._phase is not None:
            record["phase"] = self._phase
        if self._request is not None:
            request = self._request
            record["cancel_requested_at"] = f"{request.requested_at:.6f}"
            record["cancel_mode"] = request.mode.value
            if request.reason:
                record["cancel_reason"] = request.reason
            if request.requested_by:
                record["requested_by"] = request.requested_by
        return record

    def _relay(self, event_type: str, data: dict[str, Any]) -> None:
        at = f"{self._owner.clock():.6f}"
        self.pending_relay.append((event_type, at, json.dumps(data, separators=(",", ":"))))
        self._owner.run_changed(self)

    def _observe(self) -> None:
        if self.observed_at is None:
            self.observed_at = self._owner.clock()
        raise RunCancelled(self.run_id, self.cancel_requested)

    def _interrupt(self) -> None:
        task = self._task
        if task is None or self._exiting or self._task_cancel_sent or task.done():
            return
        self._task_cancel_sent = True
        task.cancel(msg=f"cancel-bus: run {self.run_id} cancelled (immediate)")

    def settle(self, exc: BaseException | None) -> tuple[RunStatus, str | None, bool]:
        """Decide how the run ended: (status to record, error, suppress the exception).

        Our own ``immediate`` cancellation is balanced with ``uncancel()`` and turned into a
        cancel; a ``CancelledError`` that is not ours is recorded and never swallowed."""
        self._exiting = True
        task = self._task
        ours = False
        if self._task_cancel_sent and task is not None:
            ours = task.uncancel() == 0
        if exc is None:
            return RunStatus.SUCCEEDED, None, False
        if isinstance(exc, RunCancelled) and exc.run_id == self.run_id:
            return RunStatus.CANCELLED, None, True
        if isinstance(exc, asyncio.CancelledError):
            if ours:
                if self.observed_at is None:
                    self.observed_at = self._owner.clock()
                return RunStatus.CANCELLED, None, True
            return RunStatus.FAILED, "interrupted: the asyncio task was cancelled", False
        return RunStatus.FAILED, f"{type(exc).__name__}: {exc}", False


class RunScope:
    """``async with bus.run(...) as run``: registers on entry, records the end on exit."""

    def __init__(self, owner: RunOwner, spec: RunSpec) -> None:
        self._owner = owner
        self._spec = spec
        self._handle: RunHandle | None = None

    async def __aenter__(self) -> RunHandle:
        handle = await self._owner.start_run(self._spec)
        handle.bind_task(asyncio.current_task())
        self._handle = handle
        return handle

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        handle = self._handle
        assert handle is not None, "the run scope was not entered"
        status, error, suppress = handle.settle(exc)
        await asyncio.shield(self._owner.finish_run(handle, status, error))
        return suppress
