"""The names Python and Lua share, each defined once here and generated into the scripts'
prelude (``_scripts.py``): result codes (``C``), the fields of a run's record (``R``), of a node's
record (``N``), of a tombstone (``T``), and the types of a run's lifecycle events (``E``). The
message fields are ``_messages.Field`` (``F``); the key names, ``_keys`` (``key_<name>()``).

A script reads its arguments by name (``A.run_id``) and answers a record with named fields,
as JSON; a test holds every name the Lua files use to these definitions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from ._types import CancelMode, RunInfo, RunStatus, StopCause


class Code(StrEnum):
    """What a script answered (a reply's ``code``); ``_calls`` turns them into errors."""

    OK = "ok"
    IN_USE = "in_use"  # a live incarnation holds the node id
    BUSY = "busy"  # an expired incarnation of the id still has runs to resolve: call again
    FENCED = "fenced"  # the caller's incarnation lost its lease (or the run is another's)
    MISSING = "missing"  # Redis has no record of the caller's node: it lost our data
    EXISTS = "exists"  # the run id is taken
    SESSION_BUSY = "session_busy"  # the session key has an active run
    QUEUED = "queued"  # recorded queued behind the session's active run (strategy 'enqueue')
    CANCELLED = "cancelled"  # cancelled (a queued or waiting run, or one that must not start)
    NOT_FOUND = "not_found"
    RECOVERING = "recovering"  # not found, but Redis lost the namespace's data lately
    ALREADY_FINISHED = "already_finished"
    OWNER_LOST = "owner_lost"
    STOPPING = "stopping"  # a cancel recorded; the owner was told
    DONE = "done"  # the run was ended by someone else
    RECORD_LOST = "record_lost"  # Redis lost the run's record: call again with it
    CANCEL_PENDING = "cancel_pending"
    STATE = "state"  # the run is not in the state the call needs
    RECREATED = "recreated"
    FINISHED = "finished"
    FOREIGN = "foreign"  # the run is another node's
    FULL = "full"  # too many live tombstones


class RunField(StrEnum):
    """The fields of a run's record (``run:<id>``): every :class:`~cancel_bus.RunInfo` field,
    and three the record keeps for itself."""

    RUN_ID = "run_id"
    STATUS = "status"
    OWNER = "owner"
    PARENT = "parent"
    APP_NAME = "app_name"
    USER_ID = "user_id"
    SESSION_ID = "session_id"
    CREATED_AT = "created_at"
    STARTED_AT = "started_at"
    FINISHED_AT = "finished_at"
    END_REASON = "end_reason"
    CANCEL_REQUESTED_AT = "cancel_requested_at"
    CANCEL_DELIVERED_AT = "cancel_delivered_at"
    CANCEL_OBSERVED_AT = "cancel_observed_at"
    CANCEL_MODE = "cancel_mode"
    CANCEL_CAUSE = "cancel_cause"
    CANCEL_REASON = "cancel_reason"
    CANCEL_TRACEPARENT = "cancel_traceparent"
    REQUESTED_BY = "requested_by"
    INTERRUPTED = "interrupted"
    OUTPUT = "output"
    OUTPUT_TRUNCATED = "output_truncated"
    ERROR = "error"
    PHASE = "phase"
    METADATA = "metadata"
    LEAKED_AFTER_CANCEL = "leaked_after_cancel"
    SLOWEST_CHECKPOINTS = "slowest_checkpoints"
    EPOCH = "epoch"  # the owner's incarnation (its fencing token)
    RELAY = "relay"  # "1": its output is relayed to followers
    ENQUEUE_REQUEST = "enqueue_request"  # the request id of the call that queued it


STORED_ONLY = frozenset({RunField.EPOCH, RunField.RELAY, RunField.ENQUEUE_REQUEST})


class NodeField(StrEnum):
    """The fields of a node's record (``node:<id>``)."""

    NODE_ID = "node_id"
    STATE = "state"  # alive | dead | left
    EPOCH = "epoch"
    STARTED_AT = "started_at"
    LAST_HEARTBEAT = "last_heartbeat"
    LEASE_EXPIRES_AT = "lease_expires_at"
    VERSION = "version"
    PROBE_AT = "probe_at"
    PROBE_S = "probe_s"
    DRAINING = "draining"  # "1" once the node drains (it takes no new runs)
    DIED_AT = "died_at"
    LEFT_AT = "left_at"


class NodeState(StrEnum):
    """A node's state: stored in its record (``alive``, ``dead``, ``left``), or ``missing`` when
    Redis has no record of it (it lost our data)."""

    ALIVE = "alive"
    DEAD = "dead"
    LEFT = "left"
    MISSING = "missing"


class ClockField(StrEnum):
    """The fields of the lease clock (``clock``): the server time of the last heartbeat, the
    lease clock's value then, and the most that heartbeat let it advance (its step)."""

    LAST = "last"
    AT = "at"
    CAP = "cap"


class EntryField(StrEnum):
    """The fields of an entry of a run's event log (``ev:<id>``) or relay stream (``out:<id>``)."""

    TYPE = "type"
    AT = "at"
    DATA = "data"


class TombstoneField(StrEnum):
    """The fields of a tombstone (``tomb:<id>``)."""

    TOMBSTONE_ID = "tombstone_id"
    SELECTOR = "selector"
    MODE = "mode"
    CAUSE = "cause"
    REASON = "reason"
    REQUESTED_BY = "requested_by"
    CREATED_AT = "created_at"
    EXPIRES_AT = "expires_at"
    REMOVED_BY = "removed_by"


class EventType(StrEnum):
    """The lifecycle events of a run: those the scripts append to its log (``ev:<id>``), and
    the first two, which the record tells (``created_at``, ``started_at``)."""

    QUEUED = "run.queued"
    STARTED = "run.started"

    CANCEL_REQUESTED = "run.cancel_requested"
    CANCEL_ESCALATED = "run.cancel_escalated"
    CANCEL_DELIVERED = "run.cancel_delivered"  # at the record's cancel_delivered_at
    CANCEL_OBSERVED = "run.cancel_observed"  # at the record's cancel_observed_at
    WAITING = "run.waiting"
    RESUMED = "run.resumed"
    REASSERTED = "run.reasserted"
    LEAKED = "run.leaked"
    FINISHED = "run.finished"


# -- the records of the calls: what a script is asked, and what it answered ------------------

Record = dict[str, str]  # a run's record as stored: every value a string


@dataclass(frozen=True, slots=True)
class CancelOrder:
    """What a cancel asks for: the run (``run:<id>``) or session (``session:...``) it targets,
    its mode, reason, requester and cause; with ``tree``, every run started below it too."""

    target: str
    run_id: str | None
    session: tuple[str, str, str] | None
    mode: CancelMode
    reason: str | None
    requested_by: str | None
    cause: StopCause
    tree: bool = True
    traceparent: str = ""  # the W3C trace context the cancel continues ('': none)


@dataclass(frozen=True, slots=True)
class CancelAnswer:
    """What ``request_cancel`` answered: a code (an Outcome value, or ``recovering``), the run,
    how many subscribers the cancel message reached (-1: none was sent, the caller is the
    owner), the descendants, whether some were left out (``MAX_DESCENDANTS``, ``MAX_WALK``),
    and how many of the tree's cancel messages no subscriber heard (the owners' sweeps deliver
    them)."""

    code: Code
    run: RunInfo | None
    receivers: int = -1
    descendants: list[tuple[str, Code, RunInfo | None]] = field(default_factory=list)
    truncated: bool = False
    unheard: int = 0


@dataclass(frozen=True, slots=True)
class Finish:
    """A run's end, as its owner writes it. ``stop_cause``: why the node stopped the run without
    a request, if it did; ``record`` (the run as the owner knows it) is read only if Redis lost
    the run's record."""

    run_id: str
    node_id: str
    epoch: str
    status: RunStatus
    stop_cause: StopCause | None
    output: str
    output_truncated: bool
    error: str | None
    phase: str | None
    delivered_at: float | None
    observed_at: float | None
    record: Callable[[], Record]
    notes: str = ""


@dataclass(frozen=True, slots=True)
class Finished:
    """What a finish answered: ``ok`` (``status``, ``end_reason`` as recorded), ``done`` (ended by
    someone else) or ``fenced`` (the run is no longer this incarnation's)."""

    code: Code
    status: str = ""
    end_reason: str = ""


@dataclass(frozen=True, slots=True)
class SyncItem:
    """Owner-side updates of one active run, written together off the hot path."""

    run_id: str
    phase: str
    delivered_at: str
    relay: list[tuple[str, str, str]]
    notes: str = ""


@dataclass(frozen=True, slots=True)
class Reasserted:
    """What re-asserting a run answered: ``ok`` (recorded as ours), ``recreated``, ``finished``
    (``status``), ``foreign`` (``owner``) or ``fenced``."""

    code: Code
    status: str = ""
    owner: str = ""
