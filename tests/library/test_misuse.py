"""What an integrator can get wrong, answered truthfully: a typed error at the call that was
wrong (never a run that hangs, a record that lies, or a bare TypeError), and a second start of
a run id on its own node refused as on any other."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from cancel_bus import InvalidArgument, RunExists, RunStatus
from cancel_bus._notices import Notices

from ..conftest import BusFactory
from ..helpers import WAIT, LoopingRun


async def test_a_run_id_started_twice_on_one_node_is_refused(make_bus: BusFactory) -> None:
    bus = await make_bus()
    first = await LoopingRun(bus, run_id="job-42").start()
    with pytest.raises(RunExists):  # Redis would take it for a retry of the first start
        async with bus.run("job-42"):
            pytest.fail("the second start must not run")
    first.finish.set()
    await first.done()
    final = await bus.get_run("job-42")
    assert final is not None and final.status is RunStatus.SUCCEEDED

    gate = asyncio.Event()

    async def hold() -> None:
        async with bus.run("job-43"):
            await gate.wait()

    starts = [asyncio.create_task(hold()) for _ in range(2)]  # at the same time
    done, _ = await asyncio.wait(starts, timeout=WAIT, return_when=asyncio.FIRST_COMPLETED)
    assert len(done) == 1 and isinstance(done.pop().exception(), RunExists)
    gate.set()
    await asyncio.gather(*starts, return_exceptions=True)
    final = await bus.get_run("job-43")
    assert final is not None and final.status is RunStatus.SUCCEEDED


@pytest.mark.parametrize(
    "misuse",
    [
        lambda run: setattr(run, "phase", 123),
        lambda run: run.emit(b"bytes"),
        lambda run: run.emit(None),
        lambda run: run.emit_event("", {}),
        lambda run: run.emit_event("tool", ["not", "a", "dict"]),
        lambda run: run.emit_event("tool", {"x": object()}),
    ],
)
async def test_a_bad_value_from_the_run_code_is_refused_and_the_run_ends_truly(
    make_bus: BusFactory, misuse: Any
) -> None:
    bus = await make_bus()
    async with bus.run(relay=True) as run:
        with pytest.raises(InvalidArgument):
            misuse(run)
        run.emit("fine")
    final = await bus.get_run(run.run_id)
    assert final is not None and final.status is RunStatus.SUCCEEDED and final.output == "fine"


async def test_a_scope_closed_from_another_task_leaves_no_parent_behind(
    make_bus: BusFactory,
) -> None:
    bus = await make_bus()

    async def stream() -> AsyncIterator[str]:
        async with bus.run("streamed"):
            yield "token"
            await asyncio.sleep(3600)
            yield "never"

    tokens = stream()
    assert await anext(tokens) == "token"  # this task now runs inside "streamed"
    await asyncio.create_task(tokens.aclose())  # closed from another task (a server's cleanup)
    async with bus.run("unrelated") as unrelated:
        pass
    final = await bus.get_run(unrelated.run_id)
    assert final is not None and final.parent is None and final.status is RunStatus.SUCCEEDED


def _deep(levels: int) -> Any:
    value: Any = "leaf"
    for _ in range(levels):
        value = {"next": value}
    return value


@pytest.mark.parametrize(
    ("call", "args"),
    [
        ("wait", {"run_id": "r", "timeout": "5"}),
        ("wait", {"run_id": "r", "timeout": True}),
        ("wait", {"run_id": "r", "timeout": float("inf")}),
        ("cancel", {"run_id": "r", "timeout": True}),
        ("cancel_where", {"user_id": "u", "dry_run": "no"}),
        ("enqueue", {"metadata": {1: "a", "1": "b"}}),  # one key would be lost
        ("enqueue", {"metadata": {"deep": _deep(2000)}}),
    ],
)
async def test_bad_arguments_are_invalid_not_python_errors(
    make_bus: BusFactory, call: str, args: dict[str, Any]
) -> None:
    bus = await make_bus()
    with pytest.raises(InvalidArgument):
        await getattr(bus, call)(**args)


@pytest.mark.parametrize("poll", [0, -1, 6, float("nan"), "1"])
async def test_a_follow_poll_that_would_look_like_an_outage_is_refused(
    make_bus: BusFactory, poll: Any
) -> None:
    bus = await make_bus()
    with pytest.raises(InvalidArgument):
        await anext(bus.follow("some-run", poll=poll))


async def test_a_probe_loop_whose_cancellation_was_swallowed_ends_with_its_task(
    make_bus: BusFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loop cancelled by the event loop's end (no close, no stop flag) must not go on."""
    entered = asyncio.Event()

    async def swallowing(self: Notices, node_id: str, epoch: str, nonce: str) -> int:
        entered.set()
        with contextlib.suppress(asyncio.CancelledError):  # as redis-py can, in a rare race
            await asyncio.sleep(3600)
        return 1

    monkeypatch.setattr(Notices, "probe", swallowing)
    await make_bus(lease_ttl=30.0)  # a probe every 5 s
    await asyncio.wait_for(entered.wait(), WAIT)
    probing = next(task for task in asyncio.all_tasks() if task.get_name() == "cancel-bus probe")
    probing.cancel()
    done, _ = await asyncio.wait({probing}, timeout=2.0)  # not a probe interval later, or never
    assert probing in done


async def test_a_run_that_outlives_its_bus_close_writes_nothing_and_opens_nothing(
    make_bus: BusFactory, raw_redis: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    bus = await make_bus()
    started, stubborn_end = asyncio.Event(), asyncio.Event()

    async def stubborn() -> None:
        async with bus.run("stubborn"):
            started.set()
            while not stubborn_end.is_set():  # its code ignores the cancel for a while
                with contextlib.suppress(asyncio.CancelledError):
                    await stubborn_end.wait()

    task = asyncio.create_task(stubborn())
    await asyncio.wait_for(started.wait(), WAIT)
    name = f"cancel-bus.{bus.node_id}"
    await bus.close(cancel_timeout=0.2)  # its wait for the run ends first
    stubborn_end.set()
    await asyncio.wait_for(task, WAIT)
    clients = await raw_redis.client_list()
    assert not [c for c in clients if c["name"] == name], clients  # no connection reopened
    assert any("ended after its bus closed" in r.getMessage() for r in caplog.records)
