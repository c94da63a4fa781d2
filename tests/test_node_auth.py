"""Tokens and roles on real node processes: every route that needs a token checks it, a user
sees and cancels only its own runs, and no token ends up in a log."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from cancel_bus._keys import KeySpace
from node.embedded import EmbeddedServer

from .faultproxy import FaultProxy
from .node_cluster import Cluster

OPS = "ops-" + uuid.uuid4().hex
ALICE = "alice-" + uuid.uuid4().hex
BOB = "bob-" + uuid.uuid4().hex
TOKENS = {
    OPS: {"role": "ops", "name": "oncall"},
    ALICE: {"role": "user", "user_id": "alice"},
    BOB: {"role": "user", "user_id": "bob"},
}
OPEN_ROUTES = {("GET", "/healthz"), ("GET", "/readyz")}
AGENT = {"tokens": 100_000, "token_interval_ms": 5}


@pytest.fixture(scope="module")
def secured(
    redis_server: EmbeddedServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    cluster = Cluster(
        redis_server.url,
        2,
        tmp_path_factory.mktemp("secured"),
        api_tokens=json.dumps(TOKENS),
        metrics_require_token="true",
    ).start()
    yield cluster
    cluster.stop()


def _call(
    cluster: Cluster, token: str | None, method: str, path: str, body: Any = None, node: int = 0
) -> httpx.Response:
    with cluster.nodes[node].client(token) as client:
        return client.request(method, path, json=body)


def _start(cluster: Cluster, token: str, user: str, node: int = 0) -> httpx.Response:
    body = {"app_name": "app", "user_id": user, "session_id": uuid.uuid4().hex, "agent": AGENT}
    return _call(cluster, token, "POST", "/v1/runs", body, node)


def _routes(cluster: Cluster) -> list[tuple[str, str]]:
    schema = _call(cluster, None, "GET", "/openapi.json").json()
    routes = [(method.upper(), path) for path, ops in schema["paths"].items() for method in ops]
    return [*routes, ("GET", "/")]


def test_every_route_but_health_needs_a_token(secured: Cluster) -> None:
    routes = _routes(secured)
    assert len(routes) >= 12
    for method, path in routes:
        concrete = (
            path.replace("{run_id}", "r1")
            .replace("{app_name}", "a")
            .replace("{user_id}", "u")
            .replace("{session_id}", "s")
        )
        if (method, path) in OPEN_ROUTES or path == "/":
            assert _call(secured, None, method, concrete).status_code == 200, path
            continue
        for token in (None, "wrong-token-" + uuid.uuid4().hex):
            response = _call(secured, token, method, concrete, body={})
            assert response.status_code == 401, (method, path, response.status_code)
            assert response.headers.get("www-authenticate") == "Bearer"


def test_users_see_and_cancel_only_their_own_runs(secured: Cluster) -> None:
    started = _start(secured, ALICE, "alice")
    assert started.status_code == 201
    run_id = started.json()["run_id"]
    assert _start(secured, ALICE, "bob").status_code == 403  # not as someone else

    for method, path in (
        ("GET", f"/v1/runs/{run_id}"),
        ("GET", f"/v1/runs/{run_id}/events"),
        ("GET", f"/v1/runs/{run_id}/stream"),
        ("POST", f"/v1/runs/{run_id}/cancel"),
    ):
        response = _call(secured, BOB, method, path, node=1)
        assert response.status_code == 404, (path, response.status_code)
    bob_view = _call(secured, BOB, "GET", "/v1/runs?user_id=alice", node=1).json()["runs"]
    assert bob_view == []
    assert run_id not in {
        r["run_id"] for r in _call(secured, BOB, "GET", "/v1/runs", node=1).json()["runs"]
    }
    session = started.json()["session_id"]
    bob_session = _call(secured, BOB, "POST", f"/v1/sessions/app/alice/{session}/cancel")
    assert bob_session.status_code == 404
    assert _call(secured, BOB, "GET", "/v1/nodes").status_code == 403
    assert _call(secured, ALICE, "GET", "/metrics").status_code == 403

    mine = _call(secured, ALICE, "GET", "/v1/runs", node=1).json()["runs"]
    assert run_id in {r["run_id"] for r in mine}
    cancelled = _call(secured, ALICE, "POST", f"/v1/runs/{run_id}/cancel", {"timeout": 10}, 1)
    assert cancelled.status_code == 200
    assert cancelled.json()["run"]["requested_by"] == "user:alice"


def test_ops_sees_and_cancels_everything(secured: Cluster) -> None:
    run_id = _start(secured, BOB, "bob").json()["run_id"]
    assert run_id in {r["run_id"] for r in _call(secured, OPS, "GET", "/v1/runs").json()["runs"]}
    response = _call(secured, OPS, "POST", f"/v1/runs/{run_id}/cancel", {"timeout": 10}, 1)
    assert response.status_code == 200 and response.json()["run"]["requested_by"] == "oncall"
    assert _call(secured, OPS, "GET", "/v1/nodes").status_code == 200
    assert "cancel_bus_active_runs" in _call(secured, OPS, "GET", "/metrics").text


def test_no_token_in_logs_metrics_or_error_bodies(secured: Cluster) -> None:
    bodies = [
        _call(secured, "bogus-" + ALICE, "GET", "/v1/runs").text,
        _call(secured, ALICE, "GET", "/v1/runs/%7Bbad%7D").text,
        _call(secured, OPS, "GET", "/metrics").text,
    ]
    logs = [node.log_path.read_text() for node in secured.nodes]
    for text in bodies + logs:
        for token in TOKENS:
            assert token not in text
        assert "AUTH IS OFF" not in text


def test_without_tokens_a_node_binds_loopback_only_and_says_so(
    redis_server: EmbeddedServer, tmp_path: pytest.TempPathFactory
) -> None:
    cluster = Cluster(redis_server.url, 1, tmp_path, host="0.0.0.0").start()  # type: ignore[arg-type]
    try:
        log = cluster.nodes[0].log_path.read_text()
        assert "AUTH IS OFF" in log
        assert f"127.0.0.1:{cluster.nodes[0].port}" in log
        assert "0.0.0.0" not in log.split("AUTH IS OFF")[1]
    finally:
        cluster.stop()


async def test_no_password_or_signing_key_leaks_when_redis_fails(
    redis_server: EmbeddedServer,
    proxy: FaultProxy,
    raw_redis: aioredis.Redis,
    tmp_path: Path,
) -> None:
    namespace = f"leak-{uuid.uuid4().hex[:8]}"
    user, password = f"u-{namespace}", "pw-" + uuid.uuid4().hex
    signing_key = "sk-" + uuid.uuid4().hex
    await raw_redis.execute_command(
        "ACL", "SETUSER", user, "on", f">{password}", *KeySpace(namespace).acl_rules().split()
    )
    url = f"redis://{user}:{password}@127.0.0.1:{proxy.port}/0"
    cluster = Cluster(
        url,
        1,
        tmp_path,
        namespace=namespace,
        signing_key=signing_key,
        api_tokens=json.dumps(TOKENS),
        lease_ttl="30",
    )
    cluster.nodes[0].env["CANCEL_BUS_NAMESPACE"] = namespace
    await asyncio.to_thread(cluster.start)
    node = cluster.nodes[0]
    try:
        headers = {"Authorization": f"Bearer {OPS}"}
        async with httpx.AsyncClient(base_url=node.url, headers=headers, timeout=30) as client:
            run = (
                await client.post(
                    "/v1/runs",
                    json={
                        "app_name": "a",
                        "user_id": "u",
                        "session_id": "s",
                        "agent": {"tokens": 100_000, "token_interval_ms": 5},
                    },
                )
            ).json()
            proxy.refuse()
            bodies = [
                await client.post(f"/v1/runs/{run['run_id']}/cancel", json={"timeout": 2}),
                await client.get("/v1/runs"),
                await client.get("/readyz"),
            ]
            assert [r.status_code for r in bodies] == [503, 503, 503]
            proxy.heal()
            await asyncio.to_thread(node.wait_ready)
            bodies.append(await client.get("/metrics"))
            texts = [r.text for r in bodies] + [node.log_path.read_text()]
    finally:
        proxy.heal()
        await asyncio.to_thread(cluster.stop)
        await raw_redis.execute_command("ACL", "DELUSER", user)
    for text in texts:
        for secret in (password, signing_key, *TOKENS):
            assert secret not in text
