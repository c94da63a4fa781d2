"""A hypothesis state machine drives the library on a real server against a small reference
model: start, enqueue, claim, cancel in each mode from any node, checkpoint, turn boundary,
complete, fail, kill a node, expire its lease, reap. After every step Redis must agree with the
model, and every finished run must have exactly one finish event.

The suite draws the same 25 cases every run (a red CI run is one you can run again);
``CANCEL_BUS_MODEL_CASES=N`` draws N new ones, to explore::

    CANCEL_BUS_MODEL_CASES=500 .venv/bin/pytest -q tests/library/test_model.py --timeout=0
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from cancel_bus import CancelBus, CancelMode, Outcome, RunCancelled, RunHandle, RunStatus
from node.embedded import EmbeddedServer

from ..faultproxy import FaultProxy
from ..helpers import WAIT, crash, keys_of, redis_of

STRENGTH = {CancelMode.AFTER_TURN: 0, CancelMode.CHECKPOINT: 1, CancelMode.IMMEDIATE: 2}
SERVERS: list[EmbeddedServer] = []  # the state machine is built by hypothesis, not by pytest


@dataclass
class Node:
    bus: CancelBus
    proxy: FaultProxy
    alive: bool = True
    expired: bool = False


@dataclass
class Run:
    """The model of one run, and the controls of its body."""

    run_id: str
    owner: Node | None
    status: RunStatus
    mode: CancelMode | None = None
    owner_lost: bool = False
    commands: asyncio.Queue[str] = field(default_factory=asyncio.Queue)
    parked: asyncio.Event = field(default_factory=asyncio.Event)
    handle: RunHandle | None = None
    task: asyncio.Task[None] | None = None

    @property
    def steerable(self) -> bool:
        return (
            self.status is RunStatus.RUNNING
            and self.owner is not None
            and self.owner.alive
            and self.task is not None
            and not self.task.done()
        )


class BusModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.namespace = f"model-{uuid.uuid4().hex[:10]}"
        self.nodes: list[Node] = []
        self.runs: list[Run] = []
        for _ in range(2):
            self._add_node()

    # -- plumbing ------------------------------------------------------------------------

    def _do(self, coro: Any) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coro, WAIT))

    def _add_node(self) -> None:
        async def start() -> Node:
            proxy = await FaultProxy(SERVERS[0].port).start()
            bus = CancelBus(proxy.url, namespace=self.namespace, lease_ttl=600, sweep_interval=3600)
            await bus.start()
            return Node(bus, proxy)

        self.nodes.append(self._do(start()))

    def _live(self) -> list[Node]:
        return [n for n in self.nodes if n.alive]

    async def _body(self, run: Run, bus: CancelBus) -> None:
        try:
            async with bus.run(run.run_id) as handle:
                run.handle = handle
                while True:
                    run.parked.set()
                    command = await run.commands.get()
                    if command == "step":
                        handle.checkpoint()
                    elif command == "turn":
                        handle.turn_boundary()
                    elif command == "complete":
                        return
                    elif command == "fail":
                        raise ValueError("the run failed")
        except (RunCancelled, ValueError):
            pass
        finally:
            run.parked.set()

    def _spawn(self, run: Run, node: Node) -> None:
        run.task = self.loop.create_task(self._body(run, node.bus))
        self._do(run.parked.wait())

    def _command(self, run: Run, command: str) -> None:
        run.parked.clear()
        run.commands.put_nowait(command)
        self._do(run.parked.wait())

    def _settle(self) -> None:
        """Until every delivered cancel has reached its run (immediate ones: run ended)."""

        async def settled() -> None:
            for run in self.runs:
                if run.mode is None or not run.steerable:
                    continue
                while (
                    run.handle is None
                    or run.handle.cancel_requested is None
                    or (STRENGTH[run.handle.cancel_requested.mode] < STRENGTH[run.mode])
                ):
                    await asyncio.sleep(0.001)
                if run.mode is CancelMode.IMMEDIATE:
                    assert run.task is not None
                    await run.task
                    run.status = RunStatus.CANCELLED

        self._do(settled())

    # -- rules ---------------------------------------------------------------------------

    @precondition(lambda self: bool(self._live()))
    @rule(data=st.data())
    def start(self, data: st.DataObject) -> None:
        node = data.draw(st.sampled_from(self._live()))
        run = Run(f"r-{uuid.uuid4().hex[:8]}", node, RunStatus.RUNNING)
        self.runs.append(run)
        self._spawn(run, node)

    @precondition(lambda self: bool(self._live()))
    @rule()
    def enqueue(self) -> None:
        run = Run(f"q-{uuid.uuid4().hex[:8]}", None, RunStatus.QUEUED)
        self._do(self._live()[0].bus.enqueue(run.run_id))
        self.runs.append(run)

    @precondition(
        lambda self: (
            bool(self._live()) and any(r.owner is None and r.task is None for r in self.runs)
        )
    )
    @rule(data=st.data())
    def claim(self, data: st.DataObject) -> None:
        run = data.draw(
            st.sampled_from([r for r in self.runs if r.owner is None and r.task is None])
        )
        node = data.draw(st.sampled_from(self._live()))
        run.owner = node
        if run.status is RunStatus.QUEUED:
            run.status = RunStatus.RUNNING
            self._spawn(run, node)
            return
        with pytest.raises(RunCancelled):  # cancelled while queued: entering raises
            self._do(node.bus.run(run.run_id).__aenter__())

    @precondition(lambda self: bool(self._live()) and bool(self.runs))
    @rule(data=st.data(), mode=st.sampled_from(list(CancelMode)))
    def cancel(self, data: st.DataObject, mode: CancelMode) -> None:
        run = data.draw(st.sampled_from(self.runs))
        via = data.draw(st.sampled_from(self._live()))
        result = self._do(via.bus.cancel(run.run_id, mode=mode, wait=False))
        if run.status.is_terminal:
            assert result.outcome is Outcome.ALREADY_FINISHED
            return
        if run.status is RunStatus.QUEUED:
            assert result.outcome is Outcome.CANCELLED
            run.status, run.mode = RunStatus.CANCELLED, mode
            return
        assert run.owner is not None
        run.mode = mode if run.mode is None or STRENGTH[mode] > STRENGTH[run.mode] else run.mode
        if run.owner.expired:
            assert result.outcome is Outcome.OWNER_LOST
            run.status, run.owner_lost = RunStatus.CANCELLED, True
            return
        assert result.outcome is Outcome.STOPPING
        self._settle()

    @precondition(lambda self: any(r.steerable for r in self.runs))
    @rule(data=st.data(), command=st.sampled_from(["step", "turn", "complete", "fail"]))
    def drive(self, data: st.DataObject, command: str) -> None:
        run = data.draw(st.sampled_from([r for r in self.runs if r.steerable]))
        self._command(run, command)
        stops = run.mode is not None and (
            command in ("turn", "complete", "fail") or run.mode is not CancelMode.AFTER_TURN
        )
        if stops:
            run.status = RunStatus.CANCELLED
        elif command == "complete":
            run.status = RunStatus.SUCCEEDED
        elif command == "fail":
            run.status = RunStatus.FAILED
        assert run.task is not None
        assert run.task.done() == run.status.is_terminal

    @precondition(lambda self: len(self._live()) > 1)
    @rule(data=st.data())
    def kill(self, data: st.DataObject) -> None:
        node = data.draw(st.sampled_from(self._live()))
        self._do(crash(node.bus, node.proxy))
        node.alive = False

    @precondition(lambda self: any(not n.alive and not n.expired for n in self.nodes))
    @rule(data=st.data())
    def expire(self, data: st.DataObject) -> None:
        node = data.draw(st.sampled_from([n for n in self.nodes if not n.alive and not n.expired]))
        keys = keys_of(node.bus)
        live = self._live()[0].bus
        self._do(redis_of(live).zadd(keys.nodes, {node.bus.node_id: time.time() - 1}))
        node.expired = True

    @precondition(lambda self: bool(self._live()))
    @rule()
    def reap(self) -> None:
        self._do(self._live()[0].bus._node.lease.reap())
        for run in self.runs:
            if (
                run.owner is not None
                and run.owner.expired
                and run.status in (RunStatus.RUNNING, RunStatus.WAITING)
            ):
                run.owner_lost = True
                run.status = RunStatus.CANCELLED if run.mode else RunStatus.FAILED

    @precondition(lambda self: len(self._live()) < 3)
    @rule()
    def add_node(self) -> None:
        self._add_node()

    # -- the check -----------------------------------------------------------------------

    @invariant()
    def redis_agrees_with_the_model(self) -> None:
        if not self._live():
            return
        bus = self._live()[0].bus
        for run in self.runs:
            info = self._do(bus.get_run(run.run_id))
            assert info is not None, run.run_id
            assert info.status is run.status, (run.run_id, info.status, run.status)
            assert (info.cancel_requested_at is not None) == (run.mode is not None)
            if run.mode is not None:
                assert info.cancel_mode is run.mode
            assert (info.end_reason == "owner_lost") == run.owner_lost
            events = [e.type for e in self._do(bus.events(run.run_id))]
            assert events.count("run.finished") == (1 if run.status.is_terminal else 0)
            assert events.count("run.cancel_requested") == (1 if run.mode else 0)

    def teardown(self) -> None:
        async def close() -> None:
            for run in self.runs:
                if run.task is not None and not run.task.done():
                    run.task.cancel()
            await asyncio.gather(*(r.task for r in self.runs if r.task), return_exceptions=True)
            for node in self.nodes:
                node.proxy.heal()
                await node.bus.close(cancel_timeout=1)
                await node.proxy.close()

        self._do(close())
        self.loop.close()


@pytest.fixture(autouse=True)
def _server(redis_server: EmbeddedServer) -> None:
    SERVERS[:] = [redis_server]


TestBusModel = BusModel.TestCase
TestBusModel.settings = settings(
    max_examples=int(os.environ.get("CANCEL_BUS_MODEL_CASES", "25")),
    derandomize="CANCEL_BUS_MODEL_CASES" not in os.environ,
    stateful_step_count=30,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
