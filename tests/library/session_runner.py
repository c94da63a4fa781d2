"""A node in a process of its own that runs one run of a session, for the double-texting tests:

    python -m tests.library.session_runner URL NAMESPACE SESSION_ID STRATEGY RUN_ID

It starts the run with that ``multitask_strategy`` and prints one JSON line per step:
``{"queued": run_id}`` if it waits in the session's queue, then
``{"started": run_id, "interrupted": run_id | null, "interrupted_output": str | null}``, then
emits ``tick N`` at a checkpoint every 10 ms until cancelled: ``{"cancelled": cause}``; or, if
the session stayed busy, ``{"busy": active_run_id}``; or, cancelled before it started,
``{"never_started": cause}``. It closes its bus and exits 0."""

from __future__ import annotations

import asyncio
import json
import sys

from cancel_bus import CancelBus, RunCancelled, SessionBusy

APP, USER = "chat", "u1"


def say(**fields: object) -> None:
    """One step, as a JSON line."""
    print(json.dumps(fields), flush=True)


async def main(url: str, namespace: str, session_id: str, strategy: str, run_id: str) -> None:
    """Run until cancelled (or refused), saying what happened."""
    async with CancelBus(url, namespace=namespace, lease_ttl=5.0) as bus:
        try:
            async with bus.run(
                run_id,
                app_name=APP,
                user_id=USER,
                session_id=session_id,
                multitask_strategy=strategy,
                interrupt_timeout=10.0,
                on_queued=lambda queued: say(queued=queued.run_id),
            ) as run:
                before = run.interrupted
                say(
                    started=run.run_id,
                    interrupted=before.run_id if before else None,
                    interrupted_output=before.output if before else None,
                )
                tick = 0
                try:
                    while True:
                        run.checkpoint()
                        run.emit(f"tick {tick} ")
                        tick += 1
                        await asyncio.sleep(0.01)
                except RunCancelled as stop:  # the scope records it: said, then given back
                    say(cancelled=stop.request.cause.value if stop.request else None)
                    raise
        except SessionBusy as busy:
            say(busy=busy.active_run_id)
        except RunCancelled as stop:  # from the scope's entry: cancelled while it was queued
            say(never_started=stop.request.cause.value if stop.request else None)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
