"""A draining node tells the truth about itself, on real processes: ``/v1/nodes`` says it is
``draining`` (its lease alone would say ``alive``), its dashboard feed sends a last snapshot that
says so and ``node.draining`` with the moment its runs are cancelled, then ends; a feed opened
during the drain says the same at once; new runs are refused."""

from __future__ import annotations

import json
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from node.embedded import EmbeddedServer

from ..node_cluster import Cluster, NodeProcess

DRAIN = 30.0  # seconds: far longer than the test; a second signal ends the drain
LONG = {"tokens": 100_000, "token_interval_ms": 20}


@pytest.fixture(scope="module")
def observer(
    redis_server: EmbeddedServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """A node that stays, and the environment of the node that leaves."""
    cluster = Cluster(redis_server.url, 1, tmp_path_factory.mktemp("stays")).start()
    yield cluster
    cluster.stop()


def _events(response: httpx.Response) -> Iterator[tuple[str, Any]]:
    event = ""
    for line in response.iter_lines():
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            yield event, json.loads(line[6:])


def _node_states(node: NodeProcess) -> dict[str, str]:
    with node.client() as client:
        nodes = client.get("/v1/nodes").json()["nodes"]
    return {view["node_id"]: view["state"] for view in nodes}


def test_a_draining_node_says_so_in_its_nodes_and_its_feed(
    observer: Cluster, tmp_path: Path
) -> None:
    env = {k: v for k, v in observer.nodes[0].env.items() if k.startswith("CANCEL_BUS_")}
    env["CANCEL_BUS_DRAIN_TIMEOUT"] = str(DRAIN)
    leaving = NodeProcess(f"leaving-{uuid.uuid4().hex[:6]}", env, tmp_path).start().wait_ready()
    try:
        body = {"app_name": "app", "user_id": "u", "session_id": uuid.uuid4().hex, "agent": LONG}
        with leaving.client() as client:
            assert client.post("/v1/runs", json=body).status_code == 201
        assert _node_states(leaving)[leaving.name] == "alive"
        with (
            leaving.client(timeout=15) as client,
            client.stream("GET", "/v1/dashboard/feed", params={"status": "all"}) as feed,
        ):
            events = _events(feed)
            name, first = next(events)
            assert name == "snapshot" and first["draining"] is False
            assert first["drain_until"] is None
            signalled = time.monotonic()
            leaving.signal(signal.SIGTERM)
            rest = list(events)  # the feed ends by itself
        assert time.monotonic() - signalled < 5  # not after the drain: at its start
        assert [name for name, _ in rest][-2:] == ["snapshot", "node.draining"]
        last, said = rest[-2][1], rest[-1][1]
        assert last["draining"] is True
        assert {n["node_id"]: n["state"] for n in last["nodes"]}[leaving.name] == "draining"
        assert said["node_id"] == leaving.name
        assert said["until"] == last["drain_until"]
        assert DRAIN - 5 < said["until"] - last["at"] <= DRAIN  # when its runs are cancelled
        assert all(snapshot["draining"] is False for _, snapshot in rest[:-2])

        states = _node_states(leaving)
        assert states[leaving.name] == "draining"
        assert states[observer.nodes[0].name] == "alive"
        deadline = time.monotonic() + 5  # the others see it too, from its next heartbeat
        while _node_states(observer.nodes[0])[leaving.name] != "draining":
            assert time.monotonic() < deadline, _node_states(observer.nodes[0])
            time.sleep(0.05)
        with leaving.client(timeout=15) as client:
            with client.stream("GET", "/v1/dashboard/feed") as again:  # opened while it drains
                assert [name for name, _ in _events(again)] == ["snapshot", "node.draining"]
            refused = client.post("/v1/runs", json={**body, "session_id": uuid.uuid4().hex})
            assert refused.status_code == 503 and "draining" in refused.json()["detail"]
        leaving.signal(signal.SIGTERM)  # the second: the runs are cancelled now
        assert leaving.wait_exit(15) == 0
    finally:
        leaving.stop()
