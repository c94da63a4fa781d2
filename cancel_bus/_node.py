"""One node's rooms: built and wired together, started in order, and stopped in order; every
piece of their background work listed here, in one place, and owned by one :class:`Duties`."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from ._batcher import ScriptBatcher
from ._caller import CallerSide
from ._calls import ScriptCalls
from ._duties import Duties, Duty
from ._errors import BusClosed, CancelBusError
from ._inbox import Inbox
from ._keys import KeySpace
from ._lease import Lease
from ._local import LocalRuns
from ._messages import MessageSigner
from ._notices import Notices
from ._outbox import Outbox
from ._probe import ChannelProbe
from ._reads import Reads
from ._recovery import Recovery
from ._redis import Topology, connect
from ._scripts import ALL_SCRIPTS
from ._selection import Selections
from ._server import ServerCheck
from ._state import Lifecycle
from ._subscription import Subscription
from ._sweep import Sweep
from ._sync import RunSync
from ._types import BusStats
from ._waiters import Waiters

log = logging.getLogger("cancel_bus")

LEAVE_SECONDS = 5.0  # to withdraw the registration of a start that failed


class Node:
    """The rooms of one node and their background loops; see docs/DESIGN.md §13 for the map."""

    def __init__(
        self,
        url: str,
        keys: KeySpace,
        stats: BusStats,
        *,
        node_id: str,
        fixed_node_id: bool,
        lease_ttl: float,
        retention: float,
        sweep_interval: float,
        signing_keys: list[bytes],
        self_fence_after: float,
        max_output_chars: int,
        profile_checkpoints: bool,
        accept_eviction: bool,
        version: str,
    ) -> None:
        self.keys = keys
        self.lifecycle = Lifecycle()
        self.duties = Duties()
        self._signer = MessageSigner(keys.namespace, signing_keys, self.clock)
        self.topology = connect(url, client_name=f"cancel-bus.{node_id}")
        self.notices = Notices(
            self.topology.client, keys, pub_command=self.topology.pub_command, signer=self._signer
        )
        self.calls = self._calls_on(self.topology, retention)
        self.reads = Reads(self.topology.client, keys)
        # The lease has connections of its own: work holding or queued for the main pool (64
        # followers in a blocking read, a burst of finishes) must not hold up the heartbeat.
        self._lease_topology = connect(
            url, client_name=f"cancel-bus.{node_id}.lease", max_connections=2
        )
        self.lease = Lease(
            self._calls_on(self._lease_topology, retention),
            node_id=node_id,
            lease_ttl=lease_ttl,
            self_fence_after=self_fence_after,
            version=version,
        )
        self.server = ServerCheck(self.reads, stats, accept_eviction=accept_eviction)
        self.waiters = Waiters()
        self.sync = RunSync(self.calls, self.lease, stats)
        self.outbox = Outbox()
        self.local = LocalRuns(
            calls=self.calls,
            reads=self.reads,
            lease=self.lease,
            sync=self.sync,
            outbox=self.outbox,
            lifecycle=self.lifecycle,
            stats=stats,
            max_output_chars=max_output_chars,
            spawn=self.duties.spawn,
            profile_checkpoints=profile_checkpoints,
        )
        self.probe = ChannelProbe(self.notices, self.lease, stats)
        self.inbox = Inbox(
            lease=self.lease,
            signer=self._signer,
            local=self.local,
            waiters=self.waiters,
            stats=stats,
            probe_came_back=self.probe.came_back,
        )
        self.sweep = Sweep(self.reads, self.lease, self.local, self.waiters, stats, sweep_interval)
        self.subscription = Subscription(
            self.topology,
            keys,
            self.lease,
            receive=self.inbox.receive,
            confirmed=self.sweep.sweep,
        )
        self.recovery = Recovery(
            lease=self.lease,
            calls=self.calls,
            reads=self.reads,
            local=self.local,
            subscription=self.subscription,
            sweep=self.sweep,
            probe=self.probe,
            outbox=self.outbox,
            waiters=self.waiters,
            lifecycle=self.lifecycle,
            stats=stats,
            fixed_node_id=fixed_node_id,
            spawn=self.duties.spawn,
        )
        self.lease.holder = self.recovery
        self.caller = CallerSide(
            lease=self.lease,
            calls=self.calls,
            reads=self.reads,
            local=self.local,
            recovery=self.recovery,
            waiters=self.waiters,
            stats=stats,
        )
        self.selections = Selections(self.calls, self.reads, self.caller, self.clock)

    def problems(self) -> list[str]:
        """Why the node is not ready, in words (empty: ready)."""
        problems = []
        if self.lifecycle.phase != "running":
            problems.append(f"the bus is {self.lifecycle.phase}")
        if not self.lease.fresh:
            problems.append("its lease was not renewed within the last lease")
        for problem in (self.subscription.problem or self.probe.problem, self.server.problem):
            if problem is not None:
                problems.append(problem)
        return problems

    def warnings(self) -> list[str]:
        """Risks the node runs with, accepted by its settings (it stays ready)."""
        return [self.server.warning] if self.server.warning is not None else []

    def clock(self) -> float:
        return self.lease.clock()

    def _duties(self) -> list[Duty]:
        """Every loop of the node once it has joined, with its period and its backoff."""
        return [
            self.lease.duty(),
            self.sync.duty(),
            self.outbox.duty(),
            self.probe.duty(),
            self.sweep.duty(),
            self.server.duty(self.lease.lease_ttl),
        ]

    async def start(self) -> None:
        """Register the lease, subscribe to the node's channel, check the server, then start the
        duties. A start that fails leaves no node behind: a registration it made is withdrawn,
        and every background task is stopped."""
        if self.lifecycle.phase != "new":
            raise BusClosed(f"the bus cannot start: it is {self.lifecycle.phase}")
        self.lifecycle.phase = "starting"
        await self.duties.start()  # first: the calls below may spawn batches into it
        registered = False
        try:
            await self.lease.register(self.lease.node_id)
            registered = True
            self.duties.add(self.subscription.duty())
            await self.subscription.subscribe(timeout=max(5.0, self.lease.lease_ttl))
            await self.server.at_start()
        except BaseException:
            self.lease.stop()
            if registered:
                with contextlib.suppress(CancelBusError, TimeoutError):
                    await asyncio.wait_for(self.lease.leave(), LEAVE_SECONDS)
            await self.duties.stop()
            self.lifecycle.phase = "new"
            raise
        self.lifecycle.phase = "running"
        for duty in self._duties():
            self.duties.add(duty)
        log.info("cancel-bus: node %s joined namespace %s", self.lease.node_id, self.keys.namespace)

    def begin_drain(self) -> None:
        """Refuse new runs from now on; the node's record says so from its next heartbeat."""
        if self.lifecycle.phase == "running":
            self.lifecycle.phase = "draining"
        self.lease.draining = True

    async def close(self, drain_timeout: float, cancel_timeout: float) -> None:
        """Refuse new runs, give local runs ``drain_timeout`` to end, cancel the rest, write what
        is pending, release the lease, stop the duties and the clients."""
        if self.lifecycle.phase in ("closed", "new"):
            self.lifecycle.phase = "closed"
            await self.duties.stop()
            await self._close_clients()
            return
        self.begin_drain()
        if drain_timeout > 0:
            await self.local.wait_empty(drain_timeout)
        await self.local.drain(cancel_timeout)
        with contextlib.suppress(CancelBusError, TimeoutError):
            await asyncio.wait_for(self.outbox.flush(), cancel_timeout)
        left = False
        with contextlib.suppress(CancelBusError, TimeoutError):
            await asyncio.wait_for(self.lease.leave(), cancel_timeout)
            left = True
        self.lifecycle.phase = "closed"
        self.lease.stop()
        await self.duties.stop()
        await self._close_clients()
        if left:
            log.info("cancel-bus: node %s left", self.lease.node_id)
        else:
            log.warning(
                "cancel-bus: node %s stopped without releasing its lease (Redis did not answer): "
                "its lease expires, and a live node resolves its runs",
                self.lease.node_id,
            )

    def _calls_on(self, topology: Topology, retention: float) -> ScriptCalls:
        notices = Notices(
            topology.client, self.keys, pub_command=topology.pub_command, signer=self._signer
        )
        batches = ScriptBatcher(topology.client, ALL_SCRIPTS, self.duties.spawn)
        return ScriptCalls(batches, self.keys, retention=retention, notices=notices)

    async def _close_clients(self) -> None:
        for topology in (self.topology, self._lease_topology):
            with contextlib.suppress(Exception):
                await topology.aclose()
