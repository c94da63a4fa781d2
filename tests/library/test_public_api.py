"""The public face: a complete, sorted ``__all__``; no redis error leaks through it."""

from __future__ import annotations

import ast
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType

import pytest

import cancel_bus
from cancel_bus import BusUnavailable, CancelBusError

from ..conftest import BusFactory
from ..faultproxy import FaultProxy

PACKAGE = Path(cancel_bus.__file__).parent


def test_all_is_sorted_and_complete() -> None:
    assert cancel_bus.__all__ == sorted(cancel_bus.__all__)
    public = {
        name
        for name in dir(cancel_bus)
        if not name.startswith("_") and not isinstance(getattr(cancel_bus, name), ModuleType)
    }  # a subpackage (integrations) shows up once something imported it
    public.add("__version__")
    assert set(cancel_bus.__all__) == public


def test_contract_names_exist() -> None:
    from cancel_bus import CancelBus, CancelMode, Outcome, RunCancelled, RunStatus  # noqa: F401

    assert {s.value for s in cancel_bus.RunStatus} == {
        "queued",
        "running",
        "waiting",
        "succeeded",
        "failed",
        "cancelled",
    }
    assert {m.value for m in cancel_bus.CancelMode} == {"checkpoint", "immediate", "after_turn"}
    assert {o.value for o in cancel_bus.Outcome} == {
        "cancelled",
        "stopping",
        "already_finished",
        "not_found",
        "owner_lost",
    }


def test_redis_exceptions_are_imported_only_at_the_translation_boundary() -> None:
    importers = set()
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "redis.exceptions":
                importers.add(path.name)
    assert importers == {"_redis.py"}


def test_all_errors_live_in_one_module() -> None:
    """Every error is defined in ``_errors.py``, except what a run's checkpoint raises, which
    carries the request (``_run_state.py``): the error module imports nothing."""
    for path in PACKAGE.rglob("*.py"):
        if path.name == "_errors.py":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases = {getattr(b, "id", getattr(b, "attr", "")) for b in node.bases}
                if (path.name, node.name) == ("_run_state.py", "RunCancelled"):
                    continue
                assert not bases & {"Exception", "CancelBusError", "ValueError"}, (path, node.name)


async def test_no_redis_error_leaks_from_any_call(make_bus: BusFactory, proxy: FaultProxy) -> None:
    bus = cancel_bus.CancelBus("redis://127.0.0.1:1/0", namespace="leak", lease_ttl=1)
    with pytest.raises(BusUnavailable) as caught:
        await bus.start()
    assert caught.value.__cause__ is not None  # translated with `raise ... from exc`
    await bus.close()

    bus = await make_bus(url=proxy.url, lease_ttl=30)
    proxy.refuse()  # a started bus whose Redis goes away: every call says so, typed

    async def enter_a_run() -> None:
        async with bus.run():
            pass

    async def follow() -> None:
        async for _ in bus.follow("r1"):
            pass

    calls: list[Callable[[], Awaitable[object]]] = [
        bus.enqueue,
        lambda: bus.cancel("r1", timeout=2),
        lambda: bus.cancel_session("a", "u", "s", timeout=2),
        lambda: bus.wait("r1", timeout=2),
        lambda: bus.get_run("r1"),
        bus.list_runs,
        bus.list_nodes,
        lambda: bus.events("r1"),
        follow,
        enter_a_run,
    ]
    for call in calls:
        with pytest.raises(CancelBusError) as caught:
            await call()
        assert isinstance(caught.value, BusUnavailable), caught.value
        assert caught.value.__cause__ is not None or "timeout" in str(caught.value)
    proxy.heal()
