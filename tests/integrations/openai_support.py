"""A scripted model for openai-agents (no network): one scripted turn per model call."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from agents import Model, ModelResponse, function_tool
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseTextDeltaEvent,
)


@dataclass
class Turn:
    """One model call: text deltas, then optionally a hang (a slow stream) or a tool call. An
    Event among the deltas stalls the stream until it is set (the model thinking)."""

    deltas: list[str | asyncio.Event]
    tool: str | None = None
    hang: bool = False

    @property
    def text(self) -> str:
        return "".join(delta for delta in self.deltas if isinstance(delta, str))


class ScriptedModel(Model):
    """Streams one scripted turn per call; a hanging turn waits until it is cancelled."""

    def __init__(self, *turns: Turn, cleanup_seconds: float = 0.0) -> None:
        self.turns = list(turns)
        self.calls = 0
        self.cleanup_seconds = cleanup_seconds  # closing a real HTTP stream takes a moment
        self.hanging = asyncio.Event()
        self.interrupted = asyncio.Event()

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        raise AssertionError("the bridge streams")

    async def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        turn = self.turns[self.calls]
        self.calls += 1
        for i, delta in enumerate(turn.deltas):
            if isinstance(delta, asyncio.Event):
                await delta.wait()
                continue
            yield ResponseTextDeltaEvent(
                type="response.output_text.delta",
                item_id="msg",
                output_index=0,
                content_index=0,
                delta=delta,
                logprobs=[],
                sequence_number=i,
            )
        if turn.hang:
            self.hanging.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                await asyncio.sleep(self.cleanup_seconds)
                self.interrupted.set()
                raise
        text = ResponseOutputText(type="output_text", text=turn.text, annotations=[])
        output: list[Any] = [
            ResponseOutputMessage(
                id="msg", type="message", role="assistant", status="completed", content=[text]
            )
        ]
        if turn.tool is not None:
            call_id = f"call-{self.calls}"
            output.append(
                ResponseFunctionToolCall(
                    id=call_id,
                    call_id=call_id,
                    type="function_call",
                    name=turn.tool,
                    arguments="{}",
                )
            )
        response = Response(
            id=f"resp-{self.calls}",
            created_at=0,
            model="scripted",
            object="response",
            output=output,
            tool_choice="auto",
            tools=[],
            top_p=None,
            parallel_tool_calls=False,
            status="completed",
        )
        yield ResponseCompletedEvent(
            type="response.completed", response=response, sequence_number=len(turn.deltas)
        )


@dataclass
class Tool:
    """A tool that waits for the test to let it finish (a long tool call)."""

    started: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    finished: bool = False
    interrupted: bool = False

    def as_tool(self) -> Any:
        async def lookup() -> str:
            """Look the answer up."""
            self.started.set()
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.interrupted = True
                raise
            self.finished = True
            return "42"

        return function_tool(lookup)
