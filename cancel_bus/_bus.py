"""CancelBus: one node's view of the cluster — the public calls, each checked and handed to a
room (``_node`` builds and runs the rooms).

A cross-node cancel's request crosses five rooms, each once, in one direction: ``cancel`` here ->
``_calls`` (the ``request_cancel`` script records the request, then the owner is told on its
own channel) -> on the owner, ``_inbox`` (verify the message) -> ``_local`` (find the run) ->
``_run`` (set its token); the run raises at its next checkpoint, its scope writes the finish
(``_local`` -> ``_calls``). Here, Redis's answer goes to ``_caller``, which waits for the
finish notice.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from types import TracebackType
from typing import Any

from . import _checks as check
from ._filter import RunFilter
from ._follow import follow
from ._keys import KeySpace, new_node_id, validate_id
from ._messages import run_target, session_target
from ._node import Node
from ._protocol import CancelOrder
from ._redis import Client, pool_counts, within
from ._run import RunHandle, RunScope, RunSpec
from ._types import (
    BusStats,
    CancelMode,
    CancelResult,
    MultitaskStrategy,
    NodeInfo,
    RunEvent,
    RunInfo,
    SelectorResult,
    StatusFilter,
    StopCause,
    Tombstone,
)
from ._version import VERSION


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
        accept_eviction: bool = False,
        version: str = VERSION,
    ) -> None:
        """``signing_key`` seals every bus message; ``verification_keys`` are accepted too (key
        rotation). ``self_fence_after``: seconds without an answer from Redis after which the
        node stops its runs (``redis_unreachable``); default ``max(60, 3 * lease_ttl)``.
        ``profile_checkpoints``: record, per run and code site, the longest stretch between
        checkpoints (``RunInfo.slowest_checkpoints``) — where a run cannot be cancelled
        promptly; it costs a little on every checkpoint. ``accept_eviction``: start on a Redis
        whose ``maxmemory-policy`` may evict keys (refused otherwise: it would drop live runs);
        the risk is then one of :attr:`warnings`."""
        self._keys = KeySpace(namespace)
        if node_id is not None:
            validate_id(node_id, "node_id")
        fence_after = check.settings(
            lease_ttl, retention, sweep_interval, max_output_chars, self_fence_after
        )
        keys = check.signing_keys(signing_key, list(verification_keys))
        self.stats = BusStats()
        self._node = Node(
            url,
            self._keys,
            self.stats,
            node_id=node_id or new_node_id(),
            fixed_node_id=node_id is not None,
            lease_ttl=lease_ttl,
            retention=retention,
            sweep_interval=sweep_interval,
            signing_keys=keys,
            self_fence_after=fence_after,
            max_output_chars=max_output_chars,
            profile_checkpoints=profile_checkpoints,
            accept_eviction=accept_eviction,
            version=version,
        )
        self._reads, self._lifecycle = self._node.reads, self._node.lifecycle

    # -- lifecycle ----------------------------------------------------------------------------

    @property
    def node_id(self) -> str:
        """This incarnation's id (a new one after a lease loss, unless the id was given)."""
        return self._node.lease.node_id

    @property
    def epoch(self) -> str:
        """This node's incarnation (its fencing token); ``''`` until started."""
        return self._node.lease.epoch

    @property
    def lease_ttl(self) -> float:
        """Seconds a node's lease lasts without a heartbeat."""
        return self._node.lease.lease_ttl

    @property
    def namespace(self) -> str:
        """The namespace every key and channel of this bus lives in."""
        return self._keys.namespace

    def pool_stats(self) -> dict[str, int]:
        """The command connections by state (``idle``, ``used``); empty where redis-py does not
        count them (a cluster has a pool per shard)."""
        return pool_counts(self._node.topology.client)

    def _adapter_store(self) -> tuple[Client, str]:
        """For this package's adapters that keep records of their own beside the bus's (A2A
        tasks, held cancels): the command client, and the namespace's key prefix to put them
        under."""
        return self._node.topology.client, self._keys.prefix

    @property
    def ready(self) -> bool:
        """Running, holding its lease (renewed within the last lease), subscribed to its
        channel, and its probes of that channel coming back (see :attr:`problems`)."""
        return not self.problems

    @property
    def problems(self) -> list[str]:
        """Why the node is not ready, in words (empty: ready)."""
        return self._node.problems()

    @property
    def warnings(self) -> list[str]:
        """Risks the node runs with that its settings accepted (it stays ready), in words."""
        return self._node.warnings()

    @property
    def draining(self) -> bool:
        """True from :meth:`close` (with a drain) until the node leaves: no new runs."""
        return self._lifecycle.phase == "draining"

    @property
    def pubsub_reconnects(self) -> int:
        """How many times the node's channel subscription was made again."""
        return self._node.subscription.reconnects

    def clock(self) -> float:
        """Now on the Redis server clock (estimated from heartbeats)."""
        return self._node.clock()

    async def start(self) -> None:
        """Register this node, subscribe to its channel and start its background work."""
        await self._node.start()

    def begin_drain(self) -> None:
        """Refuse new runs from now on (:class:`BusClosed`), and tell the cluster: the node's
        record says ``draining`` from its next heartbeat (``list_nodes``). Its runs go on;
        :meth:`close` ends them (and begins the drain itself if it has not begun)."""
        self._node.begin_drain()

    async def close(self, drain_timeout: float = 0.0, cancel_timeout: float = 5.0) -> None:
        """Leave the cluster: refuse new runs, give local runs ``drain_timeout`` to end, cancel the
        rest (reason ``node_shutdown``), write what is pending, release the lease."""
        await self._node.close(drain_timeout, cancel_timeout)

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
        multitask_strategy: MultitaskStrategy | str = MultitaskStrategy.REJECT,
        interrupt_mode: CancelMode | str = CancelMode.CHECKPOINT,
        interrupt_timeout: float = 10.0,
        on_queued: Callable[[RunInfo], object] | None = None,
    ) -> RunScope:
        """Run here: ``async with bus.run(...) as run``. A queued run of that id is claimed.

        ``relay=True`` makes what the run emits readable by :meth:`follow` on any node. A run
        started inside another run's code (its task, or tasks it started) is that run's child,
        as one given a ``parent`` run id is (from any node): cancelling the parent cancels it,
        and it never starts once the parent's cancel is accepted. ``detached`` starts no child.

        A session with an active run (on any node): ``multitask_strategy`` ``reject`` raises
        :class:`SessionBusy`; ``enqueue`` records this run ``queued`` behind it (visible, and
        cancellable from any node: a cancel of the session cancels it too), tells
        ``on_queued`` its record, and enters once the runs before it have ended, in arrival
        order (:class:`RunCancelled` if it was cancelled meanwhile; a wait abandoned — its task
        cancelled, the bus closing — records it cancelled); ``interrupt`` cancels that run
        (``interrupt_mode``, cause ``interrupt``, asked by this run), waits up to
        ``interrupt_timeout`` for its end, then starts (``run.interrupted`` is the run as it
        ended); ``rollback`` as interrupt, the interrupted run recorded with its output
        discarded (end reason ``rolled_back``).
        :class:`SessionBusy` if it did not end in time."""
        session = check.session(app_name, user_id, session_id)
        strategy = check.multitask(multitask_strategy, session)
        spec = RunSpec(
            run_id=check.run_id(run_id),
            session=session,
            metadata=check.run_metadata(metadata),
            relay=relay,
            parent=check.parent(parent, detached),
            strategy=strategy,
            interrupt_mode=check.mode(interrupt_mode),
            interrupt_timeout=check.timeout(interrupt_timeout),
            on_queued=on_queued,
        )
        return RunScope(self._node.local, spec, self._node.caller)

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
        multitask_strategy: MultitaskStrategy | str = MultitaskStrategy.REJECT,
        interrupt_mode: CancelMode | str = CancelMode.CHECKPOINT,
        interrupt_timeout: float = 10.0,
    ) -> RunInfo:
        """Record a queued run (no owner yet); ``bus.run(run_id=...)`` on any node claims it.
        Its parent as for :meth:`run`; a run that must never start (its parent's cancel was
        accepted, a tombstone matches it) is recorded ``cancelled`` at once and returned so.

        A session with an active run: ``multitask_strategy`` as for :meth:`run`, at once —
        ``reject`` raises :class:`SessionBusy`; ``enqueue`` records the run last in the
        session's queue (claimed before its turn, it waits for it on the claiming node);
        ``interrupt``/``rollback`` stop the active run (waiting up to ``interrupt_timeout``)
        and record this one as holding the session (``interrupted`` names the stopped run; the
        claiming run's ``run.interrupted`` is that run as it ended)."""
        self._lifecycle.require_open()
        session = check.session(app_name, user_id, session_id)
        spec = RunSpec(
            run_id=check.run_id(run_id),
            session=session,
            metadata=check.run_metadata(metadata),
            relay=False,
            parent=check.parent(parent, detached),
            strategy=check.multitask(multitask_strategy, session),
            interrupt_mode=check.mode(interrupt_mode),
            interrupt_timeout=check.timeout(interrupt_timeout),
        )
        return await self._node.caller.enqueue(spec)

    def local_runs(self) -> list[RunHandle]:
        """The runs this node is running now."""
        return self._node.local.handles()

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
        return await self._cancel(
            validate_id(run_id, "run_id"),
            None,
            mode,
            reason,
            requested_by,
            cause,
            wait,
            timeout,
            descendants,
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
        return await self._cancel(
            None, session, mode, reason, requested_by, cause, wait, timeout, descendants
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
        check.flag(dry_run, "dry_run")
        check.flag(wait, "wait")
        checked_mode, _ = check.request(mode, StopCause.USER, reason, requested_by, timeout)
        self._lifecycle.require_open()
        return await self._node.selections.cancel_where(
            selector,
            dry_run=dry_run,
            hold=hold,
            mode=checked_mode,
            reason=reason,
            requested_by=requested_by,
            wait=wait,
            timeout=timeout,
        )

    async def tombstones(self) -> list[Tombstone]:
        """The live tombstones of :meth:`cancel_where`, soonest to expire first."""
        self._lifecycle.require_open()
        return await self._node.selections.tombstones()

    async def remove_tombstone(self, tombstone_id: str) -> bool:
        """Lift a tombstone; False if it was not live."""
        validate_id(tombstone_id, "tombstone_id")
        self._lifecycle.require_open()
        return await self._node.selections.remove_tombstone(tombstone_id)

    async def wait(self, run_id: str, timeout: float = 30.0) -> RunInfo | None:
        """Wait for a run to end (on any node); the run as it stands at the end or the timeout."""
        validate_id(run_id, "run_id")
        check.timeout(timeout)
        self._lifecycle.require_open()
        return await self._node.caller.wait(run_id, timeout)

    async def get_run(self, run_id: str) -> RunInfo | None:
        """A run's record, whichever node ran it; ``None`` if Redis has none."""
        validate_id(run_id, "run_id")
        self._lifecycle.require_open()
        return await self._reads.get_run(run_id)

    async def children(self, run_id: str) -> list[RunInfo]:
        """The runs started as the run's children, on any node, the oldest first (those still
        within the retention)."""
        validate_id(run_id, "run_id")
        self._lifecycle.require_open()
        return await self._reads.children(run_id)

    async def session_run(self, app_name: str, user_id: str, session_id: str) -> RunInfo | None:
        """The active run of a session key, wherever it runs (None if it has none)."""
        session = check.session(app_name, user_id, session_id)
        assert session is not None
        self._lifecycle.require_open()
        return await self._reads.session_run(session)

    async def list_runs(
        self,
        status: StatusFilter | str = "active",
        node_id: str | None = None,
        app_name: str | None = None,
        user_id: str | None = None,
        limit: int = 100,
    ) -> list[RunInfo]:
        """Runs across the cluster, newest first. ``status``: "active", "finished", "all" or
        a RunStatus."""
        self._lifecycle.require_open()
        status, node_id, app_name, user_id, limit = check.listing(
            status, node_id, app_name, user_id, limit
        )
        wanted = RunFilter(status=status, node_id=node_id, app_name=app_name, user_id=user_id)
        return await self._reads.list_runs(wanted, limit)

    async def list_nodes(self) -> list[NodeInfo]:
        """The nodes of the namespace whose records Redis holds, with their leases."""
        self._lifecycle.require_open()
        return await self._reads.list_nodes(self.clock())

    async def ping(self, timeout: float = 1.0) -> None:
        """Whether Redis answers now: returns, or raises :class:`BusUnavailable` (or
        :class:`BusMisconfigured`: it refuses this node's user)."""
        await within(check.timeout(timeout), self._reads.ping())

    async def events(self, run_id: str) -> list[RunEvent]:
        """The run's lifecycle events, oldest first (empty once retention has passed)."""
        validate_id(run_id, "run_id")
        self._lifecycle.require_open()
        return await self._reads.events(run_id)

    async def follow(
        self, run_id: str, *, from_start: bool = False, poll: float = 1.0
    ) -> AsyncIterator[RunEvent]:
        """What a relayed run emits (from now on, or ``from_start``), read on any node; ends with
        ``run.finished``. Raises :class:`RunNotFound` for an unknown run."""
        validate_id(run_id, "run_id")
        check.poll(poll)
        self._lifecycle.require_open()
        async for event in follow(self._reads, run_id, from_start=from_start, poll=poll):
            yield event

    # -- the cancel path ----------------------------------------------------------------------

    async def _cancel(
        self,
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
        """A cancel of the run (``run_id``) or of the session's active run (``session``)."""
        checked_mode, checked_cause = check.request(mode, cause, reason, requested_by, timeout)
        if run_id is not None:
            target = run_target(run_id)
        else:
            assert session is not None
            target = session_target(session)
        self._lifecycle.require_open()
        order = CancelOrder(
            target, run_id, session, checked_mode, reason, requested_by, checked_cause, descendants
        )
        return await self._node.caller.cancel(order, wait, timeout)
