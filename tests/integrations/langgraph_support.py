"""A LangGraph graph for the tests: draft (streams tokens) -> research (a tool call) -> answer."""

from __future__ import annotations

import asyncio
from typing import Any, TypedDict

from langgraph.config import get_stream_writer
from langgraph.graph import END, START, StateGraph
from langgraph.pregel import Pregel


class State(TypedDict, total=False):
    question: str
    draft: str
    facts: str
    answer: str


class Story:
    """draft (streams tokens) -> research (a tool call, held by the test) -> answer."""

    def __init__(self, start: asyncio.Event | None = None) -> None:
        self.start = start  # what the draft waits for before its first token, if given
        self.draft_release = asyncio.Event()
        self.draft_interrupted = False
        self.research_started = asyncio.Event()
        self.research_release = asyncio.Event()
        self.research_interrupted = False
        self.answered = False

    def graph(self, **compile_options: Any) -> Pregel[Any, Any, Any, Any]:
        builder = StateGraph(State)
        builder.add_node("draft", self.draft)
        builder.add_node("research", self.research)
        builder.add_node("answer", self.answer)
        builder.add_edge(START, "draft")
        builder.add_edge("draft", "research")
        builder.add_edge("research", "answer")
        builder.add_edge("answer", END)
        return builder.compile(**compile_options)

    async def draft(self, state: State) -> State:
        write = get_stream_writer()
        if self.start is not None:
            await self.start.wait()
        write("Paris ")
        try:
            await self.draft_release.wait()
        except asyncio.CancelledError:
            self.draft_interrupted = True
            raise
        write("is ")
        write("the capital.")
        return {"draft": "Paris is the capital."}

    async def research(self, state: State) -> State:
        self.research_started.set()
        try:
            await self.research_release.wait()
        except asyncio.CancelledError:
            self.research_interrupted = True
            raise
        return {"facts": "2.1M people"}

    async def answer(self, state: State) -> State:
        self.answered = True
        return {"answer": "Paris."}
