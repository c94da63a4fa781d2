"""CancelBus: one node's view of the cluster. Wires the store, lease, listener, sync and outbox.

A cancel's path: ``cancel`` -> ``request_cancel`` script (persist, then publish to the owner's own
channel) -> the owner's listener -> ``RunHandle.deliver`` -> the run raises at its next checkpoint
-> ``finish_run`` script -> a finish notice on each waiting node's channel -> the caller returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from types import TracebackType
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from ._errors import (
    BusClosed,
    BusUnavailable,
    CancelBusError,
    Fenced,
    InvalidArgument,
    RunCancelled,
    RunExists,
    RunNotFound,
    SessionBusy,
)
from ._keys import KeySpace, validate_id
from ._lease import Lease
from ._listener import Listener
from ._messages import (
    CancelMessage,
    MessageSigner,
    Rejection,
    addressed_to,
    decode,
    parse_message,
    run_target,
    session_target,
)
from ._outbox import Outbox
from ._redis import Topology, connect, raise_if_cancelling
from ._run import RunHandle, RunScope, RunSpec
from ._store import RunStore, StatusFilter
from ._sync import RunSync
from ._timed import TimedMap
from ._types import (
    BusStats,
    CancelMode,
    CancelRequest,
    CancelResult,
    NodeInfo,
    Outcome,
    RunEvent,
    RunInfo,
    RunStatus,
    StopCause,
)
from ._version import VERSION
from ._waiters import Waiters

log = logging.getLogger("cancel_bus")

MAX_TEXT = 1000
MAX_LIST_LIMIT = 1000
EARLY_CANCEL_SECONDS = 30.0
SHUTDOWN_SECONDS = 3.0
OWNER_WRITES = 32  # owner writes in flight at once: a burst must not flood the event loop


class CancelBus:
    """Distributed cancellation for long-running work, over Redis.

    Each node keeps its active runs in memory (checkpoints stay local and free); ownership and
    cancel intent live in Redis; a cancel arriving at any node reaches the owner over pub/sub.
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        namespace: str = "cancel-bus",
        node_id: str | None = None,
        lease_ttl: float = 10.0,
        retention: float = 86400.0,
        sweep_interval: float = 2.0,
        signing_key: str | bytes | None = None,
        verification_keys: Sequence[str | bytes] = (),
        self_fence_after: float | None = None,
        max_output_chars: int = 1_000_000,
        version: str = VERSION,
    ) -> None:
        """``signing_key`` seals every bus message; ``verification_keys`` are accepted too (key
        rotation). ``self_fence_after``: seconds without an answer from Redis after which the
        node stops its runs (``redis_unreachable``); default ``max(60, 3 * lease_ttl)``."""
        self.keys = KeySpace(namespace)
        if node_id is not None:
            validate_id(node_id, "node_id")
        _require(lease_ttl >= 0.3, "lease_ttl must be at least 0.3 seconds")
        _require(retention >= 1, "retention must be at least 1 second")
        _require(sweep_interval > 0, "sweep_interval must be positive")
        _require(max_output_chars >= 0, "max_output_chars must not be negative")
        self_fence_after = (
            max(60.0, 3 * lease_ttl) if self_fence_after is None else self_fence_after
        )
        _require(self_fence_after >= lease_ttl, "self_fence_after must be at least the lease_ttl")
        keys = [_key_bytes(k) for k in ([signing_key] if signing_key is not None else [])]
        keys += [_key_bytes(k) for k in verification_keys]
        _require(
            not verification_keys or signing_key is not None,
            "verification_keys need a signing_key",
        )
        self._signer = MessageSigner(namespace, keys, self.clock)
        self._fixed_node_id = node_id is not None
        self._node_id = node_id or _new_node_id()
        self._topology = connect(url, client_name=f"cancel-bus.{self._node_id}")
        self._redis = self._topology.client
        self._store = self._store_on(self._topology, retention)
        # The lease has connections of its own: work holding or queued for the main pool (64
        # followers in a blocking read, a burst of finishes) must not hold up the heartbeat
        # until the node fences itself.
        self._lease_topology = connect(
            url, client_name=f"cancel-bus.{self._node_id}.lease", max_connections=2
        )
        self._lease = Lease(
            self._store_on(self._lease_topology, retention),
            lease_ttl=lease_ttl,
            self_fence_after=self_fence_after,
            version=version,
            holder=self,
        )
        self._sweep_interval = sweep_interval
        self._max_output_chars = max_output_chars
        self._local: dict[str, RunHandle] = {}
        self._local_empty = asyncio.Event()
        self._waiters = Waiters()
        self._sync = RunSync(self._store, lambda: self._node_id)
        self._outbox = Outbox()
        self._listener: Listener | None = None
        self._listener_task: asyncio.Task[None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._owner_writes = asyncio.Semaphore(OWNER_WRITES)
        # a cancel for a run whose start has not returned here yet, applied when it does
        self._early_cancels: TimedMap[str, CancelRequest] = TimedMap(EARLY_CANCEL_SECONDS, 10_000)
        # cancels this node accepted lately, to record again if Redis loses them
        self._accepted: TimedMap[str, CancelRequest] = TimedMap(2 * lease_ttl, 100_000)
        self._unconfirmed: set[str] = set()
        self._rejoining = asyncio.Lock()
        self._reconciling = False
        self._state = "new"
        self.stats = BusStats()

    # -- lifecycle ----------------------------------------------------------------------------

    @property
    def node_id(self) -> str:
        """This incarnation's id (a new one after a lease loss, unless the id was given)."""
        return self._node_id

    @property
    def epoch(self) -> str:
        return self._lease.epoch

    @property
    def lease_ttl(self) -> float:
        return self._lease.lease_ttl

    @property
    def redis(self) -> Redis | RedisCluster:
        return self._redis

    @property
    def ready(self) -> bool:
        """Running, holding its lease (renewed within the last lease), subscribed to its
        channel."""
        listener = self._listener
        return (
            self._state == "running"
            and self._lease.fresh
            and listener is not None
            and listener.connected
        )

    @property
    def draining(self) -> bool:
        return self._state == "draining"

    @property
    def pubsub_reconnects(self) -> int:
        return self._listener.reconnects if self._listener is not None else 0

    def clock(self) -> float:
        """Now on the Redis server clock (estimated from heartbeats)."""
        return self._lease.clock()

    async def start(self) -> None:
        if self._state != "new":
            raise BusClosed(f"the bus cannot start: it is {self._state}")
        self._state = "starting"
        try:
            await self._lease.register(self._node_id)
            await self._start_listener(timeout=max(5.0, self.lease_ttl))
        except BaseException:
            await self._shutdown_tasks()
            self._state = "new"
            raise
        for job in (
            self._lease.run_forever(),
            self._sync.run_forever(),
            self._outbox.run_forever(),
            self._sweep_forever(),
        ):
            self._tasks.append(asyncio.create_task(job))
        self._state = "running"
        log.info("cancel-bus: node %s joined namespace %s", self._node_id, self.keys.namespace)

    async def close(self, drain_timeout: float = 0.0, cancel_timeout: float = 5.0) -> None:
        """Leave the cluster: refuse new runs, give local runs ``drain_timeout`` to end, cancel the
        rest (reason ``node_shutdown``), write what is pending, release the lease."""
        if self._state in ("closed", "new"):
            self._state = "closed"
            await self._close_client()
            return
        self._state = "draining"
        if self._local and drain_timeout > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._local_empty.wait(), drain_timeout)
        await self._cancel_local_runs(cancel_timeout)
        with contextlib.suppress(BusUnavailable, TimeoutError):
            await asyncio.wait_for(self._outbox.flush(), cancel_timeout)
        with contextlib.suppress(CancelBusError, TimeoutError):
            await asyncio.wait_for(self._leave(), cancel_timeout)
        self._state = "closed"
        await self._shutdown_tasks()
        await self._close_client()
        log.info("cancel-bus: node %s left", self._node_id)

    async def __aenter__(self) -> CancelBus:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- owner side ---------------------------------------------------------------------------

    def run(
        self,
        run_id: str | None = None,
        *,
        app_name: str | None = None,
        user_id: str | None = None,
        session_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        relay: bool = False,
    ) -> RunScope:
        """Run here: ``async with bus.run(...) as run``. A queued run of that id is claimed.

        ``relay=True`` makes what the run emits readable by :meth:`follow` on any node."""
        spec = RunSpec(
            run_id=_run_id(run_id),
            session=_session(app_name, user_id, session_id),
            metadata=_metadata(metadata),
            relay=relay,
        )
        return RunScope(self, spec)

    async def enqueue(
        self,
        run_id: str | None = None,
        *,
        app_name: str | None = None,
        user_id: str | None = None,
        session_id: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> RunInfo:
        """Record a queued run (no owner yet); ``bus.run(run_id=...)`` on any node claims it."""
        self._require_open()
        run_id = _run_id(run_id)
        session = _session(app_name, user_id, session_id)
        code, run, detail = await self._store.enqueue_run(run_id, session, _metadata(metadata))
        if code == "session_busy":
            assert session is not None
            raise SessionBusy(session, detail)
        if code == "exists":
            raise RunExists(run_id, detail)
        assert run is not None
        return run

    def local_runs(self) -> list[RunHandle]:
        return list(self._local.values())

    # RunOwner protocol (called by RunScope / RunHandle)

    async def start_run(self, spec: RunSpec) -> RunHandle:
        self._require_open(accepting=True)
        epoch = self._lease.epoch
        async with self._owner_writes:
            code, run, detail = await self._store.start_run(
                spec.run_id, self._node_id, epoch, spec.session, spec.metadata, spec.relay
            )
        if code == "fenced":
            raise Fenced(f"node {self._node_id} has lost its lease")
        if code == "missing":
            raise BusUnavailable("Redis lost this node's record; it re-registers within a beat")
        if code == "session_busy":
            assert spec.session is not None
            raise SessionBusy(spec.session, detail)
        assert run is not None
        if code == "exists":
            if run.status is RunStatus.CANCELLED and run.started_at is None:
                raise RunCancelled(run.run_id, run.cancel_request)
            raise RunExists(run.run_id, run.status.value)
        handle = RunHandle(
            run, self, epoch=epoch, relay=spec.relay, max_output_chars=self._max_output_chars
        )
        self._local[run.run_id] = handle
        self._local_empty.clear()
        early = self._early_cancels.pop(run.run_id)
        if early is not None:
            handle.deliver(early)
        return handle

    async def finish_run(self, handle: RunHandle, status: RunStatus, error: str | None) -> None:
        with contextlib.suppress(CancelBusError):  # relayed output is best effort; the end is not
            await self._sync.flush(handle)

        async def write() -> None:
            await self._write_finish(handle, status, error)

        if len(self._outbox):  # Redis is failing: queue behind the others, don't hold the exit
            self._defer(handle.run_id, write, "earlier finishes are waiting for Redis")
            return
        try:
            async with self._owner_writes:
                async with asyncio.timeout(self._lease.interval):
                    await write()
        except (BusUnavailable, TimeoutError) as exc:  # a retried finish is idempotent
            self._defer(handle.run_id, write, str(exc) or "no answer from Redis")

    def _defer(self, run_id: str, write: Callable[[], Awaitable[None]], why: str) -> None:
        log.warning("cancel-bus: finish of %s deferred: %s", run_id, why)
        self.stats.finishes_deferred += 1
        self._outbox.add(run_id, write)

    async def set_waiting(self, handle: RunHandle, waiting: bool) -> None:
        target = RunStatus.WAITING if waiting else RunStatus.RUNNING
        async with self._owner_writes:
            code, detail = await self._store.set_waiting(
                handle.run_id, self._node_id, handle.epoch, target
            )
        if code == "ok":
            return
        if code == "fenced":
            raise Fenced(f"run {handle.run_id} is no longer owned by this node incarnation")
        run = await self._store.get_run(handle.run_id)
        request = run.cancel_request if run is not None else None
        if request is not None:
            handle.deliver(request)
            raise RunCancelled(handle.run_id, request)
        raise CancelBusError(f"run {handle.run_id} cannot become {target.value}: it is {detail}")

    def run_changed(self, handle: RunHandle) -> None:
        self._sync.mark(handle)

    # -- any node -----------------------------------------------------------------------------

    async def cancel(
        self,
        run_id: str,
        *,
        mode: CancelMode | str = CancelMode.CHECKPOINT,
        reason: str | None = None,
        requested_by: str | None = None,
        wait: bool = True,
        timeout: float = 5.0,
    ) -> CancelResult:
        """Ask the run to stop, from any node. With ``wait``, return once its owner confirms
        (``cancelled``) or at ``timeout`` (``stopping``: recorded, it will still be honoured)."""
        validate_id(run_id, "run_id")
        return await self._cancel(
            run_target(run_id), run_id, None, mode, reason, requested_by, wait, timeout
        )

    async def cancel_session(
        self,
        app_name: str,
        user_id: str,
        session_id: str,
        *,
        mode: CancelMode | str = CancelMode.CHECKPOINT,
        reason: str | None = None,
        requested_by: str | None = None,
        wait: bool = True,
        timeout: float = 5.0,
    ) -> CancelResult:
        """Cancel the active run of a session key, wherever it runs."""
        session = _session(app_name, user_id, session_id)
        assert session is not None
        return await self._cancel(
            session_target(session), None, session, mode, reason, requested_by, wait, timeout
        )

    async def wait(self, run_id: str, timeout: float = 30.0) -> RunInfo | None:
        """Wait for a run to end (on any node); the run as it stands at the end or the timeout."""
        validate_id(run_id, "run_id")
        _require(timeout > 0, "timeout must be positive")
        self._require_open()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            async with asyncio.timeout(timeout):
                status = await self._store.add_waiter(run_id, self._node_id)
        except TimeoutError as exc:
            raise BusUnavailable("no answer from Redis within the timeout") from exc
        if not status:
            return None
        if RunStatus(status).is_active:
            final = await self._await_end(run_id, deadline)
            if final is not None:
                return final
        return await self._store.get_run(run_id)

    async def get_run(self, run_id: str) -> RunInfo | None:
        validate_id(run_id, "run_id")
        self._require_open()
        return await self._store.get_run(run_id)

    async def list_runs(
        self,
        status: StatusFilter | str = "active",
        node_id: str | None = None,
        app_name: str | None = None,
        user_id: str | None = None,
        limit: int = 100,
    ) -> list[RunInfo]:
        """Runs across the cluster, newest first. ``status``: "active", "all" or a RunStatus."""
        self._require_open()
        if status not in ("active", "all"):
            try:
                status = RunStatus(status)
            except ValueError:
                raise InvalidArgument(f"invalid status {status!r}") from None
        for value, what in ((node_id, "node_id"), (app_name, "app_name"), (user_id, "user_id")):
            if value is not None:
                validate_id(value, what)
        _require(
            isinstance(limit, int) and 1 <= limit <= MAX_LIST_LIMIT,
            f"limit must be between 1 and {MAX_LIST_LIMIT}",
        )
        return await self._store.list_runs(status, node_id, app_name, user_id, limit)

    async def list_nodes(self) -> list[NodeInfo]:
        self._require_open()
        return await self._store.list_nodes(self.clock())

    async def events(self, run_id: str) -> list[RunEvent]:
        """The run's lifecycle events, oldest first (empty once retention has passed)."""
        validate_id(run_id, "run_id")
        self._require_open()
        return await self._store.events(run_id)

    async def follow(
        self, run_id: str, *, from_start: bool = False, poll: float = 1.0
    ) -> AsyncIterator[RunEvent]:
        """What a relayed run emits (from now on, or ``from_start``), read on any node; ends with
        ``run.finished``. Raises :class:`RunNotFound` for an unknown run."""
        validate_id(run_id, "run_id")
        self._require_open()
        run, last = await self._store.relay_position(run_id)
        if run is None:
            raise RunNotFound(run_id)
        if from_start:
            last = "0"
        while True:
            active = run is not None and run.is_active
            block_ms = int(poll * 1000) if active else None
            for event in await self._store.read_relay(run_id, last, block_ms):
                last = event.id
                yield event
                if event.type == "run.finished":
                    return
            if not active:
                break
            run = await self._store.get_run(run_id)
        if run is not None:  # not relayed, or its relay expired: the record tells the end
            yield RunEvent(
                id=last,
                type="run.finished",
                at=run.finished_at or run.created_at,
                data={"status": run.status.value, "end_reason": run.end_reason},
            )

    # -- the cancel path ----------------------------------------------------------------------

    async def _cancel(
        self,
        target: str,
        run_id: str | None,
        session: tuple[str, str, str] | None,
        mode: CancelMode | str,
        reason: str | None,
        requested_by: str | None,
        wait: bool,
        timeout: float,
    ) -> CancelResult:
        mode = _mode(mode)
        _require(
            reason is None or (isinstance(reason, str) and len(reason) <= MAX_TEXT),
            f"reason must be a string of at most {MAX_TEXT} characters",
        )
        _require(
            requested_by is None or (isinstance(requested_by, str) and len(requested_by) <= 200),
            "requested_by must be a string of at most 200 characters",
        )
        _require(
            isinstance(timeout, int | float) and 0 < timeout <= 3600,
            "timeout must be between 0 and 3600 seconds",
        )
        self._require_open()
        deadline = asyncio.get_running_loop().time() + timeout
        try:
            async with asyncio.timeout(timeout):
                answer = await self._store.request_cancel(
                    run_id=run_id,
                    session=session,
                    target=target,
                    mode=mode,
                    reason=reason,
                    requested_by=requested_by,
                    waiter=self._node_id if wait else "",
                    caller=self._node_id,
                )
        except TimeoutError as exc:
            raise BusUnavailable(
                "no answer from Redis within the timeout; the cancel may not be recorded"
            ) from exc
        self.stats.cancels_requested += 1
        run = answer.run
        if answer.code != "stopping" or run is None:
            return CancelResult(outcome=Outcome(answer.code), run=run)
        request = run.cancel_request
        if request is not None:
            self._accepted.put(run.run_id, request)
            handle = self._local.get(run.run_id)
            if handle is not None:
                handle.deliver(request)
        if not wait:
            return CancelResult(outcome=Outcome.STOPPING, run=run)
        final = await self._await_end(run.run_id, deadline)
        if final is None:
            return CancelResult(outcome=Outcome.STOPPING, run=run)
        return CancelResult(outcome=_outcome_of(final), run=final)

    async def _await_end(self, run_id: str, deadline: float) -> RunInfo | None:
        """The run's final record once it ends, or None if the deadline comes first. A notice
        without the record is checked against Redis; if the run is still active there, the
        wait goes on."""
        remaining = deadline - asyncio.get_running_loop().time()
        try:
            async with asyncio.timeout(max(remaining, 0)):
                while True:
                    future = self._waiters.add(run_id)
                    try:
                        final = await future
                    finally:
                        self._waiters.discard(run_id, future)
                    if final is None:
                        final = await self._store.get_run(run_id)
                    if final is None or not final.is_active:
                        return final
                    self._waiters.forget(run_id)
        except TimeoutError:
            return None

    # -- messages, sweeps ---------------------------------------------------------------------

    def _on_message(self, data: str) -> None:
        """A message on this node's channel: act on it only if it is sealed (on a signed bus),
        fresh, unseen, and addressed to this incarnation; count every one dropped, by why."""
        body = decode(data)
        rejection = Rejection.MALFORMED if body is None else self._signer.check(body)
        message = parse_message(body) if body is not None and rejection is None else None
        if rejection is None and message is None:
            rejection = Rejection.MALFORMED
        if message is not None and not addressed_to(message, self._node_id, self.epoch):
            rejection = Rejection.MISADDRESSED
        if rejection is not None or message is None:
            self._reject(rejection or Rejection.MALFORMED)
            return
        if isinstance(message, CancelMessage):
            self._on_cancel_message(message)
        else:
            self._waiters.resolve(message.run_id, message.run)

    def _reject(self, why: Rejection) -> None:
        self.stats.messages_rejected += 1
        field = f"messages_{why.value}"
        setattr(self.stats, field, getattr(self.stats, field) + 1)

    def _on_cancel_message(self, message: CancelMessage) -> None:
        handle = self._local.get(message.run_id)
        if handle is None:
            self._early_cancels.put(message.run_id, message.request)
            return
        if message.target.startswith("session:") and (
            handle.session is None or message.target != session_target(handle.session)
        ):
            self._reject(Rejection.MISADDRESSED)
            return
        if handle.deliver(message.request):
            self.stats.cancels_delivered += 1

    async def _on_subscribed(self) -> None:
        await self._sweep()

    async def _sweep_forever(self) -> None:
        while self._state in ("running", "draining"):
            await asyncio.sleep(self._sweep_interval)
            try:
                await self._sweep()
            except Exception:  # the safety net must outlive any failure
                raise_if_cancelling()
                log.exception("cancel-bus: sweep failed")

    async def _sweep(self) -> None:
        """The safety net of the doorbell: deliver every cancel pending on our runs, and answer
        local waiters whose run has ended, from the stored state."""
        try:
            pending = await self._store.pending_cancels(self._node_id)
            for run_id, mode in pending.items():
                handle = self._local.get(run_id)
                current = handle.cancel_requested if handle is not None else None
                if handle is None or (current and current.mode.strength >= mode.strength):
                    continue
                run = await self._store.get_run(run_id)
                request = run.cancel_request if run is not None else None
                if request is not None and handle.deliver(request):
                    self.stats.cancels_recovered_by_sweep += 1
            waited = self._waiters.run_ids()
            for run in await self._store.get_runs(waited):
                if not run.is_active:
                    self._waiters.resolve(run.run_id, run)
            if self._unconfirmed:
                await self._reissue_accepted()
        except BusUnavailable as exc:
            log.debug("cancel-bus: sweep skipped: %s", exc)

    # -- lease events (LeaseHolder protocol) --------------------------------------------------

    async def lease_renewed(self, recorded_runs: int) -> None:
        self._outbox.retry_now()
        if recorded_runs != len(self._local) + len(self._outbox) and not self._reconciling:
            self._reconciling = True
            try:
                await self._reconcile()
            except BusUnavailable as exc:
                log.warning("cancel-bus: reconcile failed: %s", exc)
            finally:
                self._reconciling = False

    async def lease_lost(self, cause: StopCause, why: str) -> None:
        """Stop every local run, with the cause. Fenced (``lease_lost``: Redis said so): the
        runs' records are resolved by others; rejoin as a new incarnation. Out of contact for
        the self-fence deadline (``redis_unreachable``): the lease may still be ours; the
        heartbeat goes on and tells."""
        if cause is StopCause.LEASE_LOST:
            self.stats.leases_lost += 1
        else:
            self.stats.self_fences += 1
        log.error("cancel-bus: node %s stops its runs: %s (%s)", self._node_id, cause.value, why)
        for handle in list(self._local.values()):
            handle.stop(cause)
        if cause is StopCause.LEASE_LOST:
            self._tasks.append(asyncio.create_task(self._rejoin()))

    async def lease_missing(self) -> None:
        """Redis forgot this node (restart without persistence, failover with lag): register the
        same incarnation again and re-assert its runs, waiters and accepted cancels."""
        log.warning("cancel-bus: Redis lost node %s; re-asserting its state", self._node_id)
        async with self._rejoining:
            try:
                await self._lease.register(self._node_id, restore=True)
            except Fenced:
                self._lease.valid = False
                await self.lease_lost(StopCause.LEASE_LOST, "fenced before Redis forgot it")
                return
            except BusUnavailable as exc:
                log.warning("cancel-bus: re-registration failed, retrying next beat: %s", exc)
                return
            try:
                await self._reconcile()
                for run_id in self._waiters.run_ids():
                    await self._store.add_waiter(run_id, self._node_id)
                self._unconfirmed.update(iter(self._accepted))
                await self._reissue_accepted()
            except BusUnavailable as exc:
                log.warning("cancel-bus: re-assertion incomplete, retrying next beat: %s", exc)
                return
        await self._sweep()

    def count_reaped(self, runs: int, nodes: int) -> None:
        self.stats.runs_reaped += runs
        self.stats.nodes_reaped += nodes

    async def _rejoin(self) -> None:
        async with self._rejoining:
            while self._state in ("running", "draining"):
                node_id = self._node_id if self._fixed_node_id else _new_node_id()
                try:
                    await self._lease.register(node_id)
                except CancelBusError as exc:
                    raise_if_cancelling()
                    log.warning("cancel-bus: rejoin failed, retrying: %s", exc)
                    await asyncio.sleep(self._lease.interval)
                    continue
                if node_id != self._node_id:
                    self._node_id = node_id
                    await self._start_listener(timeout=max(5.0, self.lease_ttl))
                for run_id in self._waiters.run_ids():
                    with contextlib.suppress(BusUnavailable):
                        await self._store.add_waiter(run_id, self._node_id)
                log.warning("cancel-bus: rejoined as %s (epoch %s)", node_id, self.epoch)
                return

    async def _reconcile(self) -> None:
        """Make Redis's list of our runs match the runs we hold."""
        recorded = await self._store.node_run_ids(self._node_id)
        for run_id, handle in list(self._local.items()):
            if run_id in recorded or handle.epoch != self._lease.epoch:
                continue
            code, detail = await self._store.reassert_run(
                run_id, self._node_id, handle.epoch, handle.record()
            )
            if code in ("ok", "recreated"):
                self.stats.runs_reasserted += code == "recreated"
            elif code in ("finished", "foreign"):  # no longer ours: its record says why
                log.warning("cancel-bus: run %s is %s in Redis (%s)", run_id, code, detail)
                handle.stop(StopCause.LEASE_LOST)
        grace = self.clock() - self.lease_ttl
        strays = [i for i in recorded if i not in self._local and i not in self._outbox]
        for run in await self._store.get_runs(strays):
            if run.is_active and run.owner == self._node_id and (run.started_at or 0) < grace:
                await self._resolve_stray(run)

    async def _resolve_stray(self, run: RunInfo) -> None:
        """A run Redis says we own but we do not hold (e.g. its process state was lost)."""
        code, _, _ = await self._store.finish_run(
            run_id=run.run_id,
            node_id=self._node_id,
            epoch=self._lease.epoch,
            status=RunStatus.FAILED,
            stop_cause=None,
            output="",
            output_truncated=False,
            error="not running on its owner",
            phase=None,
            delivered_at=None,
            observed_at=None,
            record={},
        )
        if code == "ok":
            self.stats.orphans_resolved += 1

    async def _reissue_accepted(self) -> None:
        """Record again the cancels this node accepted shortly before Redis lost them. A run its
        owner has not re-asserted yet is tried again at the next sweep (for two leases)."""
        for run_id in list(self._unconfirmed):
            request = self._accepted.get(run_id)
            if request is None:
                self._unconfirmed.discard(run_id)
                continue
            answer = await self._store.request_cancel(
                run_id=run_id,
                session=None,
                target=run_target(run_id),
                mode=request.mode,
                reason=request.reason,
                requested_by=request.requested_by,
                waiter="",
                caller=self._node_id,
            )
            if answer.code == "not_found":
                continue
            self._unconfirmed.discard(run_id)
            handle = self._local.get(run_id)
            if handle is not None and answer.run is not None and answer.run.cancel_request:
                handle.deliver(answer.run.cancel_request)

    # -- internals ----------------------------------------------------------------------------

    async def _write_finish(self, handle: RunHandle, status: RunStatus, error: str | None) -> None:
        code, final, _ = await self._store.finish_run(
            run_id=handle.run_id,
            node_id=self._node_id,
            epoch=handle.epoch,
            status=status,
            stop_cause=handle.stop_cause,
            output=handle.output,
            output_truncated=handle.output_truncated,
            error=error[:MAX_TEXT] if error else None,
            phase=handle.phase,
            delivered_at=handle.delivered_at,
            observed_at=handle.observed_at,
            record=handle.record(),
        )
        if code == "missing":
            raise BusUnavailable("Redis lost this node's record; retrying after it re-registers")
        self._local.pop(handle.run_id, None)
        if not self._local:
            self._local_empty.set()
        self._accepted.pop(handle.run_id)
        if code == "fenced":
            self.stats.finishes_fenced += 1
            log.warning(
                "cancel-bus: finish of %s refused: this incarnation was fenced", handle.run_id
            )
            return
        handle.final_status = RunStatus(final)

    async def _cancel_local_runs(self, timeout: float) -> None:
        handles = list(self._local.values())
        if not handles:
            return

        async def cancel_one(handle: RunHandle) -> None:
            try:
                await self.cancel(
                    handle.run_id,
                    mode=CancelMode.IMMEDIATE,
                    reason="node_shutdown",
                    requested_by=self._node_id,
                    timeout=timeout,
                )
            except CancelBusError:
                handle.stop(StopCause.NODE_SHUTDOWN)

        await asyncio.gather(*(cancel_one(h) for h in handles))
        if self._local:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._local_empty.wait(), timeout)

    async def _leave(self) -> None:
        if not self._lease.valid:
            return
        while True:
            code, done = await self._store.leave_node(self._node_id, self._lease.epoch)
            if code != "ok" or done:
                return

    async def _start_listener(self, timeout: float) -> None:
        if self._listener_task is not None:
            self._listener_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener_task
        channel = self.keys.channel(self._node_id)
        self._listener = Listener(
            lambda: self._topology.subscriber(channel),
            channel,
            sharded=self._topology.cluster,
            on_message=self._on_message,
            on_subscribed=self._on_subscribed,
            ping_interval=min(5.0, self._lease.interval),
        )
        self._listener_task = asyncio.create_task(self._listener.run_forever())
        try:
            await self._listener.wait_subscribed(timeout)
        except TimeoutError as exc:
            raise BusUnavailable("could not subscribe to the node channel") from exc

    async def _shutdown_tasks(self) -> None:
        """Stop the background tasks, within a bound: redis-py can swallow a cancellation in a
        rare race, so each loop also has a stop flag and a stuck one is left behind, logged."""
        for loop in (self._lease, self._sync, self._outbox, self._listener):
            if loop is not None:
                loop.stop()
        tasks = [*self._tasks, *([self._listener_task] if self._listener_task else [])]
        for task in tasks:
            task.cancel()
        if tasks:
            _, stuck = await asyncio.wait(tasks, timeout=SHUTDOWN_SECONDS)
            for task in stuck:
                log.warning("cancel-bus: background task did not stop in time: %r", task)
        self._tasks.clear()
        self._listener_task = None

    def _store_on(self, topology: Topology, retention: float) -> RunStore:
        pub_command = "SPUBLISH" if topology.cluster else "PUBLISH"
        return RunStore(
            topology.client,
            self.keys,
            retention=retention,
            pub_command=pub_command,
            signer=self._signer,
        )

    async def _close_client(self) -> None:
        for topology in (self._topology, self._lease_topology):
            with contextlib.suppress(Exception):
                await topology.aclose()

    def _require_open(self, accepting: bool = False) -> None:
        if self._state == "running" or (self._state == "draining" and not accepting):
            return
        raise BusClosed(
            "the bus is draining and accepts no new runs"
            if self._state == "draining"
            else f"the bus is {self._state}"
        )


def _outcome_of(final: RunInfo) -> Outcome:
    if final.end_reason == "owner_lost":
        return Outcome.OWNER_LOST
    if final.status is RunStatus.CANCELLED:
        return Outcome.CANCELLED
    return Outcome.ALREADY_FINISHED


def _new_node_id() -> str:
    host = "".join(c if c.isalnum() or c in "._-" else "-" for c in socket.gethostname())[:100]
    return f"{host or 'node'}-{os.getpid()}-{secrets.token_hex(3)}"


def _run_id(run_id: str | None) -> str:
    return uuid.uuid4().hex if run_id is None else validate_id(run_id, "run_id")


def _session(
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


def _metadata(metadata: dict[str, Any] | None) -> dict[str, Any] | None:
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise InvalidArgument("metadata must be a dict")
    try:
        size = len(json.dumps(metadata))
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"metadata must be JSON-serialisable: {exc}") from None
    _require(size <= 16384, "metadata must be at most 16 KiB as JSON")
    return metadata


def _mode(mode: CancelMode | str) -> CancelMode:
    try:
        return CancelMode(mode)
    except ValueError:
        valid = ", ".join(m.value for m in CancelMode)
        raise InvalidArgument(f"invalid cancel mode {mode!r} (one of {valid})") from None


def _key_bytes(key: str | bytes) -> bytes:
    _require(isinstance(key, str | bytes) and len(key) > 0, "a signing key must not be empty")
    return key.encode() if isinstance(key, str) else key


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise InvalidArgument(message)
