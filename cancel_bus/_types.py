"""The public data types: statuses, modes, outcomes and the records callers read.

Timestamps are seconds since the epoch on the Redis server clock (``float``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, computed_field


class RunStatus(StrEnum):
    """Where a run is in its life: active (queued, running, waiting) or ended."""

    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_active(self) -> bool:
        """Not ended yet: queued, running or waiting."""
        return self in ACTIVE_STATUSES

    @property
    def is_terminal(self) -> bool:
        """Ended: the status will not change again."""
        return not self.is_active


ACTIVE_STATUSES = frozenset({RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.WAITING})
StatusFilter = RunStatus | Literal["active", "finished", "all"]  # which runs a list shows


class CancelMode(StrEnum):
    """How a run is stopped. Ordered by strength: a later, stronger request escalates."""

    AFTER_TURN = "after_turn"
    CHECKPOINT = "checkpoint"
    IMMEDIATE = "immediate"

    @property
    def strength(self) -> int:
        """How hard the mode stops a run: a stronger request escalates a weaker one."""
        return _MODE_STRENGTH[self]


_MODE_STRENGTH = {CancelMode.AFTER_TURN: 0, CancelMode.CHECKPOINT: 1, CancelMode.IMMEDIATE: 2}


class Outcome(StrEnum):
    """What the caller of ``cancel`` learns."""

    CANCELLED = "cancelled"
    STOPPING = "stopping"
    ALREADY_FINISHED = "already_finished"
    NOT_FOUND = "not_found"
    OWNER_LOST = "owner_lost"


class StopCause(StrEnum):
    """Why a run was told to stop. The first four are cancel requests, recorded in Redis (the
    run ends ``cancelled``); the last two are its node stopping it without anyone asking (the
    run ends ``failed``, with the cause as its ``end_reason``)."""

    USER = "user"  # a caller asked: the library, the HTTP API, the CLI, an adapter
    CLIENT_DISCONNECT = "client_disconnect"  # the client streaming the run went away
    NODE_SHUTDOWN = "node_shutdown"  # its node drained
    PARENT = "parent"  # the run it was started under was cancelled
    INTERRUPT = "interrupt"  # a new run of its session interrupts it (it ends ``interrupted``)
    ROLLBACK = "rollback"  # as interrupt, its output discarded (it ends ``rolled_back``)
    LEASE_LOST = "lease_lost"  # Redis said its node's lease is gone (the node was fenced)
    REDIS_UNREACHABLE = "redis_unreachable"  # its node lost Redis for the self-fence deadline

    @property
    def is_request(self) -> bool:
        """The run stopped because someone asked (not because its node went away)."""
        return self in REQUEST_CAUSES


REQUEST_CAUSES = frozenset(
    {
        StopCause.USER,
        StopCause.CLIENT_DISCONNECT,
        StopCause.NODE_SHUTDOWN,
        StopCause.PARENT,
        StopCause.INTERRUPT,
        StopCause.ROLLBACK,
    }
)


class MultitaskStrategy(StrEnum):
    """What a new run of a session does when the session has an active run ("double
    texting"): ``reject`` it (:class:`SessionBusy`), ``enqueue`` behind it (recorded
    ``queued``, it starts when the runs before it have ended, in arrival order), ``interrupt``
    it (cancel it, wait for its end, then start: the new run reads the one it interrupted), or
    ``rollback`` (as interrupt, the interrupted run recorded with its output discarded)."""

    REJECT = "reject"
    ENQUEUE = "enqueue"
    INTERRUPT = "interrupt"
    ROLLBACK = "rollback"


EndReason = Literal[
    "completed",
    "cancelled",
    "interrupted",
    "rolled_back",
    "error",
    "owner_lost",
    "lease_lost",
    "redis_unreachable",
]


@dataclass(frozen=True, slots=True)
class CancelRequest:
    """The intent to stop a run. The first request wins; a stronger mode escalates. ``cause``
    says who or what asked (see :class:`StopCause`)."""

    mode: CancelMode
    reason: str | None
    requested_by: str | None
    requested_at: float
    cause: StopCause = StopCause.USER
    traceparent: str = ""  # the W3C trace context of the cancel ('' when it was not traced)


class RunInfo(BaseModel):
    """A run as recorded in Redis."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    status: RunStatus
    owner: str | None = None
    parent: str | None = None
    app_name: str | None = None
    user_id: str | None = None
    session_id: str | None = None
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    end_reason: EndReason | None = None
    cancel_requested_at: float | None = None
    cancel_delivered_at: float | None = None
    cancel_observed_at: float | None = None
    cancel_mode: CancelMode | None = None
    cancel_cause: StopCause | None = None
    cancel_reason: str | None = None
    cancel_traceparent: str | None = None  # the cancel's W3C trace context, if it was traced
    requested_by: str | None = None
    interrupted: str | None = None  # the run of its session it interrupted (or rolled back)
    output: str = ""
    output_truncated: bool = False
    error: str | None = None
    phase: str | None = None
    metadata: dict[str, Any] | None = None
    leaked_after_cancel: dict[str, Any] | None = None  # what its code did after its end
    slowest_checkpoints: dict[str, float] | None = None  # profiled: site -> longest stretch, ms

    @property
    def is_active(self) -> bool:
        """Its status is active."""
        return self.status.is_active

    @computed_field  # type: ignore[prop-decorator]
    @property
    def stopping(self) -> bool:
        """Active with a cancel accepted: what a dashboard shows as "stopping"."""
        return self.is_active and self.cancel_requested_at is not None

    @property
    def cancel_request(self) -> CancelRequest | None:
        """The cancel recorded for the run, if one was."""
        if self.cancel_requested_at is None or self.cancel_mode is None:
            return None
        return CancelRequest(
            self.cancel_mode,
            self.cancel_reason,
            self.requested_by,
            self.cancel_requested_at,
            self.cancel_cause or StopCause.USER,
            self.cancel_traceparent or "",
        )

    @classmethod
    def from_redis(cls, fields: Mapping[str, str]) -> RunInfo:
        """Build from a run hash as stored by the scripts (every value a string)."""
        values: dict[str, Any] = {k: v for k, v in fields.items() if v != "" and k in _RUN_FIELDS}
        for name in _JSON_FIELDS & values.keys():
            values[name] = json.loads(values[name])
        values["output_truncated"] = fields.get("output_truncated") == "1"
        return cls.model_validate(values)


_RUN_FIELDS = frozenset(RunInfo.model_fields)
_JSON_FIELDS = frozenset({"metadata", "leaked_after_cancel", "slowest_checkpoints"})


class CancelResult(BaseModel):
    """The answer to ``cancel``/``cancel_session``: an outcome and the run as it then stood, and
    one answer per run started below it (its tree: the active runs deepest first, then ended
    ones). The root answers ``cancelled`` only once every descendant listed is stopped or
    reported lost. ``truncated``: the tree was too large for one cancel (more than 1,000 active
    runs below the root, or 10,000 in all): runs left out were not cancelled."""

    model_config = ConfigDict(frozen=True)

    outcome: Outcome
    run: RunInfo | None = None
    descendants: list[CancelResult] = []
    truncated: bool = False


class Tombstone(BaseModel):
    """A selector cancel's hold on later runs: until it expires, a run started, claimed or
    queued that matches ``selector`` is recorded cancelled at once, with this request."""

    model_config = ConfigDict(frozen=True)

    tombstone_id: str
    selector: dict[str, Any]
    mode: CancelMode
    cause: StopCause
    reason: str | None = None
    requested_by: str | None = None
    created_at: float
    expires_at: float


class SelectorResult(BaseModel):
    """The answer to ``cancel_where``: how many active runs matched, their ids, and — unless it
    was a dry run — each one's cancel answer, and the tombstone holding later runs."""

    model_config = ConfigDict(frozen=True)

    matched: int
    run_ids: list[str]
    dry_run: bool
    results: list[CancelResult] = []
    tombstone: Tombstone | None = None


class NodeInfo(BaseModel):
    """A node as Redis records it: its id, epoch, runs and lease."""

    model_config = ConfigDict(frozen=True)

    node_id: str
    epoch: str
    started_at: float
    last_heartbeat: float
    lease_expires_at: float
    active_runs: int
    version: str
    expired: bool = False
    probe_at: float | None = None  # when its last probe of its own channel came back
    probe_latency_ms: float | None = None  # how long that probe took through Redis
    draining: bool = False  # it drains: it takes no new runs, and leaves when its runs end


class RunEvent(BaseModel):
    """One entry of a run's event stream (lifecycle) or relay stream (what it emitted)."""

    model_config = ConfigDict(frozen=True)

    id: str
    type: str
    at: float
    data: dict[str, Any]


def _counter(help_text: str, **labels: str) -> Any:
    """A BusStats field: its help text, and the labels it takes in a family of counters named
    by ``family`` (default: its own name)."""
    return field(default=0, metadata={"help": help_text, **labels})


@dataclass(slots=True)
class BusStats:
    """Counters of one bus since it started. The node service exports every field as a
    Prometheus counter (``cancel_bus_<name>_total``, or the ``family`` a field names, with its
    labels): add a field here and it is exported."""

    cancels_requested: int = _counter("Cancel requests this node sent to Redis")
    cancels_delivered: int = _counter("Cancels delivered to this node's runs by a bus message")
    cancels_recovered_by_sweep: int = _counter(
        "Cancels delivered to this node's runs by a sweep of Redis (their message was lost)"
    )
    messages_rejected: int = _counter("Bus messages dropped, whatever the reason", family="")
    messages_malformed: int = _counter(
        "Bus messages dropped, by reason", family="messages_rejected", reason="malformed"
    )
    messages_forged: int = _counter(
        "Bus messages dropped, by reason", family="messages_rejected", reason="forged"
    )
    messages_stale: int = _counter(
        "Bus messages dropped, by reason", family="messages_rejected", reason="stale"
    )
    messages_replayed: int = _counter(
        "Bus messages dropped, by reason", family="messages_rejected", reason="replayed"
    )
    messages_misaddressed: int = _counter(
        "Bus messages dropped, by reason", family="messages_rejected", reason="misaddressed"
    )
    leases_lost: int = _counter("Times Redis said this node's lease was gone (it rejoined)")
    self_fences: int = _counter(
        "Times this node stopped its runs because its lease could run out before Redis renewed it"
    )
    runs_reaped: int = _counter("Runs of dead nodes resolved by this node")
    nodes_reaped: int = _counter("Dead nodes reaped by this node")
    runs_reasserted: int = _counter("Runs re-created in Redis after it lost them")
    orphans_resolved: int = _counter("Runs Redis said this node owned but it did not hold")
    finishes_deferred: int = _counter("Finishes that had to wait for Redis in the outbox")
    finishes_fenced: int = _counter("Finishes refused because this incarnation was fenced")
    relay_dropped: int = _counter("Relayed events dropped: a run emitted faster than Redis took")
    leaks: int = _counter("Calls a run's code made through the library after the run's end")
    probes_failed: int = _counter("Probes of this node's own channel that did not come back")
    redis_keys_evicted: int = _counter(
        "Keys the node's Redis evicted while the node watched (any: runs may have been lost)"
    )
    cancels_unheard: int = _counter(
        "Cancels this node published that no subscriber of the owner's channel received"
    )
