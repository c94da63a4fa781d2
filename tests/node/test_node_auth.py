"""Tokens and roles on real node processes: every route but the open ones checks the token, a
user sees, claims and cancels only its own runs (another's answers like an unknown id), and no
token ends up in a log."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from fastapi.routing import iter_route_contexts

from cancel_bus import CancelBus
from cancel_bus._keys import KeySpace
from node.app import create_app
from node.dashboard import ASSETS
from node.embedded import EmbeddedServer
from node.settings import Settings

from ..conftest import BusFactory
from ..faultproxy import FaultProxy
from ..node_cluster import Cluster

OPS = "ops-" + uuid.uuid4().hex
ALICE = "alice-" + uuid.uuid4().hex
BOB = "bob-" + uuid.uuid4().hex
TOKENS = {
    OPS: {"role": "ops", "name": "oncall"},
    ALICE: {"role": "user", "user_id": "alice"},
    BOB: {"role": "user", "user_id": "bob"},
}
# Static pages and the schema: they hold no run, node or metric. (The dashboard's files: its
# page, style, icon, and its script and the modules that script imports.)
OPEN_ROUTES = {
    "/healthz",
    "/readyz",
    "/",
    "/dashboard.js",
    "/dashboard.css",
    "/favicon.svg",
    *ASSETS,
    "/docs",
    "/docs/oauth2-redirect",
    "/redoc",
    "/openapi.json",
}
AGENT = {"tokens": 100_000, "token_interval_ms": 5}


@pytest.fixture(scope="module")
def secured(
    redis_server: EmbeddedServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    cluster = Cluster(
        redis_server.url, 2, tmp_path_factory.mktemp("secured"), api_tokens=json.dumps(TOKENS)
    ).start()
    yield cluster
    cluster.stop()


def _call(
    cluster: Cluster, token: str | None, method: str, path: str, body: Any = None, node: int = 0
) -> httpx.Response:
    with cluster.nodes[node].client(token) as client:
        return client.request(method, path, json=body)


def _session(user: str, **extra: Any) -> dict[str, Any]:
    return {"app_name": "app", "user_id": user, "session_id": uuid.uuid4().hex, **extra}


def _start(
    cluster: Cluster, token: str, user: str, node: int = 0, agent: Any = AGENT
) -> httpx.Response:
    return _call(cluster, token, "POST", "/v1/runs", _session(user, agent=agent), node)


def _routes() -> set[tuple[str, str]]:
    """Every route the app serves, those left out of the schema included."""
    app = create_app(Settings(redis_url="redis://unused"))
    return {
        (method, route.path)
        for route in iter_route_contexts(app.routes)
        for method in route.methods or ()
        if route.path is not None
    }


def test_every_route_but_the_open_ones_needs_a_token(secured: Cluster) -> None:
    routes = _routes()
    assert len(routes) >= 20 and {path for _, path in routes} >= OPEN_ROUTES
    for method, path in sorted(routes):
        concrete = (
            path.replace("{run_id}", "r1")
            .replace("{app_name}", "a")
            .replace("{user_id}", "u")
            .replace("{session_id}", "s")
        )
        if path in OPEN_ROUTES:
            assert _call(secured, None, method, concrete).status_code == 200, (method, path)
            continue
        for token in (None, "wrong-token-" + uuid.uuid4().hex):
            response = _call(secured, token, method, concrete, body={})
            assert response.status_code == 401, (method, path, response.status_code)
            assert response.headers.get("www-authenticate") == "Bearer"


def _as_unknown(
    cluster: Cluster, token: str, method: str, path: str, run_id: str, body: Any = None
) -> None:
    """``path`` with ``run_id`` answers as it does with an id never used."""
    unknown = uuid.uuid4().hex
    seen = _call(cluster, token, method, path.format(run_id), body, node=1)
    fresh = _call(cluster, token, method, path.format(unknown), body, node=1)
    assert seen.status_code == fresh.status_code == 404, (path, seen.status_code)
    assert seen.text.replace(run_id, "ID") == fresh.text.replace(unknown, "ID"), path


def _first_snapshot(cluster: Cluster, token: str) -> dict[str, Any]:
    with (
        cluster.nodes[0].client(token) as client,
        client.stream("GET", "/v1/dashboard/feed") as response,
    ):
        for line in response.iter_lines():
            if line.startswith("data: "):
                snapshot: dict[str, Any] = json.loads(line[6:])
                return snapshot
    raise AssertionError("the feed ended without a snapshot")


def test_users_see_and_cancel_only_their_own_runs(secured: Cluster) -> None:
    started = _start(secured, ALICE, "alice")
    assert started.status_code == 201
    run_id, session = started.json()["run_id"], started.json()["session_id"]
    assert _start(secured, ALICE, "bob").status_code == 403  # not as someone else

    for method, path in (
        ("GET", "/v1/runs/{}"),
        ("GET", "/v1/runs/{}/events"),
        ("GET", "/v1/runs/{}/stream"),
        ("POST", "/v1/runs/{}/cancel"),
    ):
        _as_unknown(secured, BOB, method, path, run_id)
    bob_session = _call(secured, BOB, "POST", f"/v1/sessions/app/alice/{session}/cancel")
    no_session = _call(secured, BOB, "POST", f"/v1/sessions/app/alice/{uuid.uuid4().hex}/cancel")
    assert bob_session.status_code == no_session.status_code == 404
    unknown = {"outcome": "not_found", "run": None, "descendants": [], "truncated": False}
    assert bob_session.json() == no_session.json() == unknown
    for query in ("user_id=alice", "status=all&app_name=app", "status=all&node_id=node-1", ""):
        listed = _call(secured, BOB, "GET", f"/v1/runs?{query}", node=1).json()["runs"]
        assert {r["user_id"] for r in listed} <= {"bob"}, query
    bob_feed = _first_snapshot(secured, BOB)
    assert {r["user_id"] for r in bob_feed["runs"]} <= {"bob"} and bob_feed["nodes"] is None
    assert bob_feed["viewer"] == {"role": "user", "user_id": "bob"}
    assert run_id in {r["run_id"] for r in _first_snapshot(secured, OPS)["runs"]}
    assert _call(secured, BOB, "GET", "/v1/nodes").status_code == 403
    assert _call(secured, ALICE, "GET", "/metrics").status_code == 403

    mine = _call(secured, ALICE, "GET", "/v1/runs", node=1).json()["runs"]
    assert run_id in {r["run_id"] for r in mine}
    cancelled = _call(secured, ALICE, "POST", f"/v1/runs/{run_id}/cancel", {"timeout": 10}, 1)
    assert cancelled.status_code == 200
    assert cancelled.json()["run"]["requested_by"] == "user:alice"


async def _wait_status(bus: CancelBus, run_id: str, status: str) -> None:
    deadline = time.monotonic() + 15
    while (run := await bus.get_run(run_id)) is None or run.status.value != status:
        assert time.monotonic() < deadline, f"run {run_id} never {status}"
        await asyncio.sleep(0.02)


async def test_a_taken_run_id_answers_one_409_that_tells_nothing(
    secured: Cluster, make_bus: BusFactory
) -> None:
    bus = await make_bus(namespace=secured.namespace)
    secret = "alice's secret " + uuid.uuid4().hex
    alice = _session("alice")
    queued = await bus.enqueue(**alice, metadata={"note": secret})
    withdrawn = await bus.enqueue(**_session("alice"))
    await bus.cancel(withdrawn.run_id, reason=secret, wait=False)
    finished = _start(secured, ALICE, "alice", agent={"tokens": 1, "token_interval_ms": 0})
    active = _start(secured, BOB, "bob")
    assert finished.status_code == active.status_code == 201
    await _wait_status(bus, finished.json()["run_id"], "succeeded")

    async with httpx.AsyncClient(base_url=secured.nodes[0].url, timeout=30) as client:

        async def claim(token: str, body: dict[str, Any], stream: bool = False) -> httpx.Response:
            path = "/v1/runs/stream" if stream else "/v1/runs"
            headers = {"Authorization": f"Bearer {token}"}
            return await client.post(path, json={**body, "agent": AGENT}, headers=headers)

        refused = [
            await claim(BOB, {**_session("bob"), "run_id": queued.run_id}),  # another user's
            await claim(BOB, {**_session("bob"), "run_id": queued.run_id}, stream=True),
            await claim(ALICE, {**_session("alice"), "run_id": queued.run_id}),  # other session
            await claim(ALICE, {**alice, "run_id": finished.json()["run_id"]}),  # finished
            await claim(ALICE, {**alice, "run_id": active.json()["run_id"]}),  # bob's, running
            await claim(ALICE, {**_session("alice"), "run_id": withdrawn.run_id}),  # cancelled
            await claim(
                ALICE,
                {"app_name": "app", "user_id": "alice", "session_id": withdrawn.session_id}
                | {"run_id": withdrawn.run_id},  # its own session, cancelled before it started
            ),
        ]
        assert [r.status_code for r in refused] == [409] * len(refused)
        assert len({r.text for r in refused}) == 1, [r.text for r in refused]
        text = refused[0].text
        for leak in (secret, "queued", "running", "succeeded", "cancelled", "alice", "bob"):
            assert leak not in text
        untouched = await bus.get_run(queued.run_id)
        assert untouched is not None and untouched.status.value == "queued"
        assert untouched.owner is None

        claimed = await claim(ALICE, {**alice, "run_id": queued.run_id})  # her own, same session
    assert claimed.status_code == 201, claimed.text
    assert claimed.json()["run_id"] == queued.run_id and claimed.json()["status"] == "running"
    assert claimed.json()["owner"] == "node-1"
    for run_id in (queued.run_id, active.json()["run_id"]):
        await bus.cancel(run_id, wait=False)


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
