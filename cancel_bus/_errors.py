"""All errors of cancel-bus.

    CancelBusError
     ├── BusUnavailable       Redis cannot serve the call now (unreachable, out of memory, loading,
     │    │                   busy, read-only after a failover...); nothing half-written
     │    └── BusMisconfigured  Redis refuses it for a reason a retry does not fix: access (NOPERM,
     │                        NOAUTH, WRONGPASS), a disabled command, a server too old, an eviction
     │                        policy that would drop live runs
     ├── BusClosed            the bus is not started, or already closed
     ├── RunCancelled         raised inside a run at a checkpoint; the run scope records it
     │                        (defined in ``_run.py``, beside the request it carries: this
     │                        module imports nothing)
     ├── RunEnded             a call on a run whose scope has exited (a leak, recorded)
     ├── RunNotFound          no such run (where an answer object cannot say so)
     ├── RunExists            the run id is taken (ids are never reused)
     ├── SessionBusy          the session key already has an active run
     │    └── Queued          the run waits in the session's queue (internal: strategy enqueue)
     ├── Fenced               this node lost its lease; its writes are refused
     ├── NodeIdInUse          another live incarnation holds this node id
     └── InvalidArgument      bad input, rejected before touching Redis (also a ValueError)
          └── InvalidId       an id or namespace that is unsafe to put in a key

Errors of the layer below (``redis.exceptions``) are translated in ``_redis.py`` only, each by its
class: unavailable, misconfigured, or a defect (a plain :class:`CancelBusError`).
"""

from __future__ import annotations


class CancelBusError(Exception):
    """Base of every error raised by cancel-bus."""


class BusUnavailable(CancelBusError):
    """Redis could not be reached (after retries), did not answer in time, or refused the call
    for now (``code``: Redis's error reply code, e.g. ``OOM``, ``LOADING``, if it gave one)."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class BusMisconfigured(BusUnavailable):
    """Redis refuses the call until an operator acts (access, a command, the server's version or
    settings). Still unavailability: what waits for Redis (a run's end) keeps waiting."""


class BusClosed(CancelBusError):
    """The bus is not started or was closed."""


class RunEnded(CancelBusError):
    """A run's handle was asked to pause or resume after the run's end (a leak)."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id} has ended")
        self.run_id = run_id


class RemoteTaskRunning(CancelBusError):
    """An A2A call's block was left while its remote task was not seen to end (the integrations'
    ``send_message``: recorded as the call's run's error, never raised out of it)."""


class RunNotFound(CancelBusError):
    """No record of the run in Redis (never started here, or its record expired)."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id} not found")
        self.run_id = run_id


class RunExists(CancelBusError):
    """The run id is already taken: active, queued elsewhere, or finished (ids are never reused)."""

    def __init__(self, run_id: str, status: str) -> None:
        super().__init__(f"run id {run_id} is already used (status {status})")
        self.run_id = run_id
        self.status = status


class SessionBusy(CancelBusError):
    """The session key already has an active run; one active run per session."""

    def __init__(self, session: tuple[str, str, str], active_run_id: str) -> None:
        app_name, user_id, session_id = session
        super().__init__(
            f"session {app_name}/{user_id}/{session_id} already has an active run {active_run_id}"
        )
        self.session = session
        self.active_run_id = active_run_id


class Queued(SessionBusy):
    """The run waits in its session's queue (strategy ``enqueue``) for ``active_run_id`` to end;
    ``record`` is its record as stored. Not raised to callers: the run scope waits its turn."""

    def __init__(
        self, session: tuple[str, str, str], active_run_id: str, record: dict[str, str]
    ) -> None:
        super().__init__(session, active_run_id)
        self.record = record


class Fenced(CancelBusError):
    """This node incarnation lost its lease; Redis refuses its writes."""


class NodeIdInUse(CancelBusError):
    """The node id asked for belongs to another node whose lease is live."""

    def __init__(self, node_id: str) -> None:
        super().__init__(f"node id {node_id} is held by another live node")
        self.node_id = node_id


class InvalidArgument(CancelBusError, ValueError):
    """Bad input, rejected before anything touches Redis."""


class InvalidId(InvalidArgument):
    """An id (run, session part, node) that is empty, too long or holds a refused character."""

    def __init__(self, what: str, value: object, problem: str) -> None:
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        super().__init__(f"invalid {what} {shown}: {problem}")
        self.what = what
