"""LangGraph: ``graph.astream(...)`` under a bus run, so that a cancel from any node stops it.

    async with (
        bus.run(app_name="chat", user_id="u1", session_id="s1") as run,
        astream(run, graph, inputs, config, stream_mode="updates") as chunks,
    ):
        async for chunk in chunks:
            ...

``checkpoint``: the stream stops between two chunks, or at the next superstep if no chunk comes;
the nodes still running are cancelled. ``immediate``: the bus cancels the consuming task, which
interrupts the node being awaited (a tool call in flight). ``after_turn``: the superstep in
progress completes and the graph drains (LangGraph's ``RunControl``; with a checkpointer the
thread can be resumed). Every chunk delivered is also emitted to the run (``render``), so a
cancelled run keeps its partial output. A cancel raises ``RunCancelled`` out of the loop, which
the bus scope records as ``cancelled`` and suppresses.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing, asynccontextmanager
from typing import Any, cast, get_args

from langchain_core.messages import BaseMessage
from langchain_core.runnables import RunnableConfig
from langgraph.errors import GraphDrained
from langgraph.pregel import Pregel
from langgraph.runtime import RunControl
from langgraph.types import StreamMode

from cancel_bus import RunHandle

_STREAM_MODES = frozenset(get_args(StreamMode))


def render_chunk(chunk: Any) -> str:
    """The default text kept for a chunk: an LLM token's text, a string as is, else one JSON
    line. A ``(mode, data)`` pair (``stream_mode`` given as a list) is rendered by its data."""
    match chunk:
        case (str() as mode, data) if mode in _STREAM_MODES:
            return render_chunk(data)
        case str():
            return chunk
        case (BaseMessage() as message, _):
            return message.text
        case _:
            return json.dumps(chunk, default=str, ensure_ascii=False) + "\n"


class BusRunControl(RunControl):
    """LangGraph's drain signal, raised by any cancel delivered to the bus run.

    The graph loop reads it before every superstep (a local attribute test), and nodes can poll
    it as ``runtime.drain_requested``."""

    __slots__ = ("_run",)

    def __init__(self, run: RunHandle) -> None:
        super().__init__()
        self._run = run

    @property
    def drain_requested(self) -> bool:
        """True once a cancel (any mode) reached the bus run, or LangGraph's own drain was asked
        for: attribute tests, no I/O."""
        return self._run.cancel_requested is not None or super().drain_requested

    @property
    def drain_reason(self) -> str | None:
        """``cancel-bus: <reason, else mode>`` for a bus cancel; else LangGraph's own."""
        request = self._run.cancel_requested
        if request is None:
            return super().drain_reason
        return f"cancel-bus: {request.reason or request.mode.value}"


@asynccontextmanager
async def astream(
    run: RunHandle,
    graph: Pregel[Any, Any, Any, Any],
    input: Any,
    config: RunnableConfig | None = None,
    *,
    render: Callable[[Any], str] = render_chunk,
    **kwargs: Any,
) -> AsyncIterator[AsyncIterator[Any]]:
    """``graph.astream(input, config, **kwargs)`` bound to the bus run ``run``.

    On exit the graph is closed: nodes still running are cancelled."""
    chunks = cast(
        "AsyncGenerator[Any, None]",
        graph.astream(input, config, control=BusRunControl(run), **kwargs),
    )
    stream = _checkpointed(run, chunks, render)
    try:
        yield stream
    finally:
        await stream.aclose()


async def _checkpointed(
    run: RunHandle, chunks: AsyncGenerator[Any, None], render: Callable[[Any], str]
) -> AsyncGenerator[Any, None]:
    async with aclosing(chunks):
        try:
            async for chunk in chunks:
                text = render(chunk)
                if text:
                    run.emit(text)
                yield chunk
                run.checkpoint()
        except GraphDrained:
            run.turn_boundary()  # the drain is the bus cancel: raise RunCancelled instead
            raise
