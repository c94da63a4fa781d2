"""What the session-keyed adapters share (trpc-agent, google-adk): the bus key of a framework's
session, a bus run of that key that waits for the key's stopping run, and turn boundaries in an
ADK-style event stream (trpc-agent's events have ADK's shape)."""

from __future__ import annotations

import asyncio
import hashlib
import re
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

from cancel_bus import (
    ID_PATTERN,
    MAX_ID_LENGTH,
    CancelBus,
    CancelMode,
    MultitaskStrategy,
    RunHandle,
    SessionBusy,
)

from .. import _checks as check

_ID_RE = re.compile(ID_PATTERN)


@dataclass(frozen=True)
class Multitask:
    """An adapter's setting for a new run of a busy session (double texting): its strategy,
    and the mode an ``interrupt``/``rollback`` cancels the active run in."""

    strategy: MultitaskStrategy = MultitaskStrategy.REJECT
    interrupt_mode: CancelMode = CancelMode.CHECKPOINT

    @classmethod
    def checked(
        cls, strategy: MultitaskStrategy | str, interrupt_mode: CancelMode | str
    ) -> Multitask:
        """From an ``install``'s arguments (:class:`~cancel_bus.InvalidArgument` if bad)."""
        return cls(check.strategy(strategy), check.mode(interrupt_mode))


def running_loop(what: str) -> asyncio.AbstractEventLoop:
    """The running loop, which an adapter's ``what()`` must be called on (the bus's)."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        raise RuntimeError(f"{what}() must be called on the event loop of the bus") from None


def bus_id(value: str) -> str:
    """``value`` as a bus id: as is if it is a valid one, else ``sha256=`` and its digest."""
    if len(value) <= MAX_ID_LENGTH and _ID_RE.fullmatch(value):
        return value
    return "sha256=" + hashlib.sha256(value.encode()).hexdigest()


def bus_session(app_name: str, user_id: str, session_id: str) -> tuple[str, str, str]:
    """The bus session key of a framework's session (each part through :func:`bus_id`)."""
    return (bus_id(app_name), bus_id(user_id), bus_id(session_id))


async def enter_session_run(
    bus: CancelBus,
    session: tuple[str, str, str],
    *,
    busy_timeout: float,
    metadata: dict[str, Any],
    parent: str | None = None,
    multitask: Multitask = Multitask(),
) -> tuple[AbstractAsyncContextManager[RunHandle], RunHandle]:
    """Enter a bus run of ``session``: its scope (the caller exits it) and handle. What it does
    to the key's active run is ``multitask`` (double texting: reject, enqueue, interrupt,
    rollback, with ``busy_timeout`` as the interrupt's timeout); a rejected start waits for a
    run of the key that is stopping, up to ``busy_timeout``, and raises ``SessionBusy`` for one
    that is not."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + busy_timeout
    app_name, user_id, session_id = session
    while True:
        scope = bus.run(
            app_name=app_name,
            user_id=user_id,
            session_id=session_id,
            metadata=metadata,
            parent=parent,
            multitask_strategy=multitask.strategy,
            interrupt_mode=multitask.interrupt_mode,
            interrupt_timeout=busy_timeout,
        )
        try:
            return scope, await scope.__aenter__()
        except SessionBusy as busy:
            active = await bus.get_run(busy.active_run_id)
            remaining = deadline - loop.time()
            if active is not None and active.is_active:
                if not active.stopping or remaining <= 0:
                    raise
                await bus.wait(active.run_id, timeout=remaining)
            elif remaining <= 0:
                raise


def event_text(event: Any) -> str:
    """The text parts of an ADK-style event, joined."""
    parts = event.content.parts if event.content is not None else None
    return "".join(part.text for part in parts or [] if part.text)


@dataclass(eq=False, kw_only=True)
class Turns:
    """Turn boundaries in an ADK-style event stream: a whole event that leaves no function call
    unanswered ends a turn (a final answer, or the results of every call the model asked for);
    the stream's start is one. Also the text streamed since the last whole event."""

    at_boundary: bool = True
    pending_calls: set[str] = field(default_factory=set)
    partial: list[str] = field(default_factory=list)
    last_event: Any = None

    def track(self, event: Any) -> None:
        """Follow one event of the stream: a partial event's text is kept and the turn goes on; a
        whole event drops that text and, if it has content, ends the turn when no function call
        asked for is left unanswered."""
        self.last_event = event
        if event.partial:
            self.partial.append(event_text(event))
            self.at_boundary = False
            return
        self.partial.clear()
        if event.content is None:
            return
        self.pending_calls.update(call.id for call in event.get_function_calls())
        self.pending_calls.difference_update(r.id for r in event.get_function_responses())
        self.at_boundary = not self.pending_calls
