"""openai-agents: a streamed run on node A, stopped by a cancel sent to node B (a scripted model,
no network), through the SDK's own ``RunResultStreaming.cancel(mode=...)``."""

from __future__ import annotations

import asyncio

import pytest
from agents import (
    Agent,
    RawResponsesStreamEvent,
    RunConfig,
    Runner,
    RunResultStreaming,
)
from openai.types.responses import (
    ResponseTextDeltaEvent,
)

from cancel_bus import CancelBus, CancelMode, Outcome, RunHandle, RunStatus
from cancel_bus.integrations.openai_agents import stream_events

from ..conftest import BusFactory
from ..helpers import WAIT, eventually
from .openai_support import ScriptedModel, Tool, Turn

SESSION = ("chat", "u1", "s1")


class AgentRun:
    """Node A's side: the user's code, as the integration docs show it."""

    def __init__(
        self,
        bus: CancelBus,
        model: ScriptedModel,
        tool: Tool,
        *,
        expected_text: str = "",
        client_stalls: bool = False,
    ) -> None:
        self.agent = Agent(name="assistant", model=model, tools=[tool.as_tool()])
        self.bus = bus
        self.handle: RunHandle | None = None
        self.text = ""
        self.expected_text = expected_text
        self.saw_text = asyncio.Event()  # the user's code has received ``expected_text``
        self.client_stalls = client_stalls  # ... and then blocks (a slow client, say)
        self.after_loop = False
        self._result: RunResultStreaming | None = None
        self.task = asyncio.create_task(self._body())

    async def _body(self) -> None:
        app, user, session = SESSION
        async with (
            self.bus.run(app_name=app, user_id=user, session_id=session) as run,
            stream_events(run, self._start()) as events,
        ):
            self.handle = run
            async for event in events:
                if isinstance(event, RawResponsesStreamEvent) and isinstance(
                    event.data, ResponseTextDeltaEvent
                ):
                    self.text += event.data.delta
                    if self.text == self.expected_text:
                        self.saw_text.set()
                        if self.client_stalls:
                            await asyncio.Event().wait()
            self.after_loop = True

    def _start(self) -> RunResultStreaming:
        self._result = Runner.run_streamed(
            self.agent, "what is the answer?", run_config=RunConfig(tracing_disabled=True)
        )
        return self._result

    @property
    def result(self) -> RunResultStreaming:
        assert self._result is not None
        return self._result

    @property
    def run_id(self) -> str:
        assert self.handle is not None
        return self.handle.run_id

    async def delivered(self) -> None:
        """Until the cancel has reached this node's run (its local token)."""

        async def check() -> bool:
            return self.handle is not None and self.handle.cancel_requested is not None

        await eventually(check)


def two_turns() -> tuple[ScriptedModel, Tool]:
    return ScriptedModel(Turn(["Let me ", "look. "], tool="lookup"), Turn(["It is 42."])), Tool()


async def test_uncancelled_run_succeeds_with_its_whole_output(make_bus: BusFactory) -> None:
    a = await make_bus()
    model, tool = two_turns()
    tool.release.set()
    agent_run = AgentRun(a, model, tool)
    await asyncio.wait_for(agent_run.task, WAIT)

    assert agent_run.after_loop and agent_run.result.final_output == "It is 42."
    info = await a.get_run(agent_run.run_id)
    assert info is not None and info.status is RunStatus.SUCCEEDED
    assert info.output == "Let me look. It is 42."
    assert info.phase == "model"


async def test_after_turn_cancel_from_another_node_stops_after_the_turn(
    make_bus: BusFactory,
) -> None:
    mode = CancelMode.AFTER_TURN
    a, b = await make_bus(), await make_bus()
    model, tool = two_turns()
    agent_run = AgentRun(a, model, tool)
    await asyncio.wait_for(tool.started.wait(), WAIT)

    async def in_tool() -> bool:
        info = await b.get_run(agent_run.run_id)
        return info is not None and info.phase == "tool:lookup"

    await eventually(in_tool)  # ops on node B see where the run is
    cancel = asyncio.create_task(b.cancel_session(*SESSION, mode=mode, timeout=WAIT))
    await agent_run.delivered()
    assert not cancel.done()  # the turn in progress (its tool call) is not cut short
    tool.release.set()
    result = await cancel
    await asyncio.wait_for(agent_run.task, WAIT)

    assert result.outcome is Outcome.CANCELLED
    info = result.run
    assert info is not None and info.run_id == agent_run.run_id
    assert info.status is RunStatus.CANCELLED and info.end_reason == "cancelled"
    assert info.owner == a.node_id and info.cancel_mode is mode
    assert info.output == "Let me look. "
    assert tool.finished and model.calls == 1  # the tool completed; no second turn started
    assert agent_run.result.is_complete and agent_run.result.final_output is None
    assert not agent_run.after_loop  # RunCancelled left the loop; the bus scope suppressed it


async def test_immediate_cancel_from_another_node_interrupts_the_model_stream(
    make_bus: BusFactory,
) -> None:
    a, b = await make_bus(), await make_bus()
    model = ScriptedModel(Turn(["Hel", "lo"], hang=True), cleanup_seconds=0.05)
    agent_run = AgentRun(a, model, Tool(), expected_text="Hello")
    await asyncio.wait_for(agent_run.saw_text.wait(), WAIT)
    await asyncio.wait_for(model.hanging.wait(), WAIT)

    result = await b.cancel(agent_run.run_id, mode=CancelMode.IMMEDIATE, timeout=WAIT)

    assert result.outcome is Outcome.CANCELLED
    info = result.run
    assert info is not None and info.status is RunStatus.CANCELLED
    assert info.end_reason == "cancelled" and info.output == "Hello"
    assert model.interrupted.is_set()  # the in-flight await was cancelled before the finish
    await asyncio.wait_for(agent_run.task, WAIT)
    assert agent_run.result.is_complete and not agent_run.after_loop


async def test_immediate_cancel_landing_in_the_users_code_still_stops_the_agent(
    make_bus: BusFactory,
) -> None:
    a, b = await make_bus(), await make_bus()
    model = ScriptedModel(Turn(["Hel", "lo"], hang=True))
    agent_run = AgentRun(a, model, Tool(), expected_text="Hello", client_stalls=True)
    await asyncio.wait_for(agent_run.saw_text.wait(), WAIT)
    await asyncio.wait_for(model.hanging.wait(), WAIT)

    result = await b.cancel(agent_run.run_id, mode=CancelMode.IMMEDIATE, timeout=WAIT)

    assert result.outcome is Outcome.CANCELLED
    assert result.run is not None and result.run.output == "Hello"
    assert model.interrupted.is_set() and agent_run.result.is_complete
    await asyncio.wait_for(agent_run.task, WAIT)


async def test_immediate_escalation_interrupts_a_tool_call_in_flight(
    make_bus: BusFactory,
) -> None:
    a, b = await make_bus(), await make_bus()
    model, tool = two_turns()
    agent_run = AgentRun(a, model, tool)
    await asyncio.wait_for(tool.started.wait(), WAIT)
    first = await b.cancel(agent_run.run_id, mode=CancelMode.AFTER_TURN, wait=False)
    assert first.outcome is Outcome.STOPPING
    await agent_run.delivered()

    result = await b.cancel(agent_run.run_id, mode=CancelMode.IMMEDIATE, timeout=WAIT)

    assert result.outcome is Outcome.CANCELLED
    assert result.run is not None and result.run.cancel_mode is CancelMode.IMMEDIATE
    assert result.run.output == "Let me look. "
    assert tool.interrupted and not tool.finished and model.calls == 1
    await asyncio.wait_for(agent_run.task, WAIT)


async def test_a_failing_model_fails_the_run_and_raises(make_bus: BusFactory) -> None:
    a = await make_bus()
    model = ScriptedModel()  # no turn scripted: the first model call raises IndexError
    agent_run = AgentRun(a, model, Tool())
    with pytest.raises(IndexError):
        await asyncio.wait_for(agent_run.task, WAIT)
    assert agent_run.handle is not None
    info = await a.get_run(agent_run.run_id)
    assert info is not None and info.status is RunStatus.FAILED
    assert info.error is not None and info.error.startswith("IndexError")
