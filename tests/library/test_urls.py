"""Redis URLs beyond the plain one: a Unix socket serves a bus; an unreachable cluster is
:class:`BusUnavailable`, not redis-py's own exception; TLS to a plain server points at the URL."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from cancel_bus import BusUnavailable, CancelBus, InvalidArgument, Outcome
from node.embedded import EmbeddedServer, free_port

from ..helpers import WAIT, LoopingRun
from ..topology import needs_sharded_pubsub


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


@needs_sharded_pubsub
async def test_an_unreachable_cluster_is_bus_unavailable() -> None:
    bus = CancelBus(f"redis+cluster://127.0.0.1:{free_port()}", namespace="gone", lease_ttl=1)
    with pytest.raises(BusUnavailable, match="Redis Cluster cannot be connected"):
        await bus.start()
    await bus.close()


@pytest.mark.parametrize("version", ["6.0.0", "7.1.0"])
def test_a_cluster_url_on_a_redis_py_without_sharded_pub_sub_says_so(
    version: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis, "__version__", version)
    with pytest.raises(
        InvalidArgument, match=f"needs redis-py 8.0 or later .*installed: {version}"
    ):
        CancelBus(f"redis+cluster://127.0.0.1:{free_port()}", namespace="old")


async def test_tls_to_a_plain_server_points_at_the_url(redis_server: EmbeddedServer) -> None:
    url = f"rediss://127.0.0.1:{redis_server.port}/0?ssl_cert_reqs=none&ssl_check_hostname=false"
    bus = CancelBus(url, namespace="tls", lease_ttl=1)
    with pytest.raises(BusUnavailable, match="TLS handshake never completes: check the URL"):
        await bus.start()  # the handshake waits for an answer a plain server never sends
    await bus.close()
