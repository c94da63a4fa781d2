"""A pydantic-ai model that plays the story (story_support.py), no network: pydantic-ai's own
``FunctionModel``, streamed (``stream_function``) and whole (``function``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel

from .story_support import Call, Story, Wait, story


def _story(messages: list[ModelMessage]) -> Story:
    prompt = next(
        part
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, UserPromptPart)
    )
    assert isinstance(prompt.content, str)
    return story(prompt.content)


async def _streamed(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
    played = _story(messages)
    for step in played.turn():
        if isinstance(step, Wait):
            await played.wait(step)
        elif isinstance(step, Call):
            yield {
                1: DeltaToolCall(name=step.tool, json_args="{}", tool_call_id=f"call-{step.tool}")
            }
        else:
            yield step


async def _whole(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    played = _story(messages)
    parts: list[TextPart | ToolCallPart] = []
    for step in played.turn():
        if isinstance(step, Wait):
            await played.wait(step)
        elif isinstance(step, Call):
            parts.append(ToolCallPart(step.tool, {}, tool_call_id=f"call-{step.tool}"))
        else:
            parts.append(TextPart(step))
    return ModelResponse(parts=parts)


def story_agent(session: str) -> Agent[None, str]:
    """An agent whose model plays the story of ``session`` (its prompt is the session's name)."""
    return Agent(FunctionModel(_whole, stream_function=_streamed), tools=[story(session).lookup])


def summary(messages: list[ModelMessage]) -> list[list[str]]:
    """Each message as its parts: ``text:<content>``, ``call:<tool>``, ``return:<tool>``, the
    user prompt ``prompt``."""
    shown: list[list[str]] = []
    for message in messages:
        parts: list[str] = []
        for part in message.parts:
            if isinstance(part, TextPart):
                parts.append(f"text:{part.content}")
            elif isinstance(part, ToolCallPart):
                parts.append(f"call:{part.tool_name}")
            elif isinstance(part, UserPromptPart):
                parts.append("prompt")
            else:
                parts.append(f"{part.part_kind}:{getattr(part, 'tool_name', '')}")
        shown.append(parts)
    return shown
