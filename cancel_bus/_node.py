"""One node's rooms: built and wired together, started in order, and stopped in order."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from ._caller import CallerSide
from ._errors import BusClosed, BusUnavailable, CancelBusError
from ._inbox import Inbox
from ._keys import KeySpace
from ._lease import Lease
from ._local import LocalRuns
from ._messages import MessageSigner
from ._outbox import Outbox
from ._recovery import Recovery
from ._redis import Topology, connect
from ._selection import Selections
from ._state import Lifecycle
from ._store import RunStore
from ._sync import RunSync
from ._types import BusStats
from ._waiters import Waiters

log = logging.getLogger("cancel_bus")

SHUTDOWN_SECONDS = 3.0
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
        version: str,
    ) -> None:
        self.keys = keys
        self.lifecycle = Lifecycle()
        self._signer = MessageSigner(keys.namespace, signing_keys, self.clock)
        self.topology = connect(url, client_name=f"cancel-bus.{node_id}")
        self.store = self._store_on(self.topology, retention)
        # The lease has connections of its own: work holding or queued for the main pool (64
        # followers in a blocking read, a burst of finishes) must not hold up the heartbeat.
        self._lease_topology = connect(
            url, client_name=f"cancel-bus.{node_id}.lease", max_connections=2
        )
        self.lease = Lease(
            self._store_on(self._lease_topology, retention),
            node_id=node_id,
            lease_ttl=lease_ttl,
            self_fence_after=self_fence_after,
            version=version,
        )
        self.waiters = Waiters()
        self.sync = RunSync(self.store, lambda: self.lease.node_id, stats)
        self.outbox = Outbox()
        self.local = LocalRuns(
            store=self.store,
            lease=self.lease,
            sync=self.sync,
            outbox=self.outbox,
            lifecycle=self.lifecycle,
            stats=stats,
            max_output_chars=max_output_chars,
            profile_checkpoints=profile_checkpoints,
        )
        self.inbox = Inbox(
            topology=self.topology,
            store=self.store,
            lease=self.lease,
            signer=self._signer,
            local=self.local,
            waiters=self.waiters,
            lifecycle=self.lifecycle,
            stats=stats,
            sweep_interval=sweep_interval,
        )
        self.recovery = Recovery(
            lease=self.lease,
            store=self.store,
            local=self.local,
            inbox=self.inbox,
            outbox=self.outbox,
            waiters=self.waiters,
            lifecycle=self.lifecycle,
            stats=stats,
            fixed_node_id=fixed_node_id,
        )
        self.lease.holder = self.recovery
        self.lease.probe = lambda: self.inbox.probe_back
        self.selections = Selections(self.store, self.clock)
        self.caller = CallerSide(
            node_id=lambda: self.lease.node_id,
            store=self.store,
            local=self.local,
            recovery=self.recovery,
            waiters=self.waiters,
            stats=stats,
        )
        self._tasks: list[asyncio.Task[None]] = []

    def problems(self) -> list[str]:
        """Why the node is not ready, in words (empty: ready)."""
        problems = []
        if self.lifecycle.phase != "running":
            problems.append(f"the bus is {self.lifecycle.phase}")
        if not self.lease.fresh:
            problems.append("its lease was not renewed within the last lease")
        channel = self.inbox.problem
        if channel is not None:
            problems.append(channel)
        return problems

    def clock(self) -> float:
        return self.lease.clock()

    async def start(self) -> None:
        """Register the lease, subscribe to the node's channel, then start the loops. A start that
        fails leaves no node behind: a registration it made is withdrawn."""
        if self.lifecycle.phase != "new":
            raise BusClosed(f"the bus cannot start: it is {self.lifecycle.phase}")
        self.lifecycle.phase = "starting"
        registered = False
        try:
            await self.lease.register(self.lease.node_id)
            registered = True
            await self.inbox.subscribe(timeout=max(5.0, self.lease.lease_ttl))
        except BaseException:
            await self.shutdown_tasks()
            if registered:
                with contextlib.suppress(CancelBusError, TimeoutError):
                    await asyncio.wait_for(self.lease.leave(), LEAVE_SECONDS)
            self.lifecycle.phase = "new"
            raise
        self.lifecycle.phase = "running"
        for job in (
            self.lease.run_forever(),
            self.sync.run_forever(),
            self.outbox.run_forever(),
            self.inbox.sweep_forever(),
            self.inbox.probe_forever(),
        ):
            self._tasks.append(asyncio.create_task(job))
        log.info("cancel-bus: node %s joined namespace %s", self.lease.node_id, self.keys.namespace)

    async def close(self, drain_timeout: float, cancel_timeout: float) -> None:
        """Refuse new runs, give local runs ``drain_timeout`` to end, cancel the rest, write what
        is pending, release the lease, stop the loops and the clients."""
        if self.lifecycle.phase in ("closed", "new"):
            self.lifecycle.phase = "closed"
            await self._close_clients()
            return
        self.lifecycle.phase = "draining"
        if drain_timeout > 0:
            await self.local.wait_empty(drain_timeout)
        await self.local.drain(cancel_timeout)
        with contextlib.suppress(BusUnavailable, TimeoutError):
            await asyncio.wait_for(self.outbox.flush(), cancel_timeout)
        left = False
        with contextlib.suppress(CancelBusError, TimeoutError):
            await asyncio.wait_for(self.lease.leave(), cancel_timeout)
            left = True
        self.lifecycle.phase = "closed"
        await self.shutdown_tasks()
        await self._close_clients()
        if left:
            log.info("cancel-bus: node %s left", self.lease.node_id)
        else:
            log.warning(
                "cancel-bus: node %s stopped without releasing its lease (Redis did not answer): "
                "its lease expires, and a live node resolves its runs",
                self.lease.node_id,
            )

    async def shutdown_tasks(self) -> None:
        """Stop the background tasks, within a bound: redis-py can swallow a cancellation in a
        rare race, so each loop also has a stop flag and a stuck one is left behind, logged."""
        for loop in (self.lease, self.sync, self.outbox, self.inbox):
            loop.stop()
        tasks = [*self._tasks, *self.inbox.tasks, *self.recovery.tasks]
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
        for topology in (self.topology, self._lease_topology):
            with contextlib.suppress(Exception):
                await topology.aclose()
