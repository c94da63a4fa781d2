"""Following a run from any node: what a relayed run emits, read from its relay stream, until
it ends (or, for a run that is not relayed, just its end, read off the record)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from ._errors import RunNotFound
from ._reads import Reads
from ._types import RunEvent


async def follow(
    reads: Reads, run_id: str, *, from_start: bool, poll: float
) -> AsyncIterator[RunEvent]:
    """The run's relayed events (from now on, or ``from_start``), ending with
    ``run.finished``; :class:`RunNotFound` for an unknown run."""
    run, last = await reads.relay_position(run_id)
    if run is None:
        raise RunNotFound(run_id)
    if from_start:
        last = "0"
    while True:
        active = run is not None and run.is_active
        block_ms = int(poll * 1000) if active else None
        for event in await reads.read_relay(run_id, last, block_ms):
            last = event.id
            yield event
            if event.type == "run.finished":
                return
        if not active:
            break
        run = await reads.get_run(run_id)
    if run is not None:  # not relayed, or its relay expired: the record tells the end
        yield RunEvent(
            id=last,
            type="run.finished",
            at=run.finished_at or run.created_at,
            data={"status": run.status.value, "end_reason": run.end_reason},
        )
