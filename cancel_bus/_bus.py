"""CancelBus: one node's view of the cluster — the wiring of its rooms, and the public calls.

A cross-node cancel crosses five rooms, each once, in one direction: ``cancel`` here ->
``_store`` (the ``request_cancel`` script records the request, then the owner is told on its
own channel) -> on the owner, ``_inbox`` (verify the message) -> ``_local`` (find the run) ->
``_run`` (set its token); the run raises at its next checkpoint, its scope writes the finish
(``_local`` -> ``_store``), and the finish notice answers the caller waiting here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from types import TracebackType
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from . import _checks as check
from ._errors import BusClosed, BusUnavailable, CancelBusError, RunExists, SessionBusy
from ._follow import follow
from ._inbox import Inbox
from ._keys import KeySpace, new_node_id, validate_id
from ._lease import Lease
from ._local import Delivery, LocalRuns
from ._messages import MessageSigner, run_target, session_target
from ._outbox import Outbox
from ._recovery import Recovery
from ._redis import Topology, connect
from ._run import RunHandle, RunScope, RunSpec
from ._selection import Selections
from ._state import Lifecycle
from ._store import RunStore, StatusFilter
from ._sync import RunSync
from ._types import (
    BusStats,
    CancelMode,
    CancelResult,
    NodeInfo,
    Outcome,
    RunEvent,
    RunInfo,
    RunStatus,
    SelectorResult,
    StopCause,
    Tombstone,
)
from ._version import VERSION
from ._waiters import Waiters

log = logging.getLogger("cancel_bus")

SHUTDOWN_SECONDS = 3.0


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
        profile_checkpoints: bool = False,
        version: str = VERSION,
    ) -> None:
        """``signing_key`` seals every bus message; ``verification_keys`` are accepted too (key
        rotation). ``self_fence_after``: seconds without an answer from Redis after which the
        node stops its runs (``redis_unreachable``); default ``max(60, 3 * lease_ttl)``.
        ``profile_checkpoints``: record, per run and code site, the longest stretch between
        checkpoints (``RunInfo.slowest_checkpoints``) — where a run cannot be cancelled
        promptly; it costs a little on every checkpoint."""
        self.keys = KeySpace(namespace)
        if node_id is not None:
            validate_id(node_id, "node_id")
        check.require(lease_ttl >= 0.3, "lease_ttl must be at least 0.3 seconds")
        check.require(retention >= 1, "retention must be at least 1 second")
        check.require(sweep_interval > 0, "sweep_interval must be positive")
        check.require(max_output_chars >= 0, "max_output_chars must not be negative")
        if self_fence_after is None:
            self_fence_after = max(60.0, 3 * lease_ttl)
        check.require(self_fence_after >= lease_ttl, "self_fence_after must be at least lease_ttl")
        keys = check.signing_keys(signing_key, list(verification_keys))
        fixed_node_id = node_id is not None
        node_id = node_id or new_node_id()
        self.stats = BusStats()
        self._lifecycle = Lifecycle()
        self._signer = MessageSigner(namespace, keys, self.clock)
        self._topology = connect(url, client_name=f"cancel-bus.{node_id}")
        self._store = self._store_on(self._topology, retention)
        # The lease has connections of its own: work holding or queued for the main pool (64
        # followers in a blocking read, a burst of finishes) must not hold up the heartbeat.
        self._lease_topology = connect(
            url, client_name=f"cancel-bus.{node_id}.lease", max_connections=2
        )
        self._lease = Lease(
            self._store_on(self._lease_topology, retention),
            node_id=node_id,
            lease_ttl=lease_ttl,
            self_fence_after=self_fence_after,
            version=version,
        )
        self._waiters = Waiters()
        self._sync = RunSync(self._store, lambda: self._lease.node_id, self.stats)
        self._outbox = Outbox()
        self._local = LocalRuns(
            store=self._store,
            lease=self._lease,
            sync=self._sync,
            outbox=self._outbox,
            lifecycle=self._lifecycle,
            stats=self.stats,
            max_output_chars=max_output_chars,
            profile_checkpoints=profile_checkpoints,
        )
        self._inbox = Inbox(
            topology=self._topology,
            store=self._store,
            lease=self._lease,
            signer=self._signer,
            local=self._local,
            waiters=self._waiters,
            lifecycle=self._lifecycle,
            stats=self.stats,
            sweep_interval=sweep_interval,
        )
        self._recovery = Recovery(
            lease=self._lease,
            store=self._store,
            local=self._local,
            inbox=self._inbox,
            outbox=self._outbox,
            waiters=self._waiters,
            lifecycle=self._lifecycle,
            stats=self.stats,
            fixed_node_id=fixed_node_id,
        )
        self._lease.holder = self._recovery
        self._lease.probe = lambda: self._inbox.probe_back
        self._selections = Selections(self._store, self.clock)
        self._tasks: list[asyncio.Task[None]] = []

    # -- lifecycle ----------------------------------------------------------------------------

    @property
    def node_id(self) -> str:
        """This incarnation's id (a new one after a lease loss, unless the id was given)."""
        return self._lease.node_id

    @property
    def epoch(self) -> str:
        return self._lease.epoch

    @property
    def lease_ttl(self) -> float:
        return self._lease.lease_ttl

    @property
    def redis(self) -> Redis | RedisCluster:
        return self._topology.client

    @property
    def ready(self) -> bool:
        """Running, holding its lease (renewed within the last lease), subscribed to its
        channel, and its probes of that channel coming back (see :attr:`problems`)."""
        return not self.problems

    @property
    def problems(self) -> list[str]:
        """Why the node is not ready, in words (empty: ready)."""
        problems = []
        if self._lifecycle.phase != "running":
            problems.append(f"the bus is {self._lifecycle.phase}")
        if not self._lease.fresh:
            problems.append("its lease was not renewed within the last lease")
        channel = self._inbox.problem
        if channel is not None:
            problems.append(channel)
        return problems

    @property
    def draining(self) -> bool:
        return self._lifecycle.phase == "draining"

    @property
    def pubsub_reconnects(self) -> int:
        return self._inbox.reconnects

    def clock(self) -> float:
        """Now on the Redis server clock (estimated from heartbeats)."""
        return self._lease.clock()

    async def start(self) -> None:
        if self._lifecycle.phase != "new":
            raise BusClosed(f"the bus cannot start: it is {self._lifecycle.phase}")
        self._lifecycle.phase = "starting"
        try:
            await self._lease.register(self.node_id)
            await self._inbox.subscribe(timeout=max(5.0, self.lease_ttl))
        except BaseException:
            await self._shutdown_tasks()
            self._lifecycle.phase = "new"
            raise
        self._lifecycle.phase = "running"
        for job in (
            self._lease.run_forever(),
            self._sync.run_forever(),
            self._outbox.run_forever(),
            self._inbox.sweep_forever(),
            self._inbox.probe_forever(),
        ):
            self._tasks.append(asyncio.create_task(job))
        log.info("cancel-bus: node %s joined namespace %s", self.node_id, self.keys.namespace)

    async def close(self, drain_timeout: float = 0.0, cancel_timeout: float = 5.0) -> None:
        """Leave the cluster: refuse new runs, give local runs ``drain_timeout`` to end, cancel the
        rest (reason ``node_shutdown``), write what is pending, release the lease."""
        if self._lifecycle.phase in ("closed", "new"):
            self._lifecycle.phase = "closed"
            await self._close_clients()
            return
        self._lifecycle.phase = "draining"
        if drain_timeout > 0:
            await self._local.wait_empty(drain_timeout)
        await self._local.drain(cancel_timeout)
        with contextlib.suppress(BusUnavailable, TimeoutError):
            await asyncio.wait_for(self._outbox.flush(), cancel_timeout)
        with contextlib.suppress(CancelBusError, TimeoutError):
            await asyncio.wait_for(self._lease.leave(), cancel_timeout)
        self._lifecycle.phase = "closed"
        await self._shutdown_tasks()
        await self._close_clients()
        log.info("cancel-bus: node %s left", self.node_id)

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
        parent: str | None = None,
        detached: bool = False,
    ) -> RunScope:
        """Run here: ``async with bus.run(...) as run``. A queued run of that id is claimed.

        ``relay=True`` makes what the run emits readable by :meth:`follow` on any node. A run
        started inside another run's code (its task, or tasks it started) is that run's child,
        as one given a ``parent`` run id is (from any node): cancelling the parent cancels it,
        and it never starts once the parent's cancel is accepted. ``detached`` starts no child."""
        spec = RunSpec(
            run_id=check.run_id(run_id),
            session=check.session(app_name, user_id, session_id),
            metadata=check.run_metadata(metadata),
            relay=relay,
            parent=check.parent(parent, detached),
        )
        return RunScope(self._local, spec)

    async def enqueue(
        self,
        run_id: str | None = None,
        *,
        app_name: str | None = None,
        user_id: str | None = None,
        session_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        parent: str | None = None,
        detached: bool = False,
    ) -> RunInfo:
        """Record a queued run (no owner yet); ``bus.run(run_id=...)`` on any node claims it.
        Its parent as for :meth:`run`; a run that must never start (its parent's cancel was
        accepted, a tombstone matches it) is recorded ``cancelled`` at once and returned so."""
        self._lifecycle.require_open()
        run_id = check.run_id(run_id)
        session = check.session(app_name, user_id, session_id)
        code, run, detail = await self._store.enqueue_run(
            run_id, session, check.run_metadata(metadata), check.parent(parent, detached)
        )
        if code == "session_busy":
            assert session is not None
            raise SessionBusy(session, detail)
        if code == "exists":
            raise RunExists(run_id, detail)
        assert run is not None
        return run

    def local_runs(self) -> list[RunHandle]:
        return self._local.handles()

    # -- any node -----------------------------------------------------------------------------

    async def cancel(
        self,
        run_id: str,
        *,
        mode: CancelMode | str = CancelMode.CHECKPOINT,
        reason: str | None = None,
        requested_by: str | None = None,
        cause: StopCause | str = StopCause.USER,
        wait: bool = True,
        timeout: float = 5.0,
        descendants: bool = True,
    ) -> CancelResult:
        """Ask the run to stop, from any node. With ``wait``, return once its owner confirms
        (``cancelled``) or at ``timeout`` (``stopping``: recorded, it will still be honoured).
        ``cause`` says who asks (``user``, ``client_disconnect``, ``node_shutdown``). With
        ``descendants`` the runs started below it are cancelled too (cause ``parent``), deepest
        first, and the answer holds one result per run of the tree."""
        validate_id(run_id, "run_id")
        target = run_target(run_id)
        return await self._cancel(
            target, run_id, None, mode, reason, requested_by, cause, wait, timeout, descendants
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
        cause: StopCause | str = StopCause.USER,
        wait: bool = True,
        timeout: float = 5.0,
        descendants: bool = True,
    ) -> CancelResult:
        """Cancel the active run of a session key, wherever it runs (as :meth:`cancel`)."""
        session = check.session(app_name, user_id, session_id)
        assert session is not None
        target = session_target(session)
        return await self._cancel(
            target, None, session, mode, reason, requested_by, cause, wait, timeout, descendants
        )

    async def cancel_where(
        self,
        *,
        run_id: str | None = None,
        app_name: str | None = None,
        user_id: str | None = None,
        session_id: str | None = None,
        node_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        started_before: float | None = None,
        dry_run: bool = False,
        ttl: float | None = None,
        until: float | None = None,
        mode: CancelMode | str = CancelMode.CHECKPOINT,
        reason: str | None = None,
        requested_by: str | None = None,
        wait: bool = False,
        timeout: float = 5.0,
    ) -> SelectorResult:
        """Cancel every active run matching all the criteria given (at least one; ``metadata``:
        the run's metadata holds these keys and values; ``node_id``: its owner;
        ``started_before``: a server-clock time), with its descendants. ``dry_run`` only
        counts them. With ``ttl`` (seconds) or ``until`` (a server-clock time), a tombstone
        also cancels matching runs started, claimed or queued until then (see
        :meth:`tombstones`)."""
        selector = check.selector(
            run_id, app_name, user_id, session_id, node_id, metadata, started_before
        )
        hold = check.hold(ttl, until, self.clock())
        checked_mode = check.mode(mode)
        check.text(reason, "reason")
        check.text(requested_by, "requested_by", limit=200)
        check.timeout(timeout)
        self._lifecycle.require_open()

        async def cancel(matched: str) -> CancelResult:
            return await self.cancel(
                matched,
                mode=checked_mode,
                reason=reason,
                requested_by=requested_by,
                wait=wait,
                timeout=timeout,
            )

        return await self._selections.cancel_where(
            selector,
            dry_run=dry_run,
            hold=hold,
            mode=checked_mode,
            reason=reason,
            requested_by=requested_by,
            cancel=cancel,
        )

    async def tombstones(self) -> list[Tombstone]:
        """The live tombstones of :meth:`cancel_where`, soonest to expire first."""
        self._lifecycle.require_open()
        return await self._selections.tombstones()

    async def remove_tombstone(self, tombstone_id: str) -> bool:
        """Lift a tombstone; False if it was not live."""
        validate_id(tombstone_id, "tombstone_id")
        self._lifecycle.require_open()
        return await self._selections.remove_tombstone(tombstone_id)

    async def wait(self, run_id: str, timeout: float = 30.0) -> RunInfo | None:
        """Wait for a run to end (on any node); the run as it stands at the end or the timeout."""
        validate_id(run_id, "run_id")
        check.require(timeout > 0, "timeout must be positive")
        self._lifecycle.require_open()
        deadline = asyncio.get_running_loop().time() + timeout
        try:
            async with asyncio.timeout(timeout):
                status = await self._store.add_waiter(run_id, self.node_id)
        except TimeoutError as exc:
            raise BusUnavailable("no answer from Redis within the timeout") from exc
        if not status:
            return None
        if RunStatus(status).is_active:
            final = await self._waiters.until_end(run_id, deadline, self._store.get_run)
            if final is not None:
                return final
        return await self._store.get_run(run_id)

    async def get_run(self, run_id: str) -> RunInfo | None:
        validate_id(run_id, "run_id")
        self._lifecycle.require_open()
        return await self._store.get_run(run_id)

    async def children(self, run_id: str) -> list[RunInfo]:
        """The runs started as the run's children, on any node, the oldest first (those still
        within the retention)."""
        validate_id(run_id, "run_id")
        self._lifecycle.require_open()
        runs = await self._store.get_runs(sorted(await self._store.child_ids(run_id)))
        return sorted(runs, key=lambda run: run.created_at)

    async def session_run(self, app_name: str, user_id: str, session_id: str) -> RunInfo | None:
        """The active run of a session key, wherever it runs (None if it has none)."""
        session = check.session(app_name, user_id, session_id)
        assert session is not None
        self._lifecycle.require_open()
        return await self._store.session_run(session)

    async def list_runs(
        self,
        status: StatusFilter | str = "active",
        node_id: str | None = None,
        app_name: str | None = None,
        user_id: str | None = None,
        limit: int = 100,
    ) -> list[RunInfo]:
        """Runs across the cluster, newest first. ``status``: "active", "all" or a RunStatus."""
        self._lifecycle.require_open()
        return await self._store.list_runs(
            check.status_filter(status),  # type: ignore[arg-type]
            check.optional_id(node_id, "node_id"),
            check.optional_id(app_name, "app_name"),
            check.optional_id(user_id, "user_id"),
            check.limit(limit),
        )

    async def list_nodes(self) -> list[NodeInfo]:
        self._lifecycle.require_open()
        return await self._store.list_nodes(self.clock())

    async def events(self, run_id: str) -> list[RunEvent]:
        """The run's lifecycle events, oldest first (empty once retention has passed)."""
        validate_id(run_id, "run_id")
        self._lifecycle.require_open()
        return await self._store.events(run_id)

    async def follow(
        self, run_id: str, *, from_start: bool = False, poll: float = 1.0
    ) -> AsyncIterator[RunEvent]:
        """What a relayed run emits (from now on, or ``from_start``), read on any node; ends with
        ``run.finished``. Raises :class:`RunNotFound` for an unknown run."""
        validate_id(run_id, "run_id")
        self._lifecycle.require_open()
        async for event in follow(self._store, run_id, from_start=from_start, poll=poll):
            yield event

    # -- the cancel path ----------------------------------------------------------------------

    async def _cancel(
        self,
        target: str,
        run_id: str | None,
        session: tuple[str, str, str] | None,
        mode: CancelMode | str,
        reason: str | None,
        requested_by: str | None,
        cause: StopCause | str,
        wait: bool,
        timeout: float,
        descendants: bool,
    ) -> CancelResult:
        checked_mode, checked_cause = check.mode(mode), check.cause(cause)
        check.text(reason, "reason")
        check.text(requested_by, "requested_by", limit=200)
        check.timeout(timeout)
        self._lifecycle.require_open()
        deadline = asyncio.get_running_loop().time() + timeout
        try:
            async with asyncio.timeout(timeout):
                answer = await self._store.request_cancel(
                    run_id=run_id,
                    session=session,
                    target=target,
                    mode=checked_mode,
                    reason=reason,
                    requested_by=requested_by,
                    cause=checked_cause,
                    waiter=self.node_id if wait else "",
                    caller=self.node_id,
                    tree=descendants,
                )
        except TimeoutError as exc:
            raise BusUnavailable(
                "no answer from Redis within the timeout; the cancel may not be recorded"
            ) from exc
        self.stats.cancels_requested += 1
        if answer.unheard:  # published, and nobody on an owner's channel heard it
            self.stats.cancels_unheard += answer.unheard
            log.warning(
                "cancel-bus: %d owner(s) not listening: their sweeps deliver", answer.unheard
            )
        nodes = [(answer.code, answer.run), *((code, run) for _, code, run in answer.descendants)]
        for code, node in nodes:
            if code == "stopping" and node is not None and node.cancel_request is not None:
                self._accepted(node)
        finals = await asyncio.gather(
            *(self._end_of(code, node, wait, deadline) for code, node in nodes)
        )
        results = [
            CancelResult(outcome=Outcome(code), run=node) if final is None else final
            for (code, node), final in zip(nodes, finals, strict=True)
        ]
        root, below = results[0], results[1:]
        if root.outcome is Outcome.CANCELLED and any(r.outcome is Outcome.STOPPING for r in below):
            root = CancelResult(outcome=Outcome.STOPPING, run=root.run)  # not until they stop
        if answer.truncated:
            log.warning(
                "cancel-bus: the tree of %s is too large for one cancel: runs left out", target
            )
        return CancelResult(
            outcome=root.outcome, run=root.run, descendants=below, truncated=answer.truncated
        )

    def _accepted(self, run: RunInfo) -> None:
        """A cancel this node had recorded: kept for recovery, and delivered at once if the
        run is here (the owner was not sent a message)."""
        request = run.cancel_request
        assert request is not None
        self._recovery.accepted(run.run_id, request)
        here = run.owner == self.node_id
        if here and self._local.deliver(run.run_id, request) is Delivery.DELIVERED:
            self.stats.cancels_delivered += 1

    async def _end_of(
        self, code: str, run: RunInfo | None, wait: bool, deadline: float
    ) -> CancelResult | None:
        """How a stopping run ended, if it did before the deadline (and the caller waits)."""
        if code != "stopping" or run is None or not wait:
            return None
        final = await self._waiters.until_end(run.run_id, deadline, self._store.get_run)
        return None if final is None else CancelResult(outcome=_outcome_of(final), run=final)

    # -- internals ----------------------------------------------------------------------------

    async def _shutdown_tasks(self) -> None:
        """Stop the background tasks, within a bound: redis-py can swallow a cancellation in a
        rare race, so each loop also has a stop flag and a stuck one is left behind, logged."""
        for loop in (self._lease, self._sync, self._outbox, self._inbox):
            loop.stop()
        tasks = [*self._tasks, *self._inbox.tasks, *self._recovery.tasks]
        for task in tasks:
            task.cancel()
        if tasks:
            _, stuck = await asyncio.wait(tasks, timeout=SHUTDOWN_SECONDS)
            for task in stuck:
                log.warning("cancel-bus: background task did not stop in time: %r", task)
        self._tasks.clear()

    def _store_on(self, topology: Topology, retention: float) -> RunStore:
        return RunStore(
            topology.client,
            self.keys,
            retention=retention,
            pub_command="SPUBLISH" if topology.cluster else "PUBLISH",
            signer=self._signer,
        )

    async def _close_clients(self) -> None:
        for topology in (self._topology, self._lease_topology):
            with contextlib.suppress(Exception):
                await topology.aclose()


def _outcome_of(final: RunInfo) -> Outcome:
    if final.end_reason == "owner_lost":
        return Outcome.OWNER_LOST
    if final.status is RunStatus.CANCELLED:
        return Outcome.CANCELLED
    return Outcome.ALREADY_FINISHED
