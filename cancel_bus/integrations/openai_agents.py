"""openai-agents: a streamed run (``Runner.run_streamed``) that a cancel from any node stops.

    async with (
        bus.run(app_name="chat", user_id="u1", session_id="s1") as run,
        stream_events(run, Runner.run_streamed(agent, "question")) as events,
    ):
        async for event in events:
            ...

A bus cancel becomes the SDK's own ``result.cancel(mode=...)``. ``immediate``: the bus cancels the
consuming task and the SDK cancels its run loop (the model stream or tool call in flight is
interrupted). ``checkpoint``: the stream stops at its next event (each one a checkpoint) and the
SDK's run is cancelled there. ``after_turn``: handed to the SDK as ``after_turn`` when the cancel
arrives; the turn in progress completes, tools included, and no new turn starts. Text deltas are
emitted to the run, so a cancelled run keeps its partial output. A run the cancel stopped before
its final output raises ``RunCancelled`` out of the loop, which the bus scope records as
``cancelled`` and suppresses; a run that reached its final output anyway ends the block normally
(recorded ``cancelled``, ``end_reason`` ``completed``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing, asynccontextmanager
from typing import cast

from agents import (
    RawResponsesStreamEvent,
    RunItemStreamEvent,
    RunResultStreaming,
    StreamEvent,
    ToolCallItem,
)
from openai.types.responses import ResponseTextDeltaEvent

from cancel_bus import CancelMode, CancelRequest, RunCancelled, RunHandle


@asynccontextmanager
async def stream_events(
    run: RunHandle, result: RunResultStreaming
) -> AsyncIterator[AsyncIterator[StreamEvent]]:
    """``result.stream_events()`` bound to the bus run ``run``; on exit the agent run is over.

    Leaving the block early (an exception, a ``break``) cancels the agent run (``immediate``), so
    nothing of it outlives its bus run; the exit waits for the SDK's run loop to unwind."""

    def hand_over(request: CancelRequest) -> None:
        if request.mode is CancelMode.AFTER_TURN:
            result.cancel("after_turn")  # a flag the SDK reads at its next turn boundary

    run.add_cancel_callback(hand_over)
    events = _bridge(run, result)
    try:
        yield events
    finally:
        if not result.is_complete:
            result.cancel("immediate")
        await events.aclose()
        if result.run_loop_task is not None:
            await asyncio.wait([result.run_loop_task])


async def _bridge(run: RunHandle, result: RunResultStreaming) -> AsyncGenerator[StreamEvent, None]:
    sdk_events = cast("AsyncGenerator[StreamEvent, None]", result.stream_events())
    async with aclosing(sdk_events):
        async for event in sdk_events:
            _record(run, event)
            yield event
            try:
                run.checkpoint()  # every event is a checkpoint
            except RunCancelled:
                result.cancel("immediate")  # first: closing its stream waits for its run loop
                raise
    if run.cancel_requested is not None and result.final_output is None:
        run.turn_boundary()


def _record(run: RunHandle, event: StreamEvent) -> None:
    """Keep text as output; show ops which tool the run is in."""
    if isinstance(event, RawResponsesStreamEvent):
        if isinstance(event.data, ResponseTextDeltaEvent):
            run.emit(event.data.delta)
    elif isinstance(event, RunItemStreamEvent):
        if isinstance(event.item, ToolCallItem):
            run.phase = f"tool:{event.item.tool_name or 'unknown'}"
        elif event.name == "tool_output":
            run.phase = "model"
