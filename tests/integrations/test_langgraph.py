"""LangGraph: a real StateGraph streamed on node A, stopped by a cancel sent to node B."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.pregel import Pregel

from cancel_bus import CancelBus, CancelMode, Outcome, RunHandle, RunStatus
from cancel_bus.integrations.langgraph import astream, render_chunk

from ..conftest import BusFactory
from ..helpers import WAIT, eventually
from .langgraph_support import State, Story

SESSION = ("chat", "u1", "s1")
BOTH = ["updates", "custom"]


class GraphRun:
    """Node A's side: the user's code, as the integration docs show it."""

    def __init__(
        self,
        bus: CancelBus,
        graph: Pregel[Any, Any, Any, Any],
        stream_mode: Any = BOTH,
        config: RunnableConfig | None = None,
        *,
        client_stalls: bool = False,
    ) -> None:
        self.client_stalls = client_stalls  # the user's code blocks once it has "Paris "
        self.handle: RunHandle | None = None
        self.chunks: list[Any] = []
        self.saw_paris = asyncio.Event()
        self.after_loop = False
        self.task = asyncio.create_task(self._body(bus, graph, stream_mode, config))

    async def _body(
        self,
        bus: CancelBus,
        graph: Pregel[Any, Any, Any, Any],
        stream_mode: Any,
        config: RunnableConfig | None,
    ) -> None:
        app, user, session = SESSION
        inputs: State = {"question": "capital?"}
        async with (
            bus.run(app_name=app, user_id=user, session_id=session) as run,
            astream(run, graph, inputs, config, stream_mode=stream_mode) as chunks,
        ):
            self.handle = run
            async for chunk in chunks:
                self.chunks.append(chunk)
                if render_chunk(chunk) == "Paris ":
                    self.saw_paris.set()
                    if self.client_stalls:
                        await asyncio.Event().wait()
            self.after_loop = True

    @property
    def run_id(self) -> str:
        assert self.handle is not None
        return self.handle.run_id

    async def delivered(self) -> None:
        """Until the cancel has reached this node's run (its local token)."""

        async def check() -> bool:
            return self.handle is not None and self.handle.cancel_requested is not None

        await eventually(check)


async def test_uncancelled_graph_succeeds_with_every_chunk_kept(make_bus: BusFactory) -> None:
    a = await make_bus()
    story = Story()
    story.draft_release.set()
    story.research_release.set()
    graph_run = GraphRun(a, story.graph())
    await asyncio.wait_for(graph_run.task, WAIT)

    assert graph_run.after_loop and story.answered
    info = await a.get_run(graph_run.run_id)
    assert info is not None and info.status is RunStatus.SUCCEEDED
    assert info.output == "".join(render_chunk(chunk) for chunk in graph_run.chunks)
    assert info.output.startswith("Paris is the capital.")
    assert '"answer": {"answer": "Paris."}' in info.output


@pytest.mark.parametrize("stream_mode", ["updates", BOTH], ids=["inline-node", "node-tasks"])
async def test_immediate_cancel_from_another_node_interrupts_the_node_in_flight(
    make_bus: BusFactory, stream_mode: Any
) -> None:
    a, b = await make_bus(), await make_bus()
    story = Story()
    story.draft_release.set()
    graph_run = GraphRun(a, story.graph(), stream_mode)
    await asyncio.wait_for(story.research_started.wait(), WAIT)

    result = await b.cancel_session(*SESSION, mode=CancelMode.IMMEDIATE, timeout=WAIT)

    assert result.outcome is Outcome.CANCELLED
    info = result.run
    assert info is not None and info.run_id == graph_run.run_id
    assert info.status is RunStatus.CANCELLED and info.end_reason == "cancelled"
    assert story.research_interrupted and not story.answered
    assert '"draft": {"draft": "Paris is the capital."}' in info.output  # the partial chunks
    await asyncio.wait_for(graph_run.task, WAIT)
    assert not graph_run.after_loop


async def test_immediate_cancel_landing_in_the_users_code_closes_the_graph(
    make_bus: BusFactory,
) -> None:
    a, b = await make_bus(), await make_bus()
    story = Story()
    graph_run = GraphRun(a, story.graph(), client_stalls=True)
    await asyncio.wait_for(graph_run.saw_paris.wait(), WAIT)

    result = await b.cancel(graph_run.run_id, mode=CancelMode.IMMEDIATE, timeout=WAIT)

    assert result.outcome is Outcome.CANCELLED
    assert result.run is not None and result.run.output == "Paris "
    assert story.draft_interrupted and not story.research_started.is_set()
    await asyncio.wait_for(graph_run.task, WAIT)


async def test_checkpoint_cancel_stops_at_the_next_chunk(
    make_bus: BusFactory,
) -> None:
    a, b = await make_bus(), await make_bus()
    story = Story()
    graph_run = GraphRun(a, story.graph())
    await asyncio.wait_for(graph_run.saw_paris.wait(), WAIT)
    cancel = asyncio.create_task(b.cancel(graph_run.run_id, timeout=WAIT))
    await graph_run.delivered()
    story.draft_release.set()
    result = await cancel

    assert result.outcome is Outcome.CANCELLED
    info = result.run
    assert info is not None and info.status is RunStatus.CANCELLED
    assert info.end_reason == "cancelled" and info.cancel_mode is CancelMode.CHECKPOINT
    assert info.output == "Paris is "  # stopped at the first chunk after the cancel
    assert [render_chunk(chunk) for chunk in graph_run.chunks] == ["Paris ", "is "]
    assert not story.research_started.is_set()
    await asyncio.wait_for(graph_run.task, WAIT)
    assert not graph_run.after_loop


async def test_after_turn_cancel_drains_after_the_superstep_and_can_resume(
    make_bus: BusFactory,
) -> None:
    a, b = await make_bus(), await make_bus()
    story = Story()
    story.draft_release.set()
    graph = story.graph(checkpointer=InMemorySaver())
    config: RunnableConfig = {"configurable": {"thread_id": "t1"}}
    graph_run = GraphRun(a, graph, config=config)
    await asyncio.wait_for(story.research_started.wait(), WAIT)
    cancel = asyncio.create_task(
        b.cancel(graph_run.run_id, mode=CancelMode.AFTER_TURN, timeout=WAIT)
    )
    await graph_run.delivered()
    assert not cancel.done()  # the superstep in progress (the tool call) is not cut short
    story.research_release.set()
    result = await cancel

    assert result.outcome is Outcome.CANCELLED
    info = result.run
    assert info is not None and info.status is RunStatus.CANCELLED
    assert info.end_reason == "cancelled"
    assert '"research": {"facts": "2.1M people"}' in info.output
    assert not story.research_interrupted and not story.answered
    await asyncio.wait_for(graph_run.task, WAIT)
    assert not graph_run.after_loop
    state = await graph.aget_state(config)
    assert state.next == ("answer",)  # drained at the superstep boundary: resumable
