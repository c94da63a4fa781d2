"""One node at run time: its Redis (given or embedded), its bus, the runs it started, its drain."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
from typing import IO

from cancel_bus import CancelBus, CancelResult, RunCancelled, RunHandle, RunInfo, RunNotFound

from .agent import record_cancellation, run_agent
from .embedded import EmbeddedServer
from .metrics import Metrics
from .schemas import CancelBody, StartRun
from .settings import Settings

log = logging.getLogger("cancel_bus.node")


class NodeService:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.embedded: EmbeddedServer | None = None
        self._embedded_lock: IO[str] | None = None
        self._bus: CancelBus | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.drain_started = asyncio.Event()  # ends the node's open streams

    @property
    def bus(self) -> CancelBus:
        assert self._bus is not None, "the node is not started"
        return self._bus

    async def start(self) -> None:
        s = self.settings
        url = s.redis_connection_url() or self._start_embedded()
        self._bus = CancelBus(
            url,
            namespace=s.namespace,
            node_id=s.node_id,
            lease_ttl=s.lease_ttl,
            retention=s.retention,
            signing_key=s.signing_key.get_secret_value() if s.signing_key else None,
        )
        await self._bus.start()
        self.metrics.watch(self._bus)

    @property
    def draining(self) -> bool:
        return self.drain_started.is_set()

    async def drain(self) -> None:
        """Readiness fails, runs get ``drain_timeout`` to end, the rest are cancelled
        (``node_shutdown``) and recorded, open streams end; then the node leaves the cluster."""
        if self.draining:
            return
        self.drain_started.set()
        if self._bus is not None:
            log.info("draining: %d run(s) active", len(self._bus.local_runs()))
            await self._bus.close(drain_timeout=self.settings.drain_timeout)

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

    async def start_run(self, body: StartRun) -> RunInfo:
        """Register the run here and start the agent; returns once it is recorded running."""
        registered: asyncio.Future[RunHandle] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(self._execute(body, registered))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        handle = await registered
        self.metrics.runs_started.inc()
        info = await self.bus.get_run(handle.run_id)
        if info is None:
            raise RunNotFound(handle.run_id)
        return info

    async def cancel(self, run_id: str, body: CancelBody, requested_by: str) -> CancelResult:
        result = await self.bus.cancel(
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
        result = await self.bus.cancel_session(
            *session,
            mode=body.mode,
            reason=body.reason,
            requested_by=requested_by,
            wait=body.wait,
            timeout=body.timeout,
        )
        self.metrics.observe_cancel(result)
        return result

    def cancel_soon(self, run_id: str, reason: str) -> None:
        """Cancel without waiting, from a context that is going away (a closed stream)."""

        async def cancel() -> None:
            with contextlib.suppress(Exception):
                await self.bus.cancel(run_id, reason=reason, requested_by="node", wait=False)

        task = asyncio.create_task(cancel())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _execute(self, body: StartRun, registered: asyncio.Future[RunHandle]) -> None:
        try:
            async with self.bus.run(
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
        self.embedded = EmbeddedServer(data_dir=data_dir).start()
        log.warning(
            "no CANCEL_BUS_REDIS_URL: started an embedded server at %s (data in %s)",
            self.embedded.url,
            data_dir,
        )
        return self.embedded.url
