"""Event-loop lag, watched: a loop that ran late makes every timestamp it took late too, so the
harness and each node log when theirs fell behind (a late answer is then told from a late clock)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

PERIOD = 0.05  # seconds between two looks
WORTH_LOGGING = 0.25  # seconds late


async def watch_lag(on_lag: Callable[[float, float], None]) -> None:
    """Call ``on_lag(wall time it began, seconds late)`` whenever the loop ran late."""
    loop = asyncio.get_running_loop()
    while True:
        asked, began = loop.time(), time.time()
        await asyncio.sleep(PERIOD)
        late = loop.time() - asked - PERIOD
        if late >= WORTH_LOGGING:
            on_lag(began, late)
