"""trpc-agent's AG-UI server on the bus: the end of a stream stops the runs that stream started,
not its thread's run.

AG-UI's stream handler calls ``cancel.cancel_run(app, user, thread)`` in its ``finally``, however
the stream ended (finished, failed, its client gone). On one process that finds the stream's own
run or nothing; through the bus, a cancel of the thread reaches the thread's run on every node —
the run a second message on the thread started elsewhere (double texting), or the run a refused
second stream was refused for. While installed, ``AgUiAgent.run`` opens a group for its stream
in the stream's context (``begin``); the runs it starts, in the task it creates, join it, and the
manager's ``cancel_run`` from that context cancels the group only."""

from __future__ import annotations

import inspect
from collections.abc import AsyncGenerator, Callable
from typing import Any

try:
    from trpc_agent_sdk.server.ag_ui._core._agui_agent import (  # type: ignore[import-untyped]
        AgUiAgent,
    )
except ImportError:  # trpc-agent without its ag-ui extra: nothing to wrap
    AgUiAgent = None

_RUN = ("self", "input", "http_request")
_ORIGINAL_RUN = AgUiAgent.run if AgUiAgent is not None else None


def wrap(begin: Callable[[], None]) -> None:
    """Make each ``AgUiAgent.run`` call ``begin()`` first, in its stream's context. Raises
    ``RuntimeError`` if this trpc-agent version changed its parameters."""
    if AgUiAgent is None or _ORIGINAL_RUN is None:
        return
    parameters = tuple(inspect.signature(_ORIGINAL_RUN).parameters)
    if parameters != _RUN:
        raise RuntimeError(f"trpc-agent changed AgUiAgent.run's parameters to {parameters}")
    original = _ORIGINAL_RUN

    async def run(self: Any, input: Any, http_request: Any = None) -> AsyncGenerator[Any, None]:
        begin()
        async for event in original(self, input, http_request):
            yield event

    AgUiAgent.run = run


def unwrap() -> None:
    """Undo :func:`wrap`."""
    if AgUiAgent is not None:
        AgUiAgent.run = _ORIGINAL_RUN
