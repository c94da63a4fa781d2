"""One run's state on its owner: the token a cancel sets and its checkpoints test, the cancel
timestamps, how the run's code ended; and :class:`RunCancelled`, what a checkpoint raises.

Only the node's rooms touch it; the run's code holds a :class:`~._run.RunHandle` over it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any, NoReturn

from ._errors import CancelBusError
from ._run_parts import Notes, Output, Pending, RelayEntry
from ._types import CancelMode, CancelRequest, RunInfo, RunStatus, StopCause

log = logging.getLogger("cancel_bus")


class RunCancelled(CancelBusError):
    """Raised at a checkpoint of a run whose cancel was requested.

    Leaving the run scope with this exception records the run as cancelled and suppresses it.
    """

    def __init__(self, run_id: str, request: CancelRequest | None) -> None:
        reason = request.reason if request is not None else None
        super().__init__(f"run {run_id} cancelled" + (f": {reason}" if reason else ""))
        self.run_id = run_id
        self.request = request


# The run whose code is executing (set by its scope, seen by the tasks its code starts): a run
# started there is its child, unless told otherwise — while it has not ended (a scope exited
# from another task cannot reset this task's context).
current_run: ContextVar[RunState | None] = ContextVar("cancel_bus_current_run", default=None)


@dataclass(frozen=True, slots=True)
class Ending:
    """How a run's code ended, as its scope saw it: the status to record and the error."""

    status: RunStatus
    error: str | None


class RunState:
    """The node's side of one run: the token (a recorded request, or its node's own stop) and
    the cancel timestamps; its parts (``_run_parts``) keep its output, what waits to be written
    and what its owner observed of its code."""

    __slots__ = (
        "_callbacks",
        "_exiting",
        "_fields",
        "_info",
        "_task",
        "_task_cancel_sent",
        "closed",
        "delivered_at",
        "epoch",
        "final_status",
        "finishing",
        "local_stop",
        "notes",
        "observed_at",
        "output",
        "pending",
        "relay",
        "request",
        "run_id",
        "stop_at_checkpoint",
    )

    def __init__(
        self,
        run_id: str,
        fields: dict[str, str],
        *,
        epoch: str,
        relay: bool,
        max_output_chars: int,
    ) -> None:
        self.run_id = run_id
        self._fields = fields  # the record as its start left it, parsed on first use
        self._info: RunInfo | None = None
        self.epoch = epoch
        self.relay = relay
        self.request: CancelRequest | None = None  # recorded in Redis
        self.local_stop: CancelRequest | None = None  # its node stopped it, nobody asked
        self.stop_at_checkpoint = False
        self.delivered_at: float | None = None
        self.observed_at: float | None = None
        self.output = Output(max_output_chars)
        self.pending = Pending()
        self.notes = Notes()
        self.final_status: RunStatus | None = None
        self.finishing = False  # its finish has been sent
        self.closed = False  # its scope has exited: what its code does now is a leak
        self._task: asyncio.Task[Any] | None = None
        self._task_cancel_sent = False
        self._exiting = False
        self._callbacks: list[Callable[[CancelRequest], None]] = []

    @property
    def info(self) -> RunInfo:
        """The run as recorded when it started here."""
        if self._info is None:
            self._info = RunInfo.from_redis(self._fields)
        return self._info

    @property
    def cancel_requested(self) -> CancelRequest | None:
        return self.request or self.local_stop

    @property
    def stop_cause(self) -> StopCause | None:
        return self.local_stop.cause if self.local_stop is not None else None

    @property
    def session(self) -> tuple[str, str, str] | None:
        info = self.info
        if info.app_name is None or info.user_id is None or info.session_id is None:
            return None
        return (info.app_name, info.user_id, info.session_id)

    def deliver(self, request: CancelRequest, at: float) -> bool:
        """Set the token for a recorded request (idempotent; a stronger mode escalates).
        True if anything changed."""
        current = self.request
        if current is None:
            self.request = request
            self.delivered_at = at
            self.pending.delivery_dirty = True
        elif request.mode.strength > current.mode.strength:
            self.request = replace(current, mode=request.mode)
        else:
            return False
        self._arm(self.request)
        return True

    def stop(self, cause: StopCause, at: float) -> None:
        """Stop without a request in Redis: like an ``immediate`` cancel, recorded with its
        cause (``cancelled`` only for a drain, which records its own request)."""
        if self.local_stop is None:
            self.local_stop = CancelRequest(CancelMode.IMMEDIATE, cause.value, None, at, cause)
            self._arm(self.local_stop)

    def add_callback(self, callback: Callable[[CancelRequest], None]) -> None:
        self._callbacks.append(callback)
        if self.cancel_requested is not None:
            callback(self.cancel_requested)

    def observe(self, at: float) -> NoReturn:
        if self.observed_at is None:
            self.observed_at = at
        raise RunCancelled(self.run_id, self.cancel_requested)

    def bind_task(self, task: asyncio.Task[Any] | None) -> None:
        """The task an ``immediate`` cancel interrupts: the one that entered the run scope (a
        cancel that came while the run was being registered interrupts it now)."""
        self._task = task
        request = self.cancel_requested
        if request is not None and request.mode is CancelMode.IMMEDIATE:
            self._interrupt()

    def settle(self, exc: BaseException | None, at: float) -> tuple[Ending, bool]:
        """How the run ended, and whether its exception is to be suppressed.

        Our own ``immediate`` cancellation is balanced with ``uncancel()`` and turned into a
        cancel; it is swallowed only if no other cancellation of the task is pending. A
        ``CancelledError`` that is not ours is recorded as a failure and never swallowed."""
        self._exiting = True
        task = self._task
        sent = self._task_cancel_sent and task is not None
        pending = task.uncancel() if sent and task is not None else 0
        if exc is None:
            return Ending(RunStatus.SUCCEEDED, None), False
        if isinstance(exc, RunCancelled) and exc.run_id == self.run_id:
            return Ending(RunStatus.CANCELLED, None), True
        if isinstance(exc, asyncio.CancelledError):
            if sent:  # asked to stop, and stopped; the exception goes on while another
                # cancellation is pending (an enclosing run's in the same task, or a foreign one)
                if self.observed_at is None:
                    self.observed_at = at
                return Ending(RunStatus.CANCELLED, None), pending == 0
            return Ending(RunStatus.FAILED, "interrupted: the asyncio task was cancelled"), False
        return Ending(RunStatus.FAILED, f"{type(exc).__name__}: {exc}"), False

    def record(self) -> dict[str, str]:
        """The run as this node knows it, to re-create a record Redis lost."""
        info = self.info
        record: dict[str, str] = {"status": "running", "created_at": f"{info.created_at:.6f}"}
        if info.started_at is not None:
            record["started_at"] = f"{info.started_at:.6f}"
        if info.app_name is not None and info.user_id is not None and info.session_id is not None:
            record.update(app_name=info.app_name, user_id=info.user_id)
            record["session_id"] = info.session_id
        if info.metadata is not None:
            record["metadata"] = json.dumps(info.metadata, separators=(",", ":"))
        if self.relay:
            record["relay"] = "1"
        if self.pending.phase is not None:
            record["phase"] = self.pending.phase
        if self.request is not None:
            request = self.request
            record["cancel_requested_at"] = f"{request.requested_at:.6f}"
            record["cancel_mode"] = request.mode.value
            record["cancel_cause"] = request.cause.value
            if request.reason:
                record["cancel_reason"] = request.reason
            if request.requested_by:
                record["requested_by"] = request.requested_by
        return record

    def close(self) -> None:
        """Its scope has exited."""
        self.closed = True
        self.notes.close()

    def take_updates(self) -> tuple[str, str, list[RelayEntry], str] | None:
        """The phase, delivery time, relay entries and notes not written yet (taken), or
        None."""
        pending = self.pending
        phase = (pending.phase or "") if pending.phase_dirty else ""
        delivered = ""
        if pending.delivery_dirty and self.delivered_at is not None:
            delivered = f"{self.delivered_at:.6f}"
        entries = pending.relay
        notes = self.notes.take() if self.notes.waiting else ""
        if not (phase or delivered or entries or notes):
            return None
        pending.clear()
        pending.relay = []
        return phase, delivered, entries, notes

    def put_back(self, phase: str, delivered: str, entries: list[RelayEntry], notes: str) -> None:
        """Updates that could not be written: again, before any newer ones."""
        pending = self.pending
        pending.phase_dirty = pending.phase_dirty or bool(phase)
        pending.delivery_dirty = pending.delivery_dirty or bool(delivered)
        pending.relay[:0] = entries
        if notes:
            self.notes.put_back(notes)

    def _arm(self, request: CancelRequest) -> None:
        """Make checkpoints raise (and interrupt the task) as ``request`` asks; tell callbacks."""
        if request.mode is not CancelMode.AFTER_TURN:
            self.stop_at_checkpoint = True
        if request.mode is CancelMode.IMMEDIATE:
            self._interrupt()
        for callback in self._callbacks:
            try:
                callback(request)
            except Exception:
                log.exception("cancel-bus: a cancel callback of run %s failed", self.run_id)

    def _interrupt(self) -> None:
        task = self._task
        if task is None or self._exiting or self._task_cancel_sent or task.done():
            return
        self._task_cancel_sent = True
        task.cancel(msg=f"cancel-bus: run {self.run_id} cancelled (immediate)")
