"""The node service across 3 real node processes on one real Redis: start anywhere, cancel from
anywhere, stream from anywhere, list cluster-wide."""

from __future__ import annotations

import dataclasses
import json
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cancel_bus import BusStats
from node.embedded import EmbeddedServer

from ..node_cluster import Cluster, NodeProcess

LONG_AGENT = {"tokens": 100_000, "token_interval_ms": 5}


@pytest.fixture(scope="module")
def cluster(
    redis_server: EmbeddedServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    running = Cluster(redis_server.url, 3, tmp_path_factory.mktemp("nodes")).start()
    yield running
    running.stop()


def _body(**agent: Any) -> dict[str, Any]:
    return {
        "app_name": "app",
        "user_id": f"u-{uuid.uuid4().hex[:8]}",
        "session_id": f"s-{uuid.uuid4().hex[:8]}",
        "agent": agent or LONG_AGENT,
    }


def _start(node: NodeProcess, **agent: Any) -> dict[str, Any]:
    with node.client() as client:
        response = client.post("/v1/runs", json=_body(**agent))
    assert response.status_code == 201, response.text
    run: dict[str, Any] = response.json()
    return run


def _get(node: NodeProcess, path: str) -> httpx.Response:
    with node.client() as client:
        return client.get(path)


def _wait_status(
    node: NodeProcess, run_id: str, done: set[str], timeout: float = 15
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run: dict[str, Any] = _get(node, f"/v1/runs/{run_id}").json()
        if run["status"] in done:
            return run
        time.sleep(0.02)
    raise AssertionError(f"run {run_id} did not reach {done}")


def test_start_on_one_node_cancel_through_another_and_wait(cluster: Cluster) -> None:
    n1, n2, _ = cluster.nodes
    run = _start(n1)
    assert run["owner"] == "node-1" and run["status"] == "running"
    with n2.client() as client:
        response = client.post(
            f"/v1/runs/{run['run_id']}/cancel", json={"reason": "stop", "wait": True, "timeout": 10}
        )
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["outcome"] == "cancelled"
    assert answer["run"]["status"] == "cancelled" and answer["run"]["cancel_reason"] == "stop"
    assert answer["run"]["output"].endswith("User cancel the agent execution.")
    assert answer["run"]["requested_by"] == "anonymous"


def test_cancel_without_wait_answers_202_then_the_run_stops(cluster: Cluster) -> None:
    n1, _, n3 = cluster.nodes
    run = _start(n1)
    with n3.client() as client:
        response = client.post(f"/v1/runs/{run['run_id']}/cancel", json={"wait": False})
    assert response.status_code == 202
    assert response.json()["outcome"] == "stopping" and response.json()["run"]["stopping"]
    final = _wait_status(n3, run["run_id"], {"cancelled"})
    assert final["cancel_observed_at"] >= final["cancel_requested_at"]


def test_cancel_answers_404_409_and_empty_body_defaults(cluster: Cluster) -> None:
    n1, n2, _ = cluster.nodes
    with n2.client() as client:
        missing = client.post("/v1/runs/nope/cancel")
        assert missing.status_code == 404 and missing.json()["outcome"] == "not_found"
    short = _start(n1, tokens=1, token_interval_ms=0)
    _wait_status(n1, short["run_id"], {"succeeded"})
    with n2.client() as client:
        finished = client.post(f"/v1/runs/{short['run_id']}/cancel")
    assert finished.status_code == 409
    assert finished.json()["outcome"] == "already_finished"
    assert finished.json()["run"]["status"] == "succeeded"


def test_session_cancel_from_any_node_and_one_run_per_session(cluster: Cluster) -> None:
    n1, n2, n3 = cluster.nodes
    body = _body(**LONG_AGENT)
    with n1.client() as client:
        first = client.post("/v1/runs", json=body)
        assert first.status_code == 201
        busy = client.post("/v1/runs", json=body)
    assert busy.status_code == 409 and "active run" in busy.json()["detail"]
    with n3.client() as client:
        response = client.post(
            f"/v1/sessions/{body['app_name']}/{body['user_id']}/{body['session_id']}/cancel",
            json={"timeout": 10},
        )
    assert response.status_code == 200
    assert response.json()["run"]["run_id"] == first.json()["run_id"]
    with n2.client() as client:
        again = client.post(
            f"/v1/sessions/{body['app_name']}/{body['user_id']}/{body['session_id']}/cancel"
        )
    assert again.status_code == 404


def test_client_disconnect_cancels_a_streamed_run_and_keeps_partial_output(
    cluster: Cluster,
) -> None:
    n1, n2, _ = cluster.nodes
    outputs = 0
    run_id = ""
    body = _body(tokens=100_000, token_interval_ms=2)
    with n1.client() as client, client.stream("POST", "/v1/runs/stream", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for event, data in _sse(response.iter_lines()):
            if event == "run":
                run_id = data["run_id"]
            outputs += event == "output"
            if outputs == 5:
                break  # leaving the block closes the connection
    assert run_id and outputs == 5
    final = _wait_status(n2, run_id, {"cancelled"})
    assert final["cancel_reason"] == "client_disconnected"
    marker = "User cancel the agent execution."
    assert final["output"].endswith(marker) and len(final["output"]) > len(marker) + 5


def _sse(lines: Iterator[str]) -> Iterator[tuple[str, Any]]:
    event = ""
    for line in lines:
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            yield event, json.loads(line[6:])


def _runs_of(node: NodeProcess, status: str) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = _get(node, f"/v1/runs?status={status}&limit=1000").json()["runs"]
    return runs


def test_stream_an_existing_run_from_another_node(cluster: Cluster) -> None:
    n1, n2, _ = cluster.nodes
    run = _start(n1, tokens=30, token_interval_ms=20, tools=[{"name": "search", "duration_ms": 50}])
    with n2.client() as client, client.stream("GET", f"/v1/runs/{run['run_id']}/stream") as r:
        assert r.status_code == 200
        received = list(_sse(r.iter_lines()))
    types = [event for event, _ in received]
    assert types[0] == "run" and received[0][1]["run_id"] == run["run_id"]
    assert "output" in types and "tool_call" in types and "tool_result" in types
    assert types[-2:] == ["run.finished", "run"]
    final = received[-1][1]
    assert final["status"] == "succeeded" and final["owner"] == "node-1"
    assert "[search: done]" in final["output"]


def test_a_follow_from_the_start_replays_the_output_a_follow_from_now_does_not(
    cluster: Cluster,
) -> None:
    """``GET /v1/runs/{id}/stream?from_start=true`` (the dashboard's live output): the run's
    output from its first chunk; without it, from now on (a run that ended: its end only)."""
    n1, n2, _ = cluster.nodes
    run = _start(n1, tokens=25, token_interval_ms=1)
    final = _wait_status(n2, run["run_id"], {"succeeded"})
    stream = f"/v1/runs/{run['run_id']}/stream"
    with n2.client() as client:
        with client.stream("GET", stream, params={"from_start": "true"}) as replayed:
            assert replayed.status_code == 200
            events = list(_sse(replayed.iter_lines()))
        with client.stream("GET", stream) as from_now:
            later = [event for event, _ in _sse(from_now.iter_lines())]
    text = "".join(data["text"] for event, data in events if event == "output")
    assert text == final["output"] and text.startswith("the agent thinks")
    assert [event for event, _ in events][-2:] == ["run.finished", "run"]
    assert later == ["run", "run.finished", "run"]  # nothing of what it emitted before


def test_list_runs_cluster_wide_and_nodes(cluster: Cluster) -> None:
    n1, n2, n3 = cluster.nodes
    runs = [_start(node) for node in (n1, n2, n3)]
    listed = {r["run_id"]: r for r in _runs_of(n2, "active")}
    for run in runs:
        assert listed[run["run_id"]]["owner"] == run["owner"]
    by_node = _get(n3, "/v1/runs?node_id=node-1").json()["runs"]
    assert runs[0]["run_id"] in {r["run_id"] for r in by_node}
    assert all(r["owner"] == "node-1" for r in by_node)
    nodes = _get(n1, "/v1/nodes").json()["nodes"]
    assert {n["node_id"] for n in nodes} == {"node-1", "node-2", "node-3"}
    events = _get(n3, f"/v1/runs/{runs[0]['run_id']}/events").json()["events"]
    assert events[0]["type"] == "run.started"
    for run in runs:
        with n1.client() as client:
            client.post(f"/v1/runs/{run['run_id']}/cancel", json={"wait": False})


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/runs", {"app_name": "a b", "user_id": "u", "session_id": "s"}),
        (
            "POST",
            "/v1/runs",
            {"app_name": "a", "user_id": "u", "session_id": "s", "agent": {"tokens": -1}},
        ),
        ("POST", "/v1/runs", {"app_name": "a", "user_id": "u", "session_id": "s", "extra": 1}),
        ("POST", "/v1/runs/x/cancel", {"mode": "sometimes"}),
        ("POST", "/v1/runs/x/cancel", {"timeout": 0}),
        ("POST", "/v1/runs/x/cancel", {"timeout": 5e-324, "wait": False}),  # was a 503
        ("POST", "/v1/runs/x/cancel", {"timeout": 1e9}),
        ("GET", "/v1/runs/%7Bx%7D", None),
        ("GET", "/v1/runs?status=nope", None),
        ("GET", "/v1/runs?limit=0", None),
        ("GET", "/v1/runs?user_id=a:b", None),
        ("POST", "/v1/sessions/a/b/c*d/cancel", None),
    ],
)
def test_bad_input_is_a_clear_4xx(cluster: Cluster, method: str, path: str, body: object) -> None:
    with cluster.nodes[0].client() as client:
        if isinstance(body, str):
            response = client.request(
                method, path, content=body, headers={"content-type": "application/json"}
            )
        else:
            response = client.request(method, path, json=body)
    assert response.status_code == 422, response.text
    assert "detail" in response.json()


MALFORMED = [
    ("not json", "Expecting value", 0),
    ('{"app_name": "a"', "Expecting ',' delimiter", 16),
    ("{'app_name': 'a'}", "Expecting property name enclosed in double quotes", 1),
    ('{"app_name": "a"} and more', "Extra data", 18),
]


@pytest.mark.parametrize("path", ["/v1/runs", "/v1/runs/r1/cancel", "/v1/cancel-where"])
@pytest.mark.parametrize(("body", "said", "where"), MALFORMED)
def test_a_body_that_is_not_json_is_a_400_and_json_of_the_wrong_shape_a_422(
    cluster: Cluster, path: str, body: str, said: str, where: int
) -> None:
    """As the README says: JSON that cannot be parsed is a 400 (what the parser said, and
    where); JSON that parses but is not what the route takes stays a 422, field by field."""
    json_type = {"content-type": "application/json"}
    with cluster.nodes[0].client() as client:
        malformed = client.post(path, content=body, headers=json_type)
        wrong_shape = client.post(path, content='{"mode": 1, "app_name": 2}', headers=json_type)
    assert malformed.status_code == 400, malformed.text
    assert malformed.json() == {
        "detail": f"the body is not valid JSON: {said} (at character {where})"
    }
    assert wrong_shape.status_code == 422, wrong_shape.text
    assert wrong_shape.json()["errors"] and "body." in wrong_shape.json()["detail"]


NON_FINITE = ["NaN", "Infinity", "-Infinity", "1e400"]  # JSON that Python reads as nan/inf
NUMERIC_FIELDS = [
    ("/v1/runs", {"agent": {"tokens": "X"}}, "tokens"),
    ("/v1/runs", {"agent": {"token_interval_ms": "X"}}, "token_interval_ms"),
    ("/v1/runs", {"agent": {"turns": "X"}}, "turns"),
    ("/v1/runs/stream", {"agent": {"tools": [{"name": "t", "duration_ms": "X"}]}}, "duration_ms"),
    ("/v1/runs/r1/cancel", {"timeout": "X"}, "timeout"),
    ("/v1/sessions/a/u/s/cancel", {"timeout": "X"}, "timeout"),
    ("/v1/cancel-where", {"user_id": "u", "ttl": "X"}, "ttl"),
    ("/v1/cancel-where", {"user_id": "u", "until": "X"}, "until"),
    ("/v1/cancel-where", {"user_id": "u", "min_age": "X"}, "min_age"),
    ("/v1/cancel-where", {"started_before": "X"}, "started_before"),
    ("/v1/cancel-where", {"user_id": "u", "timeout": "X"}, "timeout"),
]


@pytest.mark.parametrize("number", NON_FINITE)
@pytest.mark.parametrize(("path", "body", "field"), NUMERIC_FIELDS)
def test_non_finite_numbers_are_a_422_that_says_where(
    cluster: Cluster, path: str, body: dict[str, Any], field: str, number: str
) -> None:
    if path.startswith("/v1/runs") and not path.endswith("cancel"):
        body = {**_body(), **body}
    content = json.dumps(body).replace('"X"', number)
    with cluster.nodes[0].client() as client:
        response = client.post(path, content=content, headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text
    answer = json.loads(response.text, parse_constant=_no_constants)  # strict JSON
    assert answer["errors"][0]["loc"][-1] == field
    assert field in answer["detail"] and number not in response.text


@pytest.mark.parametrize("number", [*NON_FINITE, "1e3", "10" * 2500])
def test_numeric_query_parameters_refuse_what_is_no_integer(cluster: Cluster, number: str) -> None:
    with cluster.nodes[0].client() as client:
        response = client.get("/v1/runs", params={"limit": number})
    assert response.status_code == 422 and "query.limit" in response.json()["detail"]


def _no_constants(name: str) -> None:
    raise AssertionError(f"{name} in a JSON answer")


def test_oversized_body_is_rejected(cluster: Cluster) -> None:
    with cluster.nodes[0].client() as client:
        response = client.post(
            "/v1/runs",
            content=b"{" + b" " * (200 * 1024) + b"}",
            headers={"content-type": "application/json"},
        )
    assert response.status_code == 413


def test_health_readiness_metrics(cluster: Cluster) -> None:
    node = cluster.nodes[0]
    assert _get(node, "/healthz").json() == {"status": "ok"}
    ready = _get(node, "/readyz")
    assert ready.status_code == 200 and ready.json()["node_id"] == "node-1"
    run = _start(cluster.nodes[1])
    with node.client() as client:
        assert client.post(f"/v1/runs/{run['run_id']}/cancel").status_code == 200
    text = _get(node, "/metrics").text
    namespace = f'bus_namespace="{cluster.namespace}"'
    assert f'cancel_bus_cancels_total{{{namespace},outcome="cancelled"}}' in text
    assert f'cancel_bus_cancel_latency_seconds_count{{{namespace},phase="observed"}} ' in text
    for name in (
        "cancel_bus_active_runs",
        "cancel_bus_cancels_total",
        "cancel_bus_cancel_latency_seconds_bucket",
        "cancel_bus_pubsub_reconnects_total",
    ):
        assert name in text, name
    for stat in dataclasses.fields(BusStats):  # every counter of the bus, none copied by hand
        family = stat.metadata.get("family", stat.name)
        if family:
            reason = stat.metadata.get("reason")
            labels = f',reason="{reason}"' if reason else ""
            series = rf'^cancel_bus_{family}_total\{{bus_namespace="[^"]+"{labels}\}} \d'
            assert re.search(series, text, re.M), series
    assert _get(node, "/openapi.json").json()["info"]["title"] == "cancel-bus node"
    assert "cancel-bus" in _get(node, "/").text


def test_owner_sigkill_resolves_its_runs_as_owner_lost(
    redis_server: EmbeddedServer, tmp_path: Path
) -> None:
    lease = 1.5
    small = Cluster(redis_server.url, 2, tmp_path, lease_ttl=str(lease)).start()
    try:
        victim, survivor = small.nodes
        cancelled_later, left_alone = _start(victim), _start(victim)
        victim.signal(9)
        victim.wait_exit(5)
        t0 = time.monotonic()
        with survivor.client() as client:
            response = client.post(
                f"/v1/runs/{cancelled_later['run_id']}/cancel", json={"timeout": 10}
            )
        assert time.monotonic() - t0 < lease + lease / 3 + 1.5
        assert response.status_code == 200 and response.json()["outcome"] == "owner_lost"
        assert response.json()["run"]["status"] == "cancelled"
        orphan = _wait_status(survivor, left_alone["run_id"], {"failed"}, timeout=5)
        assert orphan["end_reason"] == "owner_lost"
        nodes = _get(survivor, "/v1/nodes").json()["nodes"]
        assert [n["node_id"] for n in nodes] == ["node-2"]
    finally:
        small.stop()
