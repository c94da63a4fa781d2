"""An ADK model that plays the story (story_support.py), no network, and the agents of the ADK
apps the replicas serve with ``get_fast_api_app`` (``adk_agents/``): ``story`` plays it; ``boss``
asks its sub-agent ``helper`` (an ``AgentTool``: a nested Runner), which plays it. The story is
the one named by the first user message's text (the tests send the session's name)."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from pathlib import Path

from google.adk.agents import LlmAgent
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.tools import ToolContext
from google.adk.tools.agent_tool import AgentTool
from google.genai import types

from .story_support import Call, Story, Wait, story

AGENTS_DIR = Path(__file__).resolve().parent / "adk_agents"
HELPER = "helper"


def _story(contents: list[types.Content]) -> Story:
    first = next(c for c in contents if c.role == "user")
    return story("".join(part.text or "" for part in first.parts or []))


def _text(text: str) -> types.Part:
    return types.Part(text=text)


class StoryLlm(BaseLlm):
    """Streams the story's chunks as partial responses (``stream``), then the turn whole."""

    model: str = "story"

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        played = _story(llm_request.contents)
        text, parts = "", list[types.Part]()
        for step in played.turn():
            if isinstance(step, Wait):
                await played.wait(step)
            elif isinstance(step, Call):
                call = types.FunctionCall(id=f"call-{step.tool}", name=step.tool, args={})
                parts.append(types.Part(function_call=call))
            else:
                text += step
                if stream:
                    content = types.Content(role="model", parts=[_text(step)])
                    yield LlmResponse(content=content, partial=True)
        whole = types.Content(role="model", parts=[*([_text(text)] if text else []), *parts])
        yield LlmResponse(content=whole, turn_complete=True)


class BossLlm(BaseLlm):
    """Asks the helper (its ``AgentTool``), then answers with what it said."""

    model: str = "boss"

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        answered = any(
            part.function_response for c in llm_request.contents for part in c.parts or []
        )
        if answered:
            content = types.Content(role="model", parts=[_text("The helper says 42.")])
        else:
            request = _story(llm_request.contents).session
            call = types.FunctionCall(id="call-helper", name=HELPER, args={"request": request})
            content = types.Content(role="model", parts=[types.Part(function_call=call)])
        yield LlmResponse(content=content, turn_complete=True)


def lookup(tool_context: ToolContext) -> str:
    """Look the answer up."""
    content = tool_context.user_content
    return _story([content] if content is not None else []).lookup()


def story_agent(name: str = "story") -> LlmAgent:
    return LlmAgent(name=name, model=StoryLlm(), tools=[lookup])


def boss_agent() -> LlmAgent:
    return LlmAgent(name="boss", model=BossLlm(), tools=[AgentTool(agent=story_agent(HELPER))])
