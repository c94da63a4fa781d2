"""pydantic-ai: an agent run (``agent.iter``, ``run_stream``, ``run_stream_events``) under a bus
run, so that a cancel from any node stops it.

    async with (
        bus.run(app_name="chat", user_id="u1", session_id="s1") as run,
        pydantic_ai.run_stream_events(run, agent, "question") as events,
    ):
        async for event in events:
            ...

pydantic-ai has no cancel API another process could call: on any node, call
``bus.cancel_session(...)`` (or ``bus.cancel(run_id)``); the owner stops the agent run with
pydantic-ai's own cancellation. Each helper calls the agent with one more capability,
:class:`BusCheckpoints`, whose hooks are checkpoints: before each graph node and after each
stream event, however the run is driven. ``checkpoint``: the run is cancelled there
(``RunContext.cancel()``: the model request in flight is torn down, tool tasks are cancelled).
``after_turn``: at the next model request node, so the model response and the tool calls it asked
for complete first. ``immediate``: the bus cancels the task driving the run at once (the model
stream or tool call in flight). Text deltas are emitted to the run.

A cancel ends the block with ``cancel_bus.RunCancelled`` (chained from pydantic-ai's own
``RunCancelled``; for ``immediate``, the ``CancelledError`` the bus sent), which the bus scope
records ``cancelled`` and suppresses. The messages so far stay where pydantic-ai keeps
them: ``agent_run.all_messages()``, ``events.all_messages()``, ``result.all_messages()`` (and
the chained exception's ``all_messages()``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.agent import AgentRun, AgentRunEvents
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.exceptions import RunCancelled as AgentRunCancelled
from pydantic_ai.exceptions import RunTimedOut
from pydantic_ai.messages import (
    AgentStreamEvent,
    PartDeltaEvent,
    PartStartEvent,
    TextPart,
    TextPartDelta,
)
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.result import StreamedRunResult
from pydantic_ai.tools import RunContext

from cancel_bus import RunCancelled, RunHandle

__all__ = ["SUPPORTED", "BusCheckpoints", "iter", "run_stream", "run_stream_events"]

SUPPORTED = "pydantic-ai-slim>=2.78,<3"


@dataclass
class BusCheckpoints(AbstractCapability[Any]):
    """Checkpoints of the bus run ``run`` in a pydantic-ai run's hooks: before each graph node,
    after each stream event, and (the turn boundary) before each model request. A delivered
    cancel cancels the agent run there (pydantic-ai's ``RunContext.cancel()``)."""

    run: RunHandle

    async def before_node_run(self, ctx: RunContext[Any], *, node: Any) -> Any:
        """A checkpoint before each graph node: a delivered cancel (not ``after_turn``) cancels the
        agent run here."""
        if self._stopping(boundary=False):
            await _cancel(ctx)
        return node

    async def before_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        """The turn boundary: a delivered cancel, ``after_turn`` included, cancels the agent run
        before the model request."""
        if self._stopping(boundary=True):  # the previous turn's tool results are in history
            await _cancel(ctx)
        return request_context

    async def wrap_run_event_stream(
        self, ctx: RunContext[Any], *, stream: AsyncIterable[AgentStreamEvent]
    ) -> AsyncIterable[AgentStreamEvent]:
        """The stream as it comes, each event's text emitted to the bus run; a checkpoint after each
        event: a delivered cancel (not ``after_turn``) cancels the agent run at the stream's next
        await."""
        async for event in stream:
            text = _text(event)
            if text:
                self.run.emit(text)
            yield event
            if self._stopping(boundary=False):
                ctx.cancel()  # delivered at the stream's next await

    def _stopping(self, boundary: bool) -> bool:
        try:
            if boundary:
                self.run.turn_boundary()
            else:
                self.run.checkpoint()
        except RunCancelled:
            return True
        return False


async def _cancel(ctx: RunContext[Any]) -> None:
    """Cancel the agent run now: its cancellation lands at this await."""
    ctx.cancel()
    await asyncio.sleep(0)


def _text(event: AgentStreamEvent) -> str:
    if isinstance(event, PartStartEvent) and isinstance(event.part, TextPart):
        return event.part.content
    if isinstance(event, PartDeltaEvent) and isinstance(event.delta, TextPartDelta):
        return event.delta.content_delta
    return ""


def _options(run: RunHandle, kwargs: dict[str, Any]) -> dict[str, Any]:
    capabilities: Sequence[Any] = kwargs.get("capabilities") or ()
    return {**kwargs, "capabilities": [*capabilities, BusCheckpoints(run)]}


@asynccontextmanager
async def _translated(run: RunHandle) -> AsyncIterator[None]:
    """pydantic-ai's ``RunCancelled`` for a cancel of ``run`` becomes the bus's."""
    try:
        yield
    except AgentRunCancelled as exc:
        if isinstance(exc, RunTimedOut) or run.cancel_requested is None:
            raise  # the run's own timeout, or a cancel that is not the bus's
        try:
            run.turn_boundary()
        except RunCancelled as cancelled:
            raise cancelled from exc
        raise


@asynccontextmanager
async def iter(
    run: RunHandle, agent: Agent[Any, Any], user_prompt: Any = None, **kwargs: Any
) -> AsyncIterator[AgentRun[Any, Any]]:
    """``agent.iter(user_prompt, **kwargs)`` bound to the bus run ``run``."""
    async with (
        _translated(run),
        agent.iter(user_prompt, **_options(run, kwargs)) as agent_run,
    ):
        yield agent_run


@asynccontextmanager
async def run_stream(
    run: RunHandle, agent: Agent[Any, Any], user_prompt: Any = None, **kwargs: Any
) -> AsyncIterator[StreamedRunResult[Any, Any]]:
    """``agent.run_stream(user_prompt, **kwargs)`` bound to the bus run ``run``. (Not
    ``result.cancel()``: it stops only the current model response, and the run goes on.)"""
    async with (
        _translated(run),
        agent.run_stream(user_prompt, **_options(run, kwargs)) as result,
    ):
        yield result


@asynccontextmanager
async def run_stream_events(
    run: RunHandle, agent: Agent[Any, Any], user_prompt: Any = None, **kwargs: Any
) -> AsyncIterator[AgentRunEvents[Any]]:
    """``agent.run_stream_events(user_prompt, **kwargs)`` bound to the bus run ``run``."""
    async with (
        _translated(run),
        agent.run_stream_events(user_prompt, **_options(run, kwargs)) as events,
    ):
        yield events
