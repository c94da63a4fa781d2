"""Clients that drop their streams leave nothing behind on a real node process: its asyncio
tasks (the ``cancel_bus_node_tasks`` gauge of /metrics), its open streams, the Redis connections
it has in use (its pool's count, and ``CLIENT LIST``) and its subscriptions return to where they
were, and the runs of the dropped ``POST /v1/runs/stream`` are cancelled."""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from prometheus_client import CollectorRegistry, Counter, Gauge
from sse_starlette import ServerSentEvent

from node import sse
from node.embedded import EmbeddedServer
from node.sse import Streams

from ..node_cluster import Cluster, NodeProcess

DROPS = 100  # of each kind
WAVE = 20  # streams open at once
SETTLE = 20.0  # seconds the node gets to return to its baseline
LONG_AGENT = {"tokens": 100_000, "token_interval_ms": 10}


@pytest.fixture
def node(redis_server: EmbeddedServer, tmp_path: Path) -> Iterator[NodeProcess]:
    cluster = Cluster(redis_server.url, 1, tmp_path)
    cluster.nodes[0].env["CANCEL_BUS_NODE_ID"] = f"drops-{uuid.uuid4().hex[:8]}"
    yield cluster.start().nodes[0]
    cluster.stop()


class Footprint:
    """What a node holds that a stream could leak: asyncio tasks, open streams, connections
    checked out of its Redis pool (its /metrics), and in Redis's ``CLIENT LIST`` its
    connections blocked in a command (a relay still reading) and its subscriptions. (Idle
    connections stay in the pool for reuse: their number follows the peak, not a leak.)"""

    def __init__(self, node: NodeProcess, server: EmbeddedServer) -> None:
        self.node_id = node.env["CANCEL_BUS_NODE_ID"]
        self.metrics_url = f"{node.url}/metrics"
        self.redis_port = server.port

    def now(self) -> dict[str, int]:
        text = httpx.get(self.metrics_url).text  # a connection of its own, closed at once
        samples = [line.rsplit(" ", 1) for line in text.splitlines() if line[:1] != "#"]
        with redis.Redis(port=self.redis_port, decode_responses=True) as server:
            clients = server.client_list()
        ours = [c for c in clients if c["name"].startswith(f"cancel-bus.{self.node_id}")]
        return {
            "tasks": sum(int(float(v)) for k, v in samples if k == "cancel_bus_node_tasks"),
            "streams": sum(int(float(v)) for k, v in samples if k == "cancel_bus_open_streams"),
            "pool_used": sum(
                int(float(v))
                for k, v in samples
                if k.startswith("cancel_bus_redis_connections{") and 'state="used"' in k
            ),
            "blocked": sum("b" in c["flags"] for c in ours),
            "subscriptions": sum(int(c["sub"]) + int(c["psub"]) for c in ours),
        }

    def quiet(self, readings: int = 5) -> dict[str, int]:
        """The least of a few readings: the baseline, without a passing request or sweep."""
        seen = []
        for _ in range(readings):
            seen.append(self.now())
            time.sleep(0.1)
        return {key: min(reading[key] for reading in seen) for key in seen[0]}

    def settle(self, baseline: dict[str, int]) -> dict[str, int]:
        """Poll until nothing exceeds ``baseline``; the last reading."""
        deadline = time.monotonic() + SETTLE
        while True:
            current = self.now()
            if all(current[k] <= baseline[k] for k in baseline):
                return current
            assert time.monotonic() < deadline, f"still {current}, baseline {baseline}"
            time.sleep(0.1)


async def _drop(
    client: httpx.AsyncClient, method: str, path: str, body: Any = None, until: str = "output"
) -> str:
    """Open a stream, read until an ``until`` event (for a run: its output flows), then hang
    up; the first run id it named."""
    run_id = ""
    async with client.stream(method, path, json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if not run_id and '"run_id":"' in line:
                run_id = line.split('"run_id":"')[1].split('"')[0]
            if line == f"event: {until}":
                return run_id  # leaving the block closes the connection mid-stream
    raise AssertionError(f"{path} ended before any {until}")


async def _drop_many(
    node: NodeProcess, user: str, followed: list[str], count: int, wave_size: int = WAVE
) -> list[str]:
    """``count`` dropped streams of each kind (a streamed start, a follow, the dashboard feed),
    ``wave_size`` of each at a time; the ids of the runs the streamed starts started."""
    started: list[str] = []
    limits = httpx.Limits(max_keepalive_connections=0)  # one connection per stream
    async with httpx.AsyncClient(base_url=node.url, timeout=30, limits=limits) as client:
        for first in range(0, count, wave_size):
            wave = range(first, min(first + wave_size, count))
            bodies = [
                {"app_name": "app", "user_id": user, "session_id": f"s{i}", "agent": LONG_AGENT}
                for i in wave
            ]
            posted = [_drop(client, "POST", "/v1/runs/stream", body) for body in bodies]
            follows = [
                _drop(client, "GET", f"/v1/runs/{followed[i % len(followed)]}/stream") for i in wave
            ]
            feeds = [_drop(client, "GET", "/v1/dashboard/feed", until="snapshot") for _ in wave]
            ids = await asyncio.gather(*posted, *follows, *feeds)
            started += ids[: len(bodies)]
    return started


def _start(node: NodeProcess, user: str) -> str:
    body = {"app_name": "app", "user_id": user, "session_id": uuid.uuid4().hex}
    with node.client() as client:
        response = client.post("/v1/runs", json={**body, "agent": LONG_AGENT})
    assert response.status_code == 201
    run_id: str = response.json()["run_id"]
    return run_id


def _runs(node: NodeProcess, user: str, status: str) -> list[dict[str, Any]]:
    with node.client() as client:
        runs: list[dict[str, Any]] = client.get(
            "/v1/runs", params={"status": status, "user_id": user, "limit": 1000}
        ).json()["runs"]
    return runs


def _wait_ended(node: NodeProcess, user: str) -> None:
    deadline = time.monotonic() + SETTLE
    while _runs(node, user, "active"):
        assert time.monotonic() < deadline, "dropped streams left their runs running"
        time.sleep(0.1)


def test_dropped_streams_leak_nothing(node: NodeProcess, redis_server: EmbeddedServer) -> None:
    user = f"u-{uuid.uuid4().hex[:8]}"
    followed = [_start(node, "followed") for _ in range(4)]  # run throughout
    footprint = Footprint(node, redis_server)
    asyncio.run(_drop_many(node, f"{user}-warmup", followed, WAVE))  # what starts once
    _wait_ended(node, f"{user}-warmup")
    baseline = footprint.quiet()
    assert baseline["streams"] == baseline["blocked"] == 0 and baseline["pool_used"] >= 1

    started = asyncio.run(_drop_many(node, user, followed, DROPS))
    assert len(set(started)) == DROPS

    _wait_ended(node, user)
    ended = _runs(node, user, "all")
    assert {r["run_id"] for r in ended} == set(started)
    assert {(r["status"], r["cancel_reason"]) for r in ended} == {
        ("cancelled", "client_disconnected")
    }
    footprint.settle(baseline)
    log = node.log_path.read_text()
    assert "Task was destroyed" not in log and "Traceback" not in log
    for run_id in followed:
        with node.client() as client:
            client.post(f"/v1/runs/{run_id}/cancel", json={"wait": False})


def _rss_mb(node: NodeProcess) -> float:
    assert node.process is not None
    status = Path(f"/proc/{node.process.pid}/status").read_text()
    return (
        int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS")))
        / 1024
    )


def _never_reading(node: NodeProcess, path: str) -> socket.socket:
    """A client that asks for a stream and never reads a byte of it (a small receive window)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", node.port))
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: node\r\n\r\n".encode())
    return sock


def test_clients_that_never_read_are_held_in_bounded_memory_and_let_go(
    node: NodeProcess, redis_server: EmbeddedServer
) -> None:
    """Waves of clients that never read (following chatty runs, and the dashboard feed): the
    node's memory grows with the first wave and not with the next (what they held is reused),
    and every stream is gone once they hang up."""
    followed = [_start(node, "chatty") for _ in range(4)]
    footprint = Footprint(node, redis_server)
    paths = [*(f"/v1/runs/{run_id}/stream" for run_id in followed), "/v1/dashboard/feed"]
    after: list[float] = []
    for _ in range(3):
        clients = [_never_reading(node, paths[i % len(paths)]) for i in range(150)]
        deadline = time.monotonic() + SETTLE
        while footprint.now()["streams"] < len(clients):
            assert time.monotonic() < deadline, footprint.now()
            time.sleep(0.1)
        time.sleep(2)  # their buffers fill
        after.append(_rss_mb(node))
        for client in clients:
            client.close()
        deadline = time.monotonic() + SETTLE
        while footprint.now()["streams"]:
            assert time.monotonic() < deadline, footprint.now()
            time.sleep(0.1)
    assert after[2] - after[0] < 15, after  # no growth wave after wave: held, then reused
    for run_id in followed:
        with node.client() as client:
            client.post(f"/v1/runs/{run_id}/cancel", json={"wait": False})


async def test_a_client_that_takes_nothing_is_dropped_after_the_send_timeout() -> None:
    """Once its buffers are full, a send to a client that does not read waits: after
    ``send_timeout`` the stream ends and is counted (it would hold its buffers for good)."""
    registry = CollectorRegistry()
    streams = Streams(
        Gauge("open", "open", registry=registry), Counter("dropped", "d", registry=registry), 0.2
    )

    async def events() -> AsyncIterator[ServerSentEvent]:
        while True:
            yield sse.event("output", {"text": "x" * 100})
            await asyncio.sleep(0)

    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()  # the client never says anything
        return {"type": "http.disconnect"}

    sent: list[str] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message["type"])
        if len(sent) > 3:  # its buffers are full: this send never completes
            await asyncio.Event().wait()

    scope = {
        "type": "http",
        "method": "GET",
        "path": "/",
        "headers": [],
        "asgi": {"version": "3.0"},
    }
    stream = sse.EventStream(events(), streams)
    await asyncio.wait_for(stream(scope, receive, send), 5)  # ends: it did not hang
    assert registry.get_sample_value("dropped_total") == 1
    assert registry.get_sample_value("open") == 0
