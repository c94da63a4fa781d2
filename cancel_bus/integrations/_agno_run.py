"""agno: one agno run on this node (:class:`AgnoRun`), as the cancellation manager of
``agno.py`` keeps it: its bus scope, what its checks saw, and the task an ``immediate`` cancel
interrupts."""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

from cancel_bus import CancelMode, CancelRequest, RunCancelled, RunHandle


@dataclass(eq=False)
class AgnoRun:
    """One agno run on this node: its bus scope (None if it was cancelled before it started),
    and what its checks saw."""

    agno_id: str
    bus_run_id: str
    scope: AbstractAsyncContextManager[RunHandle] | None
    handle: RunHandle | None
    observed: RunCancelled | None = None
    task: asyncio.Task[Any] | None = None  # the task of its last async check
    interrupted: asyncio.Task[Any] | None = None  # the task an immediate cancel interrupted
    ending: bool = False
    members: set[str] = field(default_factory=set)
    response: Any = None  # agno's RunOutput / TeamRunOutput, seen at a model request

    def stopping(self, boundary: bool = False) -> bool:
        """The hot path: True once a cancel reached the run (attribute tests); ``after_turn``
        only at a ``boundary``."""
        if self.handle is None:
            return True
        try:
            if boundary:
                self.handle.turn_boundary()
            else:
                self.handle.checkpoint()
        except RunCancelled as exc:
            self.observed = self.observed or exc
            return True
        return False

    def interrupt(self, request: CancelRequest) -> None:
        """An ``immediate`` cancel (a bus callback): cancel the task of its last async check."""
        task = self.task
        if request.mode is not CancelMode.IMMEDIATE or task is None or task.done():
            return
        if self.interrupted is None and not self.ending:
            self.interrupted = task
            message = f"cancel-bus: run {self.agno_id} cancelled (immediate)"
            if task.get_loop() is asyncio.get_running_loop():
                task.cancel(message)
            else:
                task.get_loop().call_soon_threadsafe(task.cancel, message)
