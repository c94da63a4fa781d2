"""agno models that play the story (story_support.py), no network: agno ships no test model; a
``Model`` subclass needs only its six abstract methods."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

from agno.agent import Agent
from agno.db.in_memory import InMemoryDb
from agno.models.base import Model
from agno.models.message import Message
from agno.models.response import ModelResponse
from agno.team import Team

from .story_support import Call, Story, Wait

AGENT_ID = "story"  # the agent every replica's AgentOS knows
MEMBER = "writer"


def _call(tool: str, arguments: dict[str, Any] | None = None) -> ModelResponse:
    function = {"name": tool, "arguments": json.dumps(arguments or {})}
    return ModelResponse(
        role="assistant",
        tool_calls=[{"id": f"call-{tool}", "type": "function", "function": function}],
    )


@dataclass
class StoryModel(Model):
    """Streams the story's steps; ``invoke*`` (non-streamed runs) give a turn's text at once."""

    id: str = "story"
    name: str = "Story"
    provider: str = "test"
    story: Story | None = None

    def _steps(self) -> Iterator[Any]:
        assert self.story is not None
        return self.story.turn()

    def invoke(self, *args: Any, **kwargs: Any) -> ModelResponse:
        return ModelResponse(
            role="assistant", content="".join(s for s in self._steps() if isinstance(s, str))
        )

    async def ainvoke(self, *args: Any, **kwargs: Any) -> ModelResponse:
        return self.invoke()

    def invoke_stream(self, *args: Any, **kwargs: Any) -> Iterator[ModelResponse]:
        assert self.story is not None
        for step in self._steps():
            if isinstance(step, Wait):
                self.story.wait_sync(step)
            elif isinstance(step, Call):
                yield _call(step.tool)
            else:
                yield ModelResponse(role="assistant", content=step)

    async def ainvoke_stream(self, *args: Any, **kwargs: Any) -> AsyncIterator[ModelResponse]:
        assert self.story is not None
        for step in self._steps():
            if isinstance(step, Wait):
                await self.story.wait(step)
            elif isinstance(step, Call):
                yield _call(step.tool)
            else:
                yield ModelResponse(role="assistant", content=step)

    def _parse_provider_response(self, response: Any, **kwargs: Any) -> ModelResponse:
        return response  # type: ignore[no-any-return]

    def _parse_provider_response_delta(self, response: Any) -> ModelResponse:
        return response  # type: ignore[no-any-return]


@dataclass
class LeaderModel(StoryModel):
    """A team leader: delegates the task to its member, then answers with what it got."""

    id: str = "leader"
    delegated: list[bool] = field(default_factory=list)

    async def ainvoke_stream(self, *args: Any, **kwargs: Any) -> AsyncIterator[ModelResponse]:
        messages: list[Message] = kwargs.get("messages") or []
        if not any(message.role == "tool" for message in messages):
            self.delegated.append(True)
            yield _call("delegate_task_to_member", {"member_id": MEMBER, "task": "look it up"})
        else:
            yield ModelResponse(role="assistant", content="The team says 42.")


def story_agent(story: Story, db: InMemoryDb, agent_id: str = AGENT_ID) -> Agent:
    return Agent(
        id=agent_id,
        name=agent_id,
        model=StoryModel(story=story),
        tools=[story.lookup],
        db=db,
        telemetry=False,
    )


def story_team(story: Story, db: InMemoryDb) -> Team:
    """A team whose leader delegates to a member that plays the story."""
    writer = story_agent(story, db, agent_id=MEMBER)
    return Team(
        id="team",
        name="team",
        members=[writer],
        model=LeaderModel(),
        db=db,
        telemetry=False,
    )
