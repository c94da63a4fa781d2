"""A node process for the chaos suite: the real node service, plus an audit log (JSON lines) of
what each run's code did, so the checker can prove that no code went on after an observed
cancel and that the finish Redis accepted is the one the node meant."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from contextvars import ContextVar
from typing import Any

from fastapi.responses import JSONResponse

import node.app
import node.service
from cancel_bus import CancelBus, RunCancelled, RunHandle, RunInfo
from node.cli import main
from node.schemas import AgentSpec, StartRun

from .lag import watch_lag

AUDIT = open(os.environ["CHAOS_AUDIT_LOG"], "a", buffering=1)  # noqa: SIM115 (process-long)
LAGS = open(os.environ["CHAOS_AUDIT_LOG"].removesuffix(".jsonl") + ".lag", "a", buffering=1)  # noqa: SIM115
NODE = os.environ.get("CANCEL_BUS_NODE_ID", "?")
run_agent = node.service.run_agent


def audit(event: str, run_id: str, **fields: Any) -> None:
    record = {"at": time.time(), "event": event, "run": run_id, "node": NODE, **fields}
    AUDIT.write(json.dumps(record) + "\n")


class AuditedRun:
    """The handle the agent code sees: every emission and every observed cancel is logged."""

    def __init__(self, handle: RunHandle) -> None:
        self._handle = handle

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "_handle":
            object.__setattr__(self, name, value)
        else:
            setattr(self._handle, name, value)

    def emit(self, text: str) -> None:
        audit("emit", self._handle.run_id)
        self._handle.emit(text)

    def emit_event(self, event_type: str, data: dict[str, Any]) -> None:
        audit("emit", self._handle.run_id, kind=event_type)
        self._handle.emit_event(event_type, data)

    def checkpoint(self) -> None:
        self._observed(self._handle.checkpoint)

    def turn_boundary(self) -> None:
        self._observed(self._handle.turn_boundary)

    def _observed(self, check: Any) -> None:
        try:
            check()
        except RunCancelled:
            audit("observed", self._handle.run_id)
            raise


async def audited_agent(run: RunHandle, spec: AgentSpec) -> None:
    audit("code_start", run.run_id)
    try:
        await run_agent(AuditedRun(run), spec)  # type: ignore[arg-type]
    except RunCancelled:
        audit("code_end", run.run_id, how="cancelled")
        raise
    except asyncio.CancelledError:
        audit("code_end", run.run_id, how="interrupted")
        raise
    except Exception as exc:  # the agents never fail by themselves: log what did
        audit("code_end", run.run_id, how=f"error: {type(exc).__name__}")
        raise
    audit("code_end", run.run_id, how="returned")


_STARTED: ContextVar[RunHandle | None] = ContextVar("started", default=None)  # in _execute's task


def log_lag(began: float, late: float) -> None:
    LAGS.write(json.dumps({"at": began, "late": late, "node": NODE}) + "\n")


class AuditedService(node.service.NodeService):
    watching = False  # the loop's lag (start is called by the server and the app both)

    async def start(self) -> None:
        await super().start()
        if not self.watching:
            self.watching = True
            self._keep(watch_lag(log_lag))

    def _started(self, bus: CancelBus, run: RunHandle) -> None:
        super()._started(bus, run)
        _STARTED.set(run)

    async def _execute(self, body: StartRun, registered: asyncio.Future[RunInfo]) -> None:
        try:
            await super()._execute(body, registered)
        finally:
            handle = _STARTED.get()
            if handle is not None:
                status = handle.final_status.value if handle.final_status else None
                audit("final", handle.run_id, status=status)


def create_app(*args: Any, **kwargs: Any) -> Any:
    """The node's app, and a route that blocks its event loop (the ``loop_blocked`` fault)."""
    app = node_create_app(*args, **kwargs)

    @app.middleware("http")
    async def blocking(request: Any, call_next: Any) -> Any:
        if request.url.path != "/chaos/block":
            return await call_next(request)
        seconds = float(request.query_params["seconds"])
        time.sleep(seconds)  # noqa: ASYNC251 - the fault: the loop blocked
        return JSONResponse({"blocked": seconds})

    return app


node_create_app = node.app.create_app
node.app.create_app = create_app  # type: ignore[assignment]
node.service.run_agent = audited_agent  # type: ignore[assignment]
node.app.NodeService = AuditedService  # type: ignore[misc]

if __name__ == "__main__":
    sys.exit(main(["serve"]))
