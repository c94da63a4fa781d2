"""Argument checks of the public calls: bad input is an :class:`InvalidArgument` (or
:class:`InvalidId`) before anything touches Redis."""

from __future__ import annotations

import json
import os
from typing import Any, cast

from ._errors import InvalidArgument
from ._keys import validate_id
from ._run_state import current_run
from ._types import (
    REQUEST_CAUSES,
    CancelMode,
    MultitaskStrategy,
    RunStatus,
    StatusFilter,
    StopCause,
)

MAX_TEXT = 1000
MAX_LIST_LIMIT = 1000
MAX_METADATA_BYTES = 16384
MAX_TIMEOUT = 3600.0
MAX_POLL = 4.0  # a blocking read longer than the socket timeout (5 s) would look like an outage
MAX_RETENTION = 10 * 365 * 86400.0  # seconds a finished run is kept, at most (ten years)


def require(condition: bool, message: str) -> None:
    if not condition:
        raise InvalidArgument(message)


def run_id(value: str | None) -> str:
    """The given run id, checked, or a new one (128 random bits, as a UUID4's hex)."""
    return os.urandom(16).hex() if value is None else validate_id(value, "run_id")


def session(
    app_name: str | None, user_id: str | None, session_id: str | None
) -> tuple[str, str, str] | None:
    parts = (app_name, user_id, session_id)
    if all(part is None for part in parts):
        return None
    if any(part is None for part in parts):
        raise InvalidArgument("a session key needs app_name, user_id and session_id together")
    return (
        validate_id(app_name, "app_name"),
        validate_id(user_id, "user_id"),
        validate_id(session_id, "session_id"),
    )


def parent(value: str | None, detached: bool) -> str | None:
    """The parent of a run about to start: the one given, else the run whose code is starting
    it (none if ``detached``)."""
    if detached:
        require(value is None, "a detached run has no parent")
        return None
    if value is not None:
        return validate_id(value, "parent")
    current = current_run.get()
    return current.run_id if current is not None and not current.closed else None


def run_metadata(value: dict[str, Any] | None) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(key, str) for key in value):
        raise InvalidArgument("metadata must be a dict with string keys")
    try:
        size = len(json.dumps(value))
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidArgument(f"metadata must be JSON-serialisable: {exc}") from None
    require(size <= MAX_METADATA_BYTES, "metadata must be at most 16 KiB as JSON")
    return value


def mode(value: CancelMode | str) -> CancelMode:
    try:
        return CancelMode(value)
    except ValueError:
        valid = ", ".join(m.value for m in CancelMode)
        raise InvalidArgument(f"invalid cancel mode {value!r} (one of {valid})") from None


def cause(value: StopCause | str) -> StopCause:
    """Who asks for a cancel: only a request cause (a run stopped by its node asks nobody)."""
    try:
        checked = StopCause(value)
    except ValueError:
        checked = None
    if checked not in REQUEST_CAUSES:
        valid = ", ".join(c.value for c in StopCause if c in REQUEST_CAUSES)
        raise InvalidArgument(f"invalid cancel cause {value!r} (one of {valid})")
    return checked


def text(value: str | None, what: str, limit: int = MAX_TEXT) -> str | None:
    require(
        value is None or (isinstance(value, str) and len(value) <= limit),
        f"{what} must be a string of at most {limit} characters",
    )
    return value


def timeout(value: float) -> float:
    require(
        _number(value) and 0 < value <= MAX_TIMEOUT,
        f"timeout must be between 0 and {MAX_TIMEOUT:.0f} seconds",
    )
    return value


def poll(value: float) -> float:
    """How long a follower's read waits for news: under the client's socket timeout."""
    require(
        _number(value) and 0.01 <= value <= MAX_POLL,
        f"poll must be between 0.01 and {MAX_POLL:g} seconds",
    )
    return value


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def flag(value: bool, what: str) -> bool:
    require(isinstance(value, bool), f"{what} must be True or False")
    return value


def request(
    mode_: CancelMode | str,
    cause_: StopCause | str,
    reason: str | None,
    requested_by: str | None,
    timeout_: float,
) -> tuple[CancelMode, StopCause]:
    """A cancel's arguments: its mode and cause, checked (the texts and timeout too)."""
    checked = mode(mode_), cause(cause_)
    text(reason, "reason")
    text(requested_by, "requested_by", limit=200)
    timeout(timeout_)
    return checked


def settings(
    lease_ttl: float,
    retention: float,
    sweep_interval: float,
    max_output_chars: int,
    self_fence_after: float | None,
) -> float:
    """A bus's settings, checked; -> the self-fence deadline (default: the lease; the lease
    itself stops the runs a margin before it could run out, whatever this says)."""
    require(0.3 <= lease_ttl <= MAX_TIMEOUT, "lease_ttl must be 0.3 to 3600 seconds")
    require(1 <= retention <= MAX_RETENTION, "retention must be 1 second to 10 years")
    require(sweep_interval > 0, "sweep_interval must be positive")
    require(max_output_chars >= 0, "max_output_chars must not be negative")
    if self_fence_after is None:
        return lease_ttl
    require(0 < self_fence_after <= MAX_TIMEOUT, "self_fence_after must be 0 to 3600 seconds")
    return self_fence_after


def listing(
    status: RunStatus | str,
    node_id: str | None,
    app_name: str | None,
    user_id: str | None,
    limit_: int,
) -> tuple[StatusFilter, str | None, str | None, str | None, int]:
    """The arguments of a runs listing, checked."""
    return (
        status_filter(status),
        optional_id(node_id, "node_id"),
        optional_id(app_name, "app_name"),
        optional_id(user_id, "user_id"),
        limit(limit_),
    )


def status_filter(value: RunStatus | str) -> StatusFilter:
    """ "active", "finished", "all" or a :class:`RunStatus`."""
    if value in ("active", "finished", "all"):
        return cast(StatusFilter, value)
    try:
        return RunStatus(value)
    except ValueError:
        raise InvalidArgument(f"invalid status {value!r}") from None


def strategy(value: MultitaskStrategy | str) -> MultitaskStrategy:
    """A strategy for a busy session, by name (an adapter's setting, or a run's)."""
    try:
        return MultitaskStrategy(value)
    except ValueError:
        valid = ", ".join(s.value for s in MultitaskStrategy)
        raise InvalidArgument(f"invalid multitask_strategy {value!r} (one of {valid})") from None


def multitask(
    value: MultitaskStrategy | str, session: tuple[str, str, str] | None
) -> MultitaskStrategy:
    """A run's strategy for a busy session: any but ``reject`` needs a session key."""
    chosen = strategy(value)
    require(
        chosen is MultitaskStrategy.REJECT or session is not None,
        f"multitask_strategy {chosen.value!r} needs a session key",
    )
    return chosen


def optional_id(value: str | None, what: str) -> str | None:
    return None if value is None else validate_id(value, what)


def limit(value: int) -> int:
    require(
        isinstance(value, int) and 1 <= value <= MAX_LIST_LIMIT,
        f"limit must be between 1 and {MAX_LIST_LIMIT}",
    )
    return value


MAX_HOLD = 7 * 86400.0
_SCALARS = (str, int, float, bool)


def selector(
    run_id: str | None,
    app_name: str | None,
    user_id: str | None,
    session_id: str | None,
    node_id: str | None,
    metadata: dict[str, Any] | None,
    started_before: float | None,
) -> dict[str, Any]:
    """A selector of runs: the fields given, at least one; metadata values are scalars."""
    chosen: dict[str, Any] = {}
    for what, value in (
        ("run_id", run_id),
        ("app_name", app_name),
        ("user_id", user_id),
        ("session_id", session_id),
        ("node_id", node_id),
    ):
        if value is not None:
            chosen[what] = validate_id(value, what)
    if metadata is not None:
        require(
            isinstance(metadata, dict)
            and all(isinstance(k, str) and isinstance(v, _SCALARS) for k, v in metadata.items()),
            "a selector's metadata must map strings to strings, numbers or booleans",
        )
        chosen["metadata"] = run_metadata(metadata)
    if started_before is not None:
        require(
            isinstance(started_before, int | float) and started_before > 0,
            "started_before must be a time (seconds since the epoch)",
        )
        chosen["started_before"] = float(started_before)
    require(bool(chosen), "a selector needs at least one criterion")
    return chosen


def hold(ttl: float | None, until: float | None, now: float) -> float | None:
    """How long a tombstone holds later runs: ``ttl`` seconds, or ``until`` a time; or None."""
    require(ttl is None or until is None, "give ttl or until, not both")
    seconds = ttl if until is None else until - now
    if seconds is None:
        return None
    require(
        isinstance(seconds, int | float) and 0 < seconds <= MAX_HOLD,
        "a tombstone holds for more than 0 s and at most 7 days",
    )
    return float(seconds)


def signing_keys(signing_key: str | bytes | None, others: list[str | bytes]) -> list[bytes]:
    """The keys of the message seal: the signing key first, then the other accepted ones."""
    require(not others or signing_key is not None, "verification_keys need a signing_key")
    keys = ([signing_key] if signing_key is not None else []) + others
    for key in keys:
        require(isinstance(key, str | bytes) and len(key) > 0, "a signing key must not be empty")
    return [key.encode() if isinstance(key, str) else key for key in keys]
