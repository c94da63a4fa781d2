"""The scripted trpc-agent agent (no LLM) and the slow session store that the replica processes
and the in-process tests share; for the latter, a node on its own event loop in a thread."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import AsyncGenerator, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import Field
from trpc_agent_sdk.agents import BaseAgent, LlmAgent
from trpc_agent_sdk.configs import RunConfig
from trpc_agent_sdk.context import InvocationContext
from trpc_agent_sdk.events import Event
from trpc_agent_sdk.models import LLMModel, LlmRequest, LlmResponse
from trpc_agent_sdk.runners import Runner
from trpc_agent_sdk.sessions import InMemorySessionService, Session
from trpc_agent_sdk.tools import AgentTool, BaseTool
from trpc_agent_sdk.types import Content, FunctionCall, FunctionResponse, Part

from cancel_bus import CancelBus
from cancel_bus.integrations import trpc_agent

from ..helpers import WAIT

T = TypeVar("T")
APP = "chat"
PACE = 0.005  # the agent's streaming pace (work, never a synchronisation)


class StreamingAgent(BaseAgent):
    """Streams without an LLM; what it does depends on the user's message:

    * ``stream``: a checkpoint (``ctx.raise_if_cancelled()``) before every chunk, up to 2000;
    * ``short``: three checkpointed chunks, then a final answer;
    * ``hold``: three chunks, no checkpoint at all, waits for its session's gate, then a final
      answer;
    * ``turns``: two turns as an LLM agent takes them. Turn 1 streams "Let me ", stalls until
      its session's gate opens (the model thinking), streams "look. ", asks for a tool call and
      gets its result; turn 2 answers "It is 42.". A checkpoint before every chunk and after
      every complete event, as trpc-agent's LlmAgent has them.
    """

    gates: dict[str, asyncio.Event] = Field(default_factory=dict)

    def gate(self, session_id: str) -> asyncio.Event:
        """What a ``hold`` or ``turns`` run of the session waits for."""
        return self.gates.setdefault(session_id, asyncio.Event())

    async def _run_async_impl(self, ctx: InvocationContext) -> AsyncGenerator[Event, None]:
        command = ctx.user_content.parts[0].text
        if command == "turns":
            async for event in self._turns(ctx):
                yield event
            return
        chunks = 2000 if command == "stream" else 3
        for i in range(chunks):
            if command != "hold":
                await ctx.raise_if_cancelled()
            yield self._event(ctx, Part.from_text(text=f"t{i} "), partial=True)
            await asyncio.sleep(PACE)
        if command == "hold":
            await asyncio.wait_for(self.gate(ctx.session.id).wait(), WAIT)
        yield self._event(ctx, Part.from_text(text="done"), partial=False)

    async def _turns(self, ctx: InvocationContext) -> AsyncGenerator[Event, None]:
        await ctx.raise_if_cancelled()
        yield self._event(ctx, Part.from_text(text="Let me "), partial=True)
        await asyncio.wait_for(self.gate(ctx.session.id).wait(), WAIT)
        await ctx.raise_if_cancelled()
        yield self._event(ctx, Part.from_text(text="look. "), partial=True)
        await ctx.raise_if_cancelled()
        call = FunctionCall(id="call-1", name="lookup", args={})
        text = Part.from_text(text="Let me look. ")
        yield self._event(ctx, text, Part(function_call=call), partial=False)
        await ctx.raise_if_cancelled()
        result = FunctionResponse(id="call-1", name="lookup", response={"result": "42"})
        yield self._event(ctx, Part(function_response=result), partial=False)
        await ctx.raise_if_cancelled()
        yield self._event(ctx, Part.from_text(text="It is 42."), partial=True)
        await ctx.raise_if_cancelled()
        yield self._event(ctx, Part.from_text(text="It is 42."), partial=False)

    def _event(self, ctx: InvocationContext, *parts: Part, partial: bool) -> Event:
        content = Content(role="model", parts=list(parts))
        return Event(
            invocation_id=ctx.invocation_id, author=self.name, content=content, partial=partial
        )


class ScriptedModel(LLMModel):
    """A model without an LLM for :func:`boss`: asked ``"<tool> <request>"``, it calls the tool
    ``<tool>`` with ``{"request": <request>}``; given the tool's answer, it says ``done``."""

    @classmethod
    def supported_models(cls) -> list[str]:
        return [r"scripted"]

    async def _generate_async_impl(
        self, request: LlmRequest, stream: bool = False, ctx: InvocationContext | None = None
    ) -> AsyncGenerator[LlmResponse, None]:
        last = request.contents[-1]
        if any(part.function_response for part in last.parts):
            yield LlmResponse(content=Content(role="model", parts=[Part.from_text(text="done")]))
            return
        tool, argument = (last.parts[0].text or "").split(" ", 1)
        call = FunctionCall(id="call-1", name=tool, args={"request": argument})
        yield LlmResponse(content=Content(role="model", parts=[Part(function_call=call)]))


BOSS = "boss"  # the app of the boss's runs


def boss(*tools: BaseTool) -> LlmAgent:
    """An LLM agent (scripted: :class:`ScriptedModel`) that calls the tool its message names:
    ``helper stream`` runs the sub-agent ``helper`` (a :class:`StreamingAgent` behind trpc-agent's
    ``AgentTool``: a nested Runner, a run of its own), and ``tools`` are offered as well."""
    helper = AgentTool(agent=StreamingAgent(name="helper", description="streams chunks"))
    return LlmAgent(name=BOSS, model=ScriptedModel("scripted"), tools=[helper, *tools])


GATED = "gated-"  # a session whose lookup waits for the gate "start:<session>" (a slow store)


class GatedSessionService(InMemorySessionService):
    """Sessions in memory; the lookup of a ``gated-`` session waits for its start gate, which
    holds a run in the window between ``run_async`` and its registration."""

    def __init__(self, agent: StreamingAgent) -> None:
        super().__init__()
        self._agent = agent

    async def get_session(self, **kwargs: Any) -> Session | None:
        session_id: str = kwargs["session_id"]
        if session_id.startswith(GATED):
            await asyncio.wait_for(self._agent.gate(f"start:{session_id}").wait(), WAIT)
        session: Session | None = await super().get_session(**kwargs)
        return session


@dataclass
class TrpcNode:
    """One replica: a bus installed for trpc-agent on its loop, and a Runner of the agent."""

    bus: CancelBus
    runner: Runner
    agent: StreamingAgent

    @classmethod
    async def start(cls, redis_url: str, namespace: str) -> TrpcNode:
        bus = CancelBus(redis_url, namespace=namespace, lease_ttl=3.0)
        await bus.start()
        trpc_agent.install(bus)
        agent = StreamingAgent(name="streamer")
        runner = Runner(app_name=APP, agent=agent, session_service=InMemorySessionService())
        return cls(bus, runner, agent)

    async def stop(self) -> None:
        trpc_agent.uninstall()
        await self.runner.close()
        await self.bus.close(cancel_timeout=2.0)

    async def run(
        self, user_id: str, session_id: str, command: str, started: concurrent.futures.Future[None]
    ) -> list[Event]:
        """Run the agent to its end; ``started`` resolves once three events have streamed."""
        events: list[Event] = []
        async for event in self.runner.run_async(
            user_id=user_id,
            session_id=session_id,
            new_message=Content(role="user", parts=[Part.from_text(text=command)]),
            run_config=RunConfig(streaming=True),
        ):
            events.append(event)
            if len(events) == 3:
                started.set_result(None)
        return events


class LoopThread:
    """An event loop running in its own thread: another node's loop, as in another process."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    async def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return await asyncio.wait_for(asyncio.wrap_future(self.submit(coro)), WAIT)

    async def close(self) -> None:
        """Cancel what is left on the loop (e.g. a library's watcher task), then stop it."""
        await self.call(_cancel_others())
        self.loop.call_soon_threadsafe(self.loop.stop)
        await asyncio.to_thread(self._thread.join, WAIT)
        self.loop.close()


async def _cancel_others() -> None:
    others = asyncio.all_tasks() - {asyncio.current_task()}
    for task in others:
        task.cancel()
    await asyncio.gather(*others, return_exceptions=True)


async def resolved(future: concurrent.futures.Future[T]) -> T:
    """Await a future of another loop, bounded."""
    return await asyncio.wait_for(asyncio.wrap_future(future), WAIT)
