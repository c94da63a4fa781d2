"""Runs of a cancel tree found from their records, as ops see them from any node."""

from __future__ import annotations

from dataclasses import dataclass

from cancel_bus import CancelBus, RunInfo
from cancel_bus.integrations._a2a_calls import PHASE

from ..helpers import eventually


async def children(ops: CancelBus, parent: RunInfo) -> list[RunInfo]:
    """The runs started under ``parent`` (on any node)."""
    return await ops.children(parent.run_id)


@dataclass(frozen=True)
class Call:
    """An A2A call made by a run's code (``send_message``): the caller's run, the call's."""

    caller: RunInfo
    run: RunInfo

    @property
    def task_id(self) -> str:
        """The remote task."""
        assert self.run.phase is not None and self.run.phase.startswith(PHASE)
        return self.run.phase.removeprefix(PHASE)


async def remote_call(ops: CancelBus, app: str, user: str) -> Call:
    """The A2A call made by the (last) run of ``(app, user)`` (the run's only child), once the
    call knows its remote task."""
    found: list[RunInfo] = []

    async def known() -> bool:
        found[:] = await ops.list_runs(status="all", app_name=app, user_id=user, limit=1)
        calls = await children(ops, found[0]) if found else []
        found.extend(call for call in calls if call.phase)
        return len(found) == 2

    await eventually(known)
    return Call(*found)
