"""The interfaces the rooms know each other by. The node (``_node.py``) builds every room and
hands each the others it talks to as one of these protocols: no room imports another, so the
rooms stand side by side on one floor, and what one asks of another is written here, once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from ._protocol import CancelOrder
from ._run_state import RunState
from ._types import CancelRequest, CancelResult, StopCause


@dataclass(frozen=True, slots=True)
class Identity:
    """This node as Redis knows it: its id and its incarnation (``epoch``, its fencing token;
    ``''`` until registered). A value: replaced whole when the node rejoins, never changed."""

    node_id: str
    epoch: str = ""


class Delivery(Enum):
    """What a cancel did to a run of this node."""

    DELIVERED = "delivered"  # its token is set (or a stronger mode escalated it)
    UNCHANGED = "unchanged"  # it had it already
    EARLY = "early"  # the run is not here (yet): kept, applied if it starts here soon
    MISADDRESSED = "misaddressed"  # a session cancel for another session's run


Write = Callable[[], Awaitable[None]]  # a terminal write, retried until accepted or fenced


class Identified(Protocol):
    """Who this node is, and the server clock its lease keeps (``Lease``)."""

    @property
    def identity(self) -> Identity: ...

    @property
    def node_id(self) -> str: ...

    @property
    def patience(self) -> float:
        """How long a call to Redis is waited for before it counts as silence."""

    @property
    def may_run(self) -> bool:
        """Redis has not said the lease is gone, and the node has not stopped its runs for
        want of a renewal (its fence)."""

    def clock(self) -> float: ...


class LeaseControl(Identified, Protocol):
    """What recovery does with the lease: register this node again (``Lease``)."""

    @property
    def epoch(self) -> str: ...

    @property
    def lease_ttl(self) -> float: ...

    valid: bool  # Redis has not said this incarnation's lease is gone

    async def register(self, node_id: str, restore: bool = False) -> None: ...


class Owner(Protocol):
    """This node's live runs (``LocalRuns``)."""

    def get(self, run_id: str) -> RunState | None: ...

    def states(self) -> list[RunState]: ...

    def deliver(
        self, run_id: str, request: CancelRequest, target: str | None = None
    ) -> Delivery: ...

    def stop_all(self, cause: StopCause) -> None: ...

    def agrees_with(self, recorded: int) -> bool: ...

    def __contains__(self, run_id: object) -> bool: ...


class Channel(Protocol):
    """This node's subscription to its channel (``Subscription``)."""

    async def subscribe(self, timeout: float) -> None: ...


class Sweeper(Protocol):
    """What re-reads the cancels and ends a lost message may have carried (``Sweep``)."""

    async def sweep(self) -> None: ...


class SelfProbe(Protocol):
    """The probe of this node's own channel (``ChannelProbe``)."""

    @property
    def probe_back(self) -> tuple[float, float] | None: ...


class Keeper(Protocol):
    """What keeps the cancels this node had recorded, to record them again if Redis loses them
    (``Recovery``)."""

    def accepted(self, run_id: str, request: CancelRequest) -> None: ...


class Deferred(Protocol):
    """Terminal writes Redis did not take yet (``Outbox``)."""

    def add(self, run_id: str, write: Write) -> None: ...

    def retry_now(self) -> None: ...

    def __contains__(self, run_id: object) -> bool: ...

    def __len__(self) -> int: ...


class Updates(Protocol):
    """Owner-side updates written off the hot path (``RunSync``)."""

    def mark(self, state: RunState) -> None: ...

    def mark_delivered(self, state: RunState) -> None: ...

    async def flush(self, states: list[RunState]) -> None: ...


class Canceller(Protocol):
    """A cancel from request to answer (``CallerSide``)."""

    async def cancel(self, order: CancelOrder, wait: bool, timeout: float) -> CancelResult: ...
