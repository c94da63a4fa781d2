"""Redis URLs beyond the plain one: a Unix socket serves a bus, and an unreachable cluster is
:class:`BusUnavailable`, not redis-py's own exception."""

from __future__ import annotations

from pathlib import Path

import pytest

from cancel_bus import BusUnavailable, CancelBus, Outcome
from node.embedded import EmbeddedServer, free_port

from .helpers import WAIT, LoopingRun


async def test_a_unix_socket_url_serves_a_bus(tmp_path: Path) -> None:
    socket = tmp_path / "redis.sock"
    server = EmbeddedServer(extra_args=["--unixsocket", str(socket), "--unixsocketperm", "700"])
    server.start()
    try:
        async with (
            CancelBus(f"unix://{socket}", namespace="unix", lease_ttl=3) as owner,
            CancelBus(f"unix://{socket}", namespace="unix", lease_ttl=3) as caller,
        ):
            run = await LoopingRun(owner).start()
            result = await caller.cancel(run.run_id, timeout=WAIT)
            assert result.outcome is Outcome.CANCELLED
            await run.done()
    finally:
        server.cleanup()


async def test_an_unreachable_cluster_is_bus_unavailable() -> None:
    bus = CancelBus(f"redis+cluster://127.0.0.1:{free_port()}", namespace="gone", lease_ttl=1)
    with pytest.raises(BusUnavailable, match="Redis Cluster cannot be connected"):
        await bus.start()
    await bus.close()
