"""cancel-bus: cross-node cancellation of long-running work over Redis."""

from ._bus import CancelBus
from ._checks import MAX_RETENTION
from ._errors import (
    BusClosed,
    BusMisconfigured,
    BusUnavailable,
    CancelBusError,
    Fenced,
    InvalidArgument,
    InvalidId,
    NodeIdInUse,
    RunEnded,
    RunExists,
    RunNotFound,
    SessionBusy,
)
from ._filter import RunFilter, recency
from ._keys import ID_PATTERN, MAX_ID_LENGTH, acl_rules
from ._run import RunHandle
from ._run_state import RunCancelled
from ._types import (
    BusStats,
    CancelMode,
    CancelRequest,
    CancelResult,
    MultitaskStrategy,
    NodeInfo,
    Outcome,
    RunEvent,
    RunInfo,
    RunStatus,
    SelectorResult,
    StopCause,
    Tombstone,
)
from ._version import VERSION as __version__

__all__ = [
    "BusClosed",
    "BusMisconfigured",
    "BusStats",
    "BusUnavailable",
    "CancelBus",
    "CancelBusError",
    "CancelMode",
    "CancelRequest",
    "CancelResult",
    "Fenced",
    "ID_PATTERN",
    "InvalidArgument",
    "InvalidId",
    "MAX_ID_LENGTH",
    "MAX_RETENTION",
    "MultitaskStrategy",
    "NodeIdInUse",
    "NodeInfo",
    "Outcome",
    "RunCancelled",
    "RunEnded",
    "RunEvent",
    "RunExists",
    "RunFilter",
    "RunHandle",
    "RunInfo",
    "RunNotFound",
    "RunStatus",
    "SelectorResult",
    "SessionBusy",
    "StopCause",
    "Tombstone",
    "__version__",
    "acl_rules",
    "recency",
]
