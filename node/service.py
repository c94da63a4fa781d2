"""One node at run time: its Redis (given or embedded), its bus, the runs it started, its drain."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import heapq
import itertools
import logging
from typing import IO

from cancel_bus import (
    CancelBus,
    CancelResult,
    RunCancelled,
    RunExists,
    RunHandle,
    RunInfo,
    RunStatus,
    StopCause,
)

from .agent import record_cancellation, run_agent
from .embedded import EmbeddedServer, valkey_binary
from .metrics import Metrics
from .schemas import CancelBody, StartRun
from .settings import Settings

log = logging.getLogger("cancel_bus.node")


class NodeService:
    """The node's buses: one per namespace it serves (``namespace``, plus those named in
    ``app_namespaces``), each with its own lease and subscription; runs go to their app's."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.embedded: EmbeddedServer | None = None
        self._embedded_lock: IO[str] | None = None
        self._buses: dict[str, CancelBus] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.drain_started = asyncio.Event()  # ends the node's open streams

    @property
    def bus(self) -> CancelBus:
        """The bus of the default namespace."""
        assert self._buses, "the node is not started"
        return self._buses[self.settings.namespace]

    @property
    def buses(self) -> list[CancelBus]:
        return list(self._buses.values())

    def bus_for_app(self, app_name: str) -> CancelBus:
        namespace = self.settings.app_namespaces.get(app_name, self.settings.namespace)
        return self._buses[namespace]

    async def start(self) -> None:
        s = self.settings
        url = s.redis_connection_url() or self._start_embedded()
        for namespace in dict.fromkeys([s.namespace, *s.app_namespaces.values()]):
            bus = CancelBus(
                url,
                namespace=namespace,
                node_id=s.node_id,
                lease_ttl=s.lease_ttl,
                retention=s.retention,
                signing_key=s.signing_key.get_secret_value() if s.signing_key else None,
                verification_keys=s.accepted_keys(),
                self_fence_after=s.self_fence_after,
            )
            await bus.start()
            self._buses[namespace] = bus
        self.metrics.watch(self._buses)

    @property
    def draining(self) -> bool:
        return self.drain_started.is_set()

    async def drain(self) -> None:
        """Readiness fails, runs get ``drain_timeout`` to end, the rest are cancelled
        (``node_shutdown``) and recorded, open streams end; then the node leaves the cluster."""
        if self.draining:
            return
        self.drain_started.set()
        log.info("draining: %d run(s) active", sum(len(b.local_runs()) for b in self.buses))
        await asyncio.gather(
            *(b.close(drain_timeout=self.settings.drain_timeout) for b in self.buses)
        )

    async def stop(self) -> None:
        await self.drain()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.embedded is not None:
            self.embedded.stop()
            self.embedded = None
        if self._embedded_lock is not None:
            self._embedded_lock.close()

    async def find_run(self, run_id: str) -> tuple[CancelBus, RunInfo] | None:
        """The run and the bus of its namespace (a run id is looked up in every one)."""
        found = await asyncio.gather(*(bus.get_run(run_id) for bus in self.buses))
        for bus, run in zip(self.buses, found, strict=True):
            if run is not None:
                return bus, run
        return None

    async def list_runs(
        self,
        status: str,
        node_id: str | None,
        app_name: str | None,
        user_id: str | None,
        limit: int,
    ) -> list[RunInfo]:
        """Newest first, across the namespaces (only the app's, given an app)."""
        buses = [self.bus_for_app(app_name)] if app_name is not None else self.buses
        lists = await asyncio.gather(
            *(bus.list_runs(status, node_id, app_name, user_id, limit) for bus in buses)
        )
        runs = heapq.merge(*lists, key=lambda run: run.created_at, reverse=True)
        return list(itertools.islice(runs, limit))

    async def start_run(self, body: StartRun) -> RunInfo:
        """Register the run here and start the agent; returns once it is recorded running.
        Raises :class:`RunExists` or :class:`RunCancelled` for a given id that is taken."""
        if body.run_id is not None:
            await self._check_claimable(body.run_id, (body.app_name, body.user_id, body.session_id))
        registered: asyncio.Future[RunHandle] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(self._execute(body, registered))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        handle = await registered
        self.metrics.runs_started.inc()
        return handle.info  # as its start recorded it: no second round trip

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
        result = await bus.cancel(
            run_id,
            mode=body.mode,
            reason=body.reason,
            requested_by=requested_by,
            wait=body.wait,
            timeout=body.timeout,
        )
        self.metrics.observe_cancel(result)
        return result

    async def cancel_session(
        self, session: tuple[str, str, str], body: CancelBody, requested_by: str
    ) -> CancelResult:
        result = await self.bus_for_app(session[0]).cancel_session(
            *session,
            mode=body.mode,
            reason=body.reason,
            requested_by=requested_by,
            wait=body.wait,
            timeout=body.timeout,
        )
        self.metrics.observe_cancel(result)
        return result

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

        task = asyncio.create_task(cancel())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _execute(self, body: StartRun, registered: asyncio.Future[RunHandle]) -> None:
        try:
            async with self.bus_for_app(body.app_name).run(
                body.run_id,
                app_name=body.app_name,
                user_id=body.user_id,
                session_id=body.session_id,
                metadata={"agent": body.agent.model_dump()},
                relay=True,
            ) as run:
                registered.set_result(run)
                try:
                    await run_agent(run, body.agent)
                except (RunCancelled, asyncio.CancelledError):
                    record_cancellation(run)
                    raise
        except asyncio.CancelledError:
            registered.cancel()
            raise
        except Exception as exc:
            if registered.done():
                log.warning("run failed: %s: %s", type(exc).__name__, exc)
            else:
                registered.set_exception(exc)

    def _start_embedded(self) -> str:
        """No Redis URL: run a real server (valkey from PyPI or a local redis-server) whose data
        lives in the user's state dir; one node per data dir."""
        data_dir = self.settings.state_dir() / "redis"
        data_dir.mkdir(parents=True, exist_ok=True)
        lock = (data_dir / "lock").open("w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise RuntimeError(
                f"another node runs an embedded server in {data_dir}; give this one "
                "CANCEL_BUS_REDIS_URL (to share it) or its own CANCEL_BUS_DATA_DIR"
            ) from None
        self._embedded_lock = lock
        self.embedded = EmbeddedServer(data_dir=data_dir, binary=valkey_binary()).start()
        log.warning(
            "no CANCEL_BUS_REDIS_URL: started an embedded server at %s (data in %s)",
            self.embedded.url,
            data_dir,
        )
        return self.embedded.url
