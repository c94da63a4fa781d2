"""trpc-agent: one run of a session key on this node (:class:`LocalRun`), as the manager of
``trpc_agent.py`` keeps it: its bus scope, the cancel Events handed out for it, its checks, and the
end of a run an ``immediate`` cancel interrupted (saved as trpc-agent saves a cancelled one)."""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

from trpc_agent_sdk.cancel import (  # type: ignore[import-untyped]
    handle_cancellation_session_cleanup,
)
from trpc_agent_sdk.events import AgentCancelledEvent, Event  # type: ignore[import-untyped]

from cancel_bus import CancelMode, CancelRequest, RunCancelled, RunHandle

from ._sessions import Turns


@dataclass(eq=False)
class LocalRun(Turns):
    """One run of a session key on this node: its bus scope, the Events handed out for it, and
    what its event stream showed (:class:`Turns`: turn boundaries, an interrupted run's partial
    text)."""

    key: Any  # SessionKey
    scope: AbstractAsyncContextManager[RunHandle]
    handle: RunHandle
    cancel_event: asyncio.Event = field(default_factory=asyncio.Event)
    cleanup_events: list[asyncio.Event] = field(default_factory=list)
    observed: RunCancelled | None = None
    watching: bool = False
    finished: bool = False
    interrupted: bool = False  # an immediate cancel interrupted it (its CancelledError was ours)

    def poll(self) -> bool:
        """The hot path: True once a cancel was delivered (attribute tests on the token);
        ``after_turn`` only at a turn boundary."""
        try:
            self.handle.checkpoint()
            if self.at_boundary:
                self.at_boundary = False
                self.handle.turn_boundary()
        except RunCancelled as exc:
            self.observed = exc
            self.cancel_event.set()
            return True
        return False

    def ended_cancelled(self) -> None:
        """trpc-agent ended the run as a cancelled one (``AgentCancelledEvent``), maybe without a
        checkpoint of ours: stopped through its cancel Event (its remote A2A agent). A cancel of
        ours that reached it is then what it observed."""
        if self.observed is None and self.handle.cancel_requested is not None:
            try:
                self.handle.turn_boundary()
            except RunCancelled as exc:
                self.observed = exc

    def event(self) -> asyncio.Event:
        """The Event set when a cancel (other than ``after_turn``) is delivered."""
        if not self.watching:
            self.watching = True
            self.handle.add_cancel_callback(self._delivered)
        return self.cancel_event

    def _delivered(self, request: CancelRequest) -> None:
        if request.mode is not CancelMode.AFTER_TURN:
            self.cancel_event.set()

    async def end_interrupted(self, runner: Any) -> Any:
        """Save the partial text with trpc-agent's cancel marker, as trpc-agent does for a run
        stopped at a checkpoint; the ``AgentCancelledEvent`` to end the stream with."""
        last = self.last_event
        invocation_id = last.invocation_id if last is not None else Event.new_id()
        author = last.author if last is not None else runner.agent.name
        branch = last.branch if last is not None else None
        sessions = runner.session_service
        session = await sessions.get_session(
            app_name=self.key.app_name, user_id=self.key.user_id, session_id=self.key.session_id
        )
        if session is not None:
            await handle_cancellation_session_cleanup(
                session=session,
                session_service=sessions,
                invocation_id=invocation_id,
                agent_name=author,
                branch=branch,
                temp_text="".join(self.partial),
            )
            await sessions.update_session(session=session)
        return AgentCancelledEvent(
            invocation_id=invocation_id,
            author=author,
            reason=f"Run for session {self.key.session_id} was cancelled (immediate)",
            branch=branch,
        )
