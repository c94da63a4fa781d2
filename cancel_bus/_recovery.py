"""What a node does when its lease renews, is lost, or Redis forgot it (the lease's holder):
reconcile its runs with Redis, rejoin as a new incarnation, re-assert what Redis lost, and
record again the cancels it accepted lately.

* Renewed, but Redis lists another number of runs for the node than it holds: re-assert the
  missing ones, resolve the strays (``failed``, "not running on its owner") once older than a
  lease.
* Lost (``lease_lost``: Redis said so): stop every run, rejoin (a new node id if it was
  generated, the same id and a new epoch if it was given). Unrenewed until the lease may run out
  (``redis_unreachable``, the lease's fence): stop every run; the lease may still be ours.
* Forgotten (a restart without persistence, a failover with lag): register the same
  incarnation again, re-assert its runs and waiters, re-issue the cancels it accepted in the
  last two leases (each until its run is back), then sweep.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from ._calls import ScriptCalls
from ._duties import Spawn, raise_if_cancelling
from ._errors import BusClosed, BusUnavailable, CancelBusError, Fenced
from ._keys import new_node_id
from ._messages import run_target
from ._ports import Channel, Deferred, LeaseControl, Owner, SelfProbe, Sweeper
from ._protocol import CancelOrder, Code, Finish
from ._reads import Reads
from ._state import Lifecycle
from ._timed import TimedMap
from ._types import BusStats, CancelRequest, RunInfo, RunStatus, StopCause
from ._waiters import Waiters

log = logging.getLogger("cancel_bus")


class Recovery:
    def __init__(
        self,
        *,
        lease: LeaseControl,
        calls: ScriptCalls,
        reads: Reads,
        local: Owner,
        subscription: Channel,
        sweep: Sweeper,
        probe: SelfProbe,
        outbox: Deferred,
        waiters: Waiters,
        lifecycle: Lifecycle,
        stats: BusStats,
        fixed_node_id: bool,
        spawn: Spawn,
    ) -> None:
        self._lease = lease
        self._calls = calls
        self._reads = reads
        self._local = local
        self._subscription = subscription
        self._sweep = sweep
        self._probe = probe
        self._outbox = outbox
        self._waiters = waiters
        self._lifecycle = lifecycle
        self._stats = stats
        self._fixed_node_id = fixed_node_id
        self._accepted: TimedMap[str, CancelRequest] = TimedMap(2 * lease.lease_ttl, 100_000)
        self._unconfirmed: set[str] = set()  # accepted cancels to record again
        self._spawn = spawn
        self._rejoining = asyncio.Lock()
        self._reconciling = False

    def accepted(self, run_id: str, request: CancelRequest) -> None:
        """This node had a cancel recorded: keep it, to record again if Redis loses it."""
        self._accepted.put(run_id, request)

    # -- the LeaseHolder protocol -------------------------------------------------------------

    async def lease_renewed(self, recorded_runs: int) -> None:
        self._outbox.retry_now()
        try:
            if not self._local.agrees_with(recorded_runs) and not self._reconciling:
                self._reconciling = True
                try:
                    await self._reconcile()
                finally:
                    self._reconciling = False
            if self._unconfirmed:
                await self._reissue_accepted()
        except BusUnavailable as exc:
            log.warning("cancel-bus: reconcile failed: %s", exc)

    def lease_lost(self, cause: StopCause, why: str) -> None:
        if cause is StopCause.LEASE_LOST:
            self._stats.leases_lost += 1
        else:
            self._stats.self_fences += 1
        log.error(
            "cancel-bus: node %s stops its runs: %s (%s)", self._lease.node_id, cause.value, why
        )
        self._local.stop_all(cause)
        if cause is StopCause.LEASE_LOST:
            with contextlib.suppress(BusClosed):  # the node is closing: no rejoin
                self._spawn("rejoin", self._rejoin())

    async def lease_missing(self) -> None:
        log.warning("cancel-bus: Redis lost node %s; re-asserting its state", self._lease.node_id)
        async with self._rejoining:
            try:
                await self._lease.register(self._lease.node_id, restore=True)
            except Fenced:
                self._lease.valid = False
                self.lease_lost(StopCause.LEASE_LOST, "fenced before Redis forgot it")
                return
            except BusUnavailable as exc:
                log.warning("cancel-bus: re-registration failed, retrying next beat: %s", exc)
                return
            try:
                await self._reconcile()
                for run_id in self._waiters.run_ids():
                    await self._calls.add_waiter(run_id, self._lease.node_id)
                self._unconfirmed.update(iter(self._accepted))
                await self._reissue_accepted()
            except BusUnavailable as exc:
                log.warning("cancel-bus: re-assertion incomplete, retrying next beat: %s", exc)
                return
        await self._sweep.sweep()

    def count_reaped(self, runs: int, nodes: int) -> None:
        self._stats.runs_reaped += runs
        self._stats.nodes_reaped += nodes

    def probe_back(self) -> tuple[float, float] | None:
        return self._probe.probe_back

    # -- internals ----------------------------------------------------------------------------

    async def _rejoin(self) -> None:
        async with self._rejoining:
            while self._lifecycle.active:
                old_id = self._lease.node_id
                node_id = old_id if self._fixed_node_id else new_node_id()
                try:
                    await self._lease.register(node_id)
                except CancelBusError as exc:
                    raise_if_cancelling()
                    log.warning("cancel-bus: rejoin failed, retrying: %s", exc)
                    await asyncio.sleep(self._lease.patience)
                    continue
                if node_id != old_id:
                    await self._subscription.subscribe(timeout=max(5.0, self._lease.lease_ttl))
                for run_id in self._waiters.run_ids():
                    with contextlib.suppress(BusUnavailable):
                        await self._calls.add_waiter(run_id, node_id)
                log.warning("cancel-bus: rejoined as %s (epoch %s)", node_id, self._lease.epoch)
                return

    async def _reconcile(self) -> None:
        """Make Redis's list of our runs match the runs we hold."""
        me = self._lease.identity
        node_id, epoch = me.node_id, me.epoch
        recorded = await self._reads.node_run_ids(node_id)
        for state in self._local.states():
            if state.run_id in recorded or state.epoch != epoch or state.finishing:
                continue
            answer = await self._calls.reassert_run(
                state.run_id, node_id, state.epoch, state.record()
            )
            if answer.code in (Code.OK, Code.RECREATED):
                self._stats.runs_reasserted += answer.code is Code.RECREATED
            elif answer.code in (Code.FINISHED, Code.FOREIGN):  # no longer ours: says why
                detail = answer.status or answer.owner
                log.warning(
                    "cancel-bus: run %s is %s in Redis (%s)", state.run_id, answer.code, detail
                )
                state.stop(StopCause.LEASE_LOST, self._lease.clock())
        grace = self._lease.clock() - self._lease.lease_ttl
        strays = [i for i in recorded if i not in self._local and i not in self._outbox]
        for run in await self._reads.get_runs(strays):
            if run.is_active and run.owner == node_id and (run.started_at or 0) < grace:
                await self._resolve_stray(run)

    async def _resolve_stray(self, run: RunInfo) -> None:
        """A run Redis says we own but we do not hold (e.g. its process state was lost)."""
        stray = Finish(
            run_id=run.run_id,
            node_id=self._lease.node_id,
            epoch=self._lease.epoch,
            status=RunStatus.FAILED,
            stop_cause=None,
            output="",
            output_truncated=False,
            error="not running on its owner",
            phase=None,
            delivered_at=None,
            observed_at=None,
            record=dict,
        )
        if (await self._calls.finish_run(stray)).code is Code.OK:
            self._stats.orphans_resolved += 1

    async def _reissue_accepted(self) -> None:
        """Record again the cancels this node accepted shortly before Redis lost them. A run its
        owner has not re-asserted yet is tried again at the next beat (for two leases)."""
        for run_id in list(self._unconfirmed):
            request = self._accepted.get(run_id)
            if request is None:
                self._unconfirmed.discard(run_id)
                continue
            order = CancelOrder(
                run_target(run_id),
                run_id,
                None,
                request.mode,
                request.reason,
                request.requested_by,
                request.cause,
            )
            answer = await self._calls.request_cancel(order, waiter="", caller=self._lease.node_id)
            if answer.code in (Code.NOT_FOUND, Code.RECOVERING):
                continue
            self._unconfirmed.discard(run_id)
            run = answer.run
            if run is not None and run.cancel_request and run.owner == self._lease.node_id:
                self._local.deliver(run_id, run.cancel_request)
