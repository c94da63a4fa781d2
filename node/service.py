"""One node at run time: its buses (one per namespace), the runs it started, its drain."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import time
from collections.abc import Coroutine
from typing import Any

from cancel_bus import (
    CancelBus,
    CancelBusError,
    CancelResult,
    RunCancelled,
    RunExists,
    RunHandle,
    RunInfo,
    RunStatus,
    SelectorResult,
    StopCause,
    Tombstone,
    recency,
)

from .agent import record_cancellation, run_agent
from .metrics import Metrics
from .queries import WINDOW, RunQuery
from .schemas import CancelBody, NodeView, SelectorCancel, StartRun
from .settings import Settings
from .sse import Streams
from .supervisor import EmbeddedSupervisor

log = logging.getLogger("cancel_bus.node")


class NodeService:
    """The node's buses: one per namespace it serves (``namespace``, plus those named in
    ``app_namespaces``), each with its own lease and subscription; runs go to their app's."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.streams = Streams(
            self.metrics.open_streams, self.metrics.streams_dropped, settings.sse_send_timeout
        )
        self.embedded = EmbeddedSupervisor(settings)
        self._buses: dict[str, CancelBus] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._runs: set[asyncio.Task[None]] = set()  # the agents this node runs
        self.drain_started = asyncio.Event()  # ends the node's open streams
        self.drain_deadline: float | None = None  # (Redis clock) when its runs are cancelled
        self._stop_now = asyncio.Event()  # cuts the drain short

    @property
    def bus(self) -> CancelBus:
        """The bus of the default namespace."""
        assert self._buses, "the node is not started"
        return self._buses[self.settings.namespace]

    @property
    def buses(self) -> list[CancelBus]:
        """The buses, one per namespace, the default namespace's first."""
        return list(self._buses.values())

    def bus_for_app(self, app_name: str) -> CancelBus:
        """The bus of the app's namespace (``app_namespaces``, else the default)."""
        namespace = self.settings.app_namespaces.get(app_name, self.settings.namespace)
        return self._buses[namespace]

    async def start(self) -> None:
        """Start the embedded server (without a Redis URL) and join each namespace; a failure
        (:class:`CancelBusError` when Redis is not there) leaves nothing running. Once started,
        a no-op."""
        if self._buses:
            return
        try:
            await self._join()
        except BaseException:
            buses = list(self._buses.values())
            self._buses.clear()
            await asyncio.gather(*(bus.close() for bus in buses), return_exceptions=True)
            self.embedded.stop()
            raise
        if self.embedded.server is not None:
            self._keep(self.embedded.watch())

    def _keep(self, job: Coroutine[Any, Any, None]) -> None:
        """Run ``job`` until the node stops."""
        task = asyncio.create_task(job)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _join(self) -> None:
        s = self.settings
        url = s.redis_connection_url() or self.embedded.start()
        for namespace in dict.fromkeys([s.namespace, *s.app_namespaces.values()]):
            self._buses[namespace] = bus = CancelBus(
                url,
                namespace=namespace,
                node_id=s.node_id,
                lease_ttl=s.lease_ttl,
                retention=s.retention,
                signing_key=s.signing_key.get_secret_value() if s.signing_key else None,
                verification_keys=s.accepted_keys(),
                self_fence_after=s.self_fence_after,
                profile_checkpoints=s.profile_checkpoints,
                accept_eviction=s.accept_eviction,
            )
            await bus.start()
        self.metrics.watch(self._buses)

    @property
    def draining(self) -> bool:
        """The drain has started: readiness fails, new runs are refused."""
        return self.drain_started.is_set()

    async def drain(self) -> None:
        """Readiness fails, runs get ``drain_timeout`` to end (or until :meth:`stop_now`), the
        rest are cancelled (``node_shutdown``) and recorded, open streams end; then the node
        leaves the cluster."""
        if self.draining:
            return
        runs = list(self._runs)
        timeout = self.settings.drain_timeout
        if self._buses:
            self.drain_deadline = self.bus.clock() + (timeout if runs else 0.0)
        self.drain_started.set()
        for bus in self.buses:
            bus.begin_drain()  # the other nodes see it draining too
        if runs and timeout > 0:
            until = time.strftime("%H:%M:%S", time.localtime(time.time() + timeout))
            log.warning(
                "draining: %d run(s) active; they have %g s (until %s) to finish, then they are "
                "cancelled (node_shutdown). Ctrl-C again (or another SIGTERM) cancels them now.",
                len(runs),
                timeout,
                until,
            )
            await self._wait_runs(runs, timeout)
        left = sum(len(bus.local_runs()) for bus in self.buses)
        if left:
            why = "stopping now" if self._stop_now.is_set() else "drain timeout"
            log.warning("%s: cancelling %d run(s) (node_shutdown)", why, left)
        elif runs:
            log.info("drained: every run finished")
        await asyncio.gather(*(bus.close() for bus in self.buses))

    def stop_now(self) -> None:
        """End the drain's wait: the runs still going are cancelled at once."""
        self._stop_now.set()

    async def _wait_runs(self, runs: list[asyncio.Task[None]], timeout: float) -> None:
        ended = asyncio.ensure_future(asyncio.wait(runs))
        stop = asyncio.ensure_future(self._stop_now.wait())
        await asyncio.wait({ended, stop}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        for waiter in (ended, stop):  # cancels the waits, not the runs
            waiter.cancel()
        await asyncio.gather(ended, stop, return_exceptions=True)

    async def stop(self) -> None:
        """Drain, then cancel the node's tasks still going, and stop the embedded server."""
        await self.drain()
        for task in list(self._tasks | self._runs):
            task.cancel()
        await asyncio.gather(*self._tasks, *self._runs, return_exceptions=True)
        self.embedded.stop()

    async def find_run(self, run_id: str) -> tuple[CancelBus, RunInfo] | None:
        """The run and the bus of its namespace (a run id is looked up in every one)."""
        found = await asyncio.gather(*(bus.get_run(run_id) for bus in self.buses))
        for bus, run in zip(self.buses, found, strict=True):
            if run is not None:
                return bus, run
        return None

    async def query_runs(self, query: RunQuery) -> tuple[list[RunInfo], bool]:
        """One page of the runs ``query`` asks for, most recent first, and whether more follow.
        Filters the library takes are passed to it; the others are applied here, over a window
        of the most recent runs that grows until the page is full (at most :data:`WINDOW`)."""
        wanted = query.offset + query.limit + 1  # one more tells whether there is more
        fetch = min(max(wanted, 100) if query.narrows else wanted, WINDOW)
        now = self.bus.clock()
        wanted_runs = query.filter
        while True:
            runs = await self._list(query, fetch)
            matched = [run for run in runs if wanted_runs.matches(run, now)]
            if len(matched) >= wanted or len(runs) < fetch or fetch == WINDOW:
                break
            fetch = min(fetch * 4, WINDOW)
        page = matched[query.offset : query.offset + query.limit]
        return page, len(matched) > query.offset + query.limit

    async def _list(self, query: RunQuery, limit: int) -> list[RunInfo]:
        """The most recent ``limit`` runs that match the library's filters, across the
        namespaces (only the app's, given an app). Given a parent, its children are read as
        such (however old)."""
        buses = [self.bus_for_app(query.app_name)] if query.app_name is not None else self.buses
        if query.parent is not None:
            lists = await asyncio.gather(*(bus.children(query.parent) for bus in buses))
        else:
            lists = await asyncio.gather(
                *(
                    bus.list_runs(query.status, query.node_id, query.app_name, query.user_id, limit)
                    for bus in buses
                )
            )
        runs = heapq.merge(
            *(sorted(runs, key=recency, reverse=True) for runs in lists), key=recency, reverse=True
        )
        return list(itertools.islice(runs, limit))

    async def list_nodes(self) -> list[NodeView]:
        """The live nodes in a stable order (by id), with the state of their lease; this node
        says ``draining`` of itself while it drains (unless its lease already expired)."""
        now = self.bus.clock()
        views = [NodeView.of(node, now) for node in await self.bus.list_nodes()]
        here = self.bus.node_id
        if self.draining:
            views = [
                view.model_copy(update={"state": "draining"})
                if view.node_id == here and view.state != "expired"
                else view
                for view in views
            ]
        return sorted(views, key=lambda n: n.node_id)

    async def start_run(self, body: StartRun) -> RunInfo:
        """Register the run here and start the agent; returns once it is recorded running (or
        queued behind its session's active run: strategy ``enqueue``, it starts here later).
        Raises :class:`RunExists` or :class:`RunCancelled` for a given id that is taken."""
        if body.run_id is not None:
            await self._check_claimable(body.run_id, (body.app_name, body.user_id, body.session_id))
        registered: asyncio.Future[RunInfo] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(self._execute(body, registered))
        self._runs.add(task)
        task.add_done_callback(self._runs.discard)
        return await registered  # as its start recorded it: no second round trip

    async def _check_claimable(self, run_id: str, session: tuple[str, str, str]) -> None:
        """A given run id must be new in every namespace, or name a queued run of this very
        session in its app's namespace. The start script checks its own namespace atomically;
        this also covers the others (an id is unique across the node's namespaces)."""
        found = await self.find_run(run_id)
        if found is None:
            return
        bus, run = found
        claimable = (
            bus is self.bus_for_app(session[0])
            and run.status is RunStatus.QUEUED
            and (run.app_name, run.user_id, run.session_id) == session
        )
        if not claimable:
            raise RunExists(run_id, run.status.value)

    async def cancel(
        self, bus: CancelBus, run_id: str, body: CancelBody, requested_by: str
    ) -> CancelResult:
        """Cancel the run, on its namespace's bus, as ``body`` asks; counted in the metrics."""
        result = await bus.cancel(
            run_id,
            mode=body.mode,
            reason=body.reason,
            requested_by=requested_by,
            wait=body.wait,
            timeout=body.timeout,
        )
        self.metrics.observe_cancel(bus.namespace, result)
        return result

    async def cancel_session(
        self, session: tuple[str, str, str], body: CancelBody, requested_by: str
    ) -> CancelResult:
        """Cancel the session's active run, on its app's bus, as ``body`` asks; counted in the
        metrics."""
        bus = self.bus_for_app(session[0])
        result = await bus.cancel_session(
            *session,
            mode=body.mode,
            reason=body.reason,
            requested_by=requested_by,
            wait=body.wait,
            timeout=body.timeout,
        )
        self.metrics.observe_cancel(bus.namespace, result)
        return result

    async def cancel_where(self, body: SelectorCancel, requested_by: str) -> list[SelectorResult]:
        """The selector cancel on each bus it concerns (only the app's, given an app), each
        with its own tombstone; a ``min_age`` is read on that bus's clock."""
        app_name = body.app_name
        buses = [self.bus_for_app(app_name)] if app_name is not None else self.buses

        async def select(bus: CancelBus) -> SelectorResult:
            started_before = body.started_before
            if body.min_age is not None:
                started_before = bus.clock() - body.min_age
            result = await bus.cancel_where(
                run_id=body.run_id,
                app_name=app_name,
                user_id=body.user_id,
                session_id=body.session_id,
                node_id=body.node_id,
                metadata=body.metadata,
                started_before=started_before,
                dry_run=body.dry_run,
                ttl=body.ttl,
                until=body.until,
                mode=body.mode,
                reason=body.reason,
                requested_by=requested_by,
                wait=body.wait,
                timeout=body.timeout,
            )
            for cancelled in result.results:
                self.metrics.observe_cancel(bus.namespace, cancelled)
            return result

        return list(await asyncio.gather(*(select(bus) for bus in buses)))

    async def tombstones(self) -> list[tuple[CancelBus, Tombstone]]:
        """The live tombstones of every namespace, soonest to expire first."""
        lists = await asyncio.gather(*(bus.tombstones() for bus in self.buses))
        found = [
            (bus, tombstone)
            for bus, tombstones in zip(self.buses, lists, strict=True)
            for tombstone in tombstones
        ]
        return sorted(found, key=lambda item: item[1].expires_at)

    def cancel_soon(self, bus: CancelBus, run_id: str, reason: str) -> None:
        """Cancel without waiting, from a context that is going away (a closed stream): the
        request's cause is the client's disconnect."""

        async def cancel() -> None:
            with contextlib.suppress(Exception):
                await bus.cancel(
                    run_id,
                    reason=reason,
                    requested_by=bus.node_id,
                    cause=StopCause.CLIENT_DISCONNECT,
                    wait=False,
                )

        self._keep(cancel())

    async def _execute(self, body: StartRun, registered: asyncio.Future[RunInfo]) -> None:
        bus = self.bus_for_app(body.app_name)
        handle: RunHandle | None = None

        def queued(run: RunInfo) -> None:
            if not registered.done():
                registered.set_result(run)

        try:
            async with bus.run(
                body.run_id,
                app_name=body.app_name,
                user_id=body.user_id,
                session_id=body.session_id,
                metadata={"agent": body.agent.model_dump()},
                relay=True,
                parent=body.parent,
                multitask_strategy=body.multitask_strategy,
                interrupt_mode=body.interrupt_mode,
                interrupt_timeout=body.interrupt_timeout,
                on_queued=queued,
            ) as run:
                handle = run
                if not registered.done():
                    registered.set_result(run.info)
                self._started(bus, run)
                try:
                    await run_agent(run, body.agent)
                except (RunCancelled, asyncio.CancelledError):
                    record_cancellation(run)
                    raise
        except asyncio.CancelledError:
            registered.cancel()
            raise
        except RunCancelled as exc:
            if not registered.done():
                registered.set_exception(exc)
            # else: cancelled while queued, and recorded so; nothing ran
        except Exception as exc:
            if registered.done():
                log.warning("run failed: %s: %s", type(exc).__name__, exc)
            else:
                registered.set_exception(exc)
        if handle is not None:
            await self._observe_end(bus, handle.run_id)

    def _started(self, bus: CancelBus, run: RunHandle) -> None:
        """A run of this service entered its scope (its agent starts now): counted."""
        self.metrics.runs_started.labels(bus.namespace).inc()

    async def _observe_end(self, bus: CancelBus, run_id: str) -> None:
        """Count the run's end as Redis recorded it (status, end reason, duration)."""
        with contextlib.suppress(CancelBusError):
            final = await bus.get_run(run_id)
            if final is not None and not final.is_active:
                self.metrics.observe_finished(bus.namespace, final)
