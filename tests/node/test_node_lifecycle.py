"""A node's life: SIGTERM drain (readiness first, then runs, then the rest cancelled and
recorded), and the embedded server when no Redis URL is given."""

from __future__ import annotations

import signal
import socket
import time
import uuid
from pathlib import Path
from typing import Any

import redis
from fastapi.testclient import TestClient

from cancel_bus._keys import KeySpace
from node.app import create_app
from node.embedded import EmbeddedServer
from node.settings import Settings

from ..node_cluster import Cluster, NodeProcess


def _start(node: NodeProcess, **agent: Any) -> dict[str, Any]:
    body = {"app_name": "app", "user_id": "u", "session_id": uuid.uuid4().hex, "agent": agent}
    with node.client() as client:
        response = client.post("/v1/runs", json=body)
    assert response.status_code == 201, response.text
    run: dict[str, Any] = response.json()
    return run


def test_sigterm_drains_then_cancels_the_rest_and_leaves(
    redis_server: EmbeddedServer, tmp_path: Path
) -> None:
    drain = 2.0
    cluster = Cluster(redis_server.url, 2, tmp_path, drain_timeout=str(drain)).start()
    try:
        leaving, staying = cluster.nodes
        endless = _start(leaving, tokens=100_000, token_interval_ms=10)
        short = _start(leaving, tokens=20, token_interval_ms=25)  # ends inside the drain
        t0 = time.monotonic()
        leaving.signal(signal.SIGTERM)
        with leaving.client() as client:
            while client.get("/readyz").status_code != 503:  # readiness fails first
                assert time.monotonic() - t0 < 5
                time.sleep(0.01)
            refused = client.post(
                "/v1/runs", json={"app_name": "a", "user_id": "u", "session_id": "s"}
            )
            assert refused.status_code == 503
        leaving.wait_exit(drain + 15)
        assert time.monotonic() - t0 >= drain * 0.9  # it waited for its runs
        with staying.client() as client:
            done = client.get(f"/v1/runs/{short['run_id']}").json()
            cut = client.get(f"/v1/runs/{endless['run_id']}").json()
            nodes = client.get("/v1/nodes").json()["nodes"]
        assert done["status"] == "succeeded"
        assert cut["status"] == "cancelled" and cut["cancel_reason"] == "node_shutdown"
        assert cut["output"]  # partial output kept
        assert [n["node_id"] for n in nodes] == ["node-2"]
    finally:
        cluster.stop()


def test_no_redis_url_starts_an_embedded_server(tmp_path: Path) -> None:
    env = {
        "CANCEL_BUS_REDIS_URL": "",
        "CANCEL_BUS_DATA_DIR": str(tmp_path / "state"),
        "CANCEL_BUS_API_TOKENS": "",
        "CANCEL_BUS_API_TOKENS_FILE": "",
        "CANCEL_BUS_LEASE_TTL": "2",
    }
    node = NodeProcess("solo", env, tmp_path).start().wait_ready()
    second = NodeProcess("second", env, tmp_path).start()
    joined = NodeProcess("joined", env, tmp_path)
    try:
        run = _start(node, tokens=100_000, token_interval_ms=5)
        with node.client() as client:
            answer = client.post(f"/v1/runs/{run['run_id']}/cancel").json()
        assert answer["outcome"] == "cancelled"
        log = node.log_path.read_text()
        assert "embedded server" in log and str(tmp_path / "state") in log
        assert "valkey" in (tmp_path / "state" / "redis" / "server.log").read_text().lower()
        redis_port = int(log.split("embedded server at redis://127.0.0.1:")[1].split("/")[0])
        # the same data dir cannot serve two nodes: one line says which node has it and how
        # to join it, and nothing else is started
        assert second.wait_exit(30) == 1
        said = second.log_path.read_text()
        assert said.count("\n") == 1 and "Traceback" not in said, said
        assert f"dashboard http://127.0.0.1:{node.port}/" in said
        url = f"redis://127.0.0.1:{redis_port}/0"
        assert f"CANCEL_BUS_REDIS_URL={url}" in said
        joined.env["CANCEL_BUS_REDIS_URL"] = url
        joined.start().wait_ready()
        with node.client() as client:
            nodes = client.get("/v1/nodes").json()["nodes"]
        assert [n["node_id"] for n in nodes] == ["joined", "solo"]
    finally:
        for process in (second, joined, node):
            process.stop()
    with socket.socket() as sock:  # the embedded server went away with its node
        assert sock.connect_ex(("127.0.0.1", redis_port)) != 0
    assert (tmp_path / "state" / "redis" / "dump.rdb").exists()


def test_readiness_fails_while_redis_is_unreachable(tmp_path: Path) -> None:
    server = EmbeddedServer().start()
    cluster = Cluster(server.url, 1, tmp_path).start()
    try:
        node = cluster.nodes[0]
        server.pause()  # SIGSTOP: connections hang
        t0 = time.monotonic()
        with node.client(timeout=5) as client:
            while client.get("/readyz").status_code != 503:
                assert time.monotonic() - t0 < 10
            assert client.get("/healthz").status_code == 200  # alive all the same
        server.resume()
        node.wait_ready()
    finally:
        server.resume()
        cluster.stop()
        server.cleanup()


def test_a_drain_ends_the_streams_of_runs_owned_elsewhere(
    redis_server: EmbeddedServer, tmp_path: Path
) -> None:
    cluster = Cluster(redis_server.url, 2, tmp_path, drain_timeout="30").start()
    try:
        owner, leaving = cluster.nodes
        run = _start(owner, tokens=100_000, token_interval_ms=20)
        events = []
        with (
            leaving.client() as client,
            client.stream("GET", f"/v1/runs/{run['run_id']}/stream") as response,
        ):
            for line in response.iter_lines():
                if line.startswith("event: "):
                    events.append(line[7:])
                    if events.count("output") == 2:
                        leaving.signal(signal.SIGTERM)
        t0 = time.monotonic()
        assert events[-1] == "node.draining"
        assert leaving.wait_exit(15) is not None
        assert time.monotonic() - t0 < 10  # not held by the stream
        with owner.client() as client:
            assert client.get(f"/v1/runs/{run['run_id']}").json()["status"] == "running"
            client.post(f"/v1/runs/{run['run_id']}/cancel")  # not to hold the owner's drain
    finally:
        cluster.stop()


def test_readiness_names_a_redis_that_refuses_the_node(redis_server: EmbeddedServer) -> None:
    namespace = f"revoked-{uuid.uuid4().hex[:8]}"
    user, password = f"u-{namespace}", "pw-" + uuid.uuid4().hex
    admin = redis.Redis.from_url(redis_server.url)
    admin.execute_command(
        "ACL", "SETUSER", user, "on", f">{password}", *KeySpace(namespace).acl_rules().split()
    )
    url = f"redis://{user}:{password}@127.0.0.1:{redis_server.port}/0"
    try:
        with TestClient(create_app(Settings(redis_url=url, namespace=namespace))) as client:
            assert client.get("/readyz").status_code == 200
            admin.execute_command("ACL", "DELUSER", user)  # its connections are closed too
            ready = client.get("/readyz")
            assert ready.status_code == 503
            assert "redis refused access (its user or password)" in ready.json()["problems"]
    finally:
        admin.execute_command("ACL", "DELUSER", user)
        admin.close()
