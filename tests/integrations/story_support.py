"""The scripted agent the agno, google-adk and pydantic-ai tests play, each with the framework's
own model class: turn 1 streams "Let me ", waits for the gate ``model:<session>``, streams
"look. ", waits for ``tool:<session>`` and calls the tool ``lookup``; turn 2 answers "It is 42.".
A session whose name starts with ``gated-`` first waits for ``start:<session>``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from ..helpers import WAIT
from .replica_routes import Gates

APP = "chat"  # the app and user of the runs the replicas start (bus runs of a session)
USER = "u1"
GATED = "gated-"
TOOL = "lookup"
ANSWER = "It is 42."


@dataclass(frozen=True)
class Wait:
    """Wait for the gate ``<name>:<session>``."""

    name: str


@dataclass(frozen=True)
class Call:
    """Ask for the tool call ``tool``."""

    tool: str = TOOL


Step = str | Wait | Call


@dataclass
class Story:
    """One session's script, played by a framework's model; what it did so far."""

    session: str
    gates: Callable[[str], asyncio.Event]
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.get_running_loop)
    model_calls: int = 0
    tool_ran: bool = False

    def turn(self) -> Iterator[Step]:
        """The steps of the model's next call (its first: turn 1; any later one: turn 2)."""
        self.model_calls += 1
        if self.model_calls > 1:
            yield ANSWER
            return
        if self.session.startswith(GATED):
            yield Wait("start")
        yield from ("Let me ", Wait("model"), "look. ", Wait("tool"), Call())

    async def wait(self, step: Wait) -> None:
        await asyncio.wait_for(self.gates(f"{step.name}:{self.session}").wait(), WAIT)

    def wait_sync(self, step: Wait) -> None:
        """``wait`` for a model running in a thread (agno's synchronous runs)."""
        asyncio.run_coroutine_threadsafe(self.wait(step), self.loop).result(WAIT + 1)

    def lookup(self) -> str:
        """Look the answer up."""
        self.tool_ran = True
        return "42"


GATES = Gates()  # the gates of the replica process (its gate routes open them)
STORIES: dict[str, Story] = {}


def story(session: str) -> Story:
    """The story of ``session`` in this process (its model calls, whether the tool ran)."""
    found = STORIES.get(session)
    if found is None:
        found = STORIES[session] = Story(session, GATES)
    return found


# What a run stopped while its model waits at ``model`` (cancel delivered there, then the gates
# opened as the mode needs) leaves: (the text streamed, whether the tool ran).
ENDS = {
    "checkpoint": ("Let me look. ", False),  # at the next event: the turn cut short
    "immediate": ("Let me ", False),  # the waiting model stream interrupted
    "after_turn": ("Let me look. ", True),  # the turn completes, tool call included
}


def gates_to_open(session: str, mode: str) -> list[str]:
    """The gates to open once the cancel was delivered (immediate interrupts the wait)."""
    opened = {"checkpoint": ["model"], "immediate": [], "after_turn": ["model", "tool"]}[mode]
    return [f"{gate}:{session}" for gate in opened]
