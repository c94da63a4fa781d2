"""/metrics of a real node, scraped and parsed as Prometheus would: process and platform
collectors, finished runs by status and end reason, run durations, HTTP requests by route and
status, ``bus_namespace`` on every series about a bus, no ``_created`` series; and the access
log, on by default and off by setting."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from node.embedded import EmbeddedServer

from ..node_cluster import Cluster, NodeProcess

# the series of the process as a whole; every other cancel_bus_* series is about one bus
PROCESS_WIDE = {
    "cancel_bus_open_streams",
    "cancel_bus_streams_dropped",
    "cancel_bus_node_tasks",
    "cancel_bus_http_requests",
    "cancel_bus_http_request_duration_seconds",
}


@pytest.fixture(scope="module")
def cluster(
    redis_server: EmbeddedServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    running = Cluster(redis_server.url, 1, tmp_path_factory.mktemp("metrics")).start()
    yield running
    running.stop()


def _scrape(node: NodeProcess) -> dict[str, list[Sample]]:
    text = httpx.get(f"{node.url}/metrics", timeout=10).text
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def _value(samples: list[Sample], name: str, **labels: str) -> float:
    return sum(
        s.value
        for s in samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def _run(node: NodeProcess, agent: dict[str, Any]) -> dict[str, Any]:
    body = {"app_name": "m", "user_id": "u", "session_id": uuid.uuid4().hex, "agent": agent}
    with node.client() as client:
        response = client.post("/v1/runs", json=body)
    assert response.status_code == 201
    run: dict[str, Any] = response.json()
    return run


def _wait_until(check: Any, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_metrics_follow_the_conventions(cluster: Cluster) -> None:
    node = cluster.nodes[0]
    _run(node, {"tokens": 2, "token_interval_ms": 1})
    long = _run(node, {"tokens": 100_000, "token_interval_ms": 5})
    with node.client() as client:
        cancelled = client.post(f"/v1/runs/{long['run_id']}/cancel", json={"timeout": 10})
        assert cancelled.json()["outcome"] == "cancelled"  # from the owner itself
        assert client.get("/v1/runs/no-such-run").status_code == 404
        assert client.get("/v1/runs", params={"limit": 0}).status_code == 422
        assert client.get("/no/such/path").status_code == 404

    def finished() -> bool:
        families = _scrape(node)
        return _value(families["cancel_bus_runs_finished"], "cancel_bus_runs_finished_total") >= 2

    _wait_until(finished)  # the short run's end is counted once Redis has recorded it
    families = _scrape(node)

    for family in ("process_cpu_seconds", "process_resident_memory_bytes", "python_info"):
        assert family in families, family
    assert "python_gc_objects_collected" in families

    runs = families["cancel_bus_runs_finished"]
    total = "cancel_bus_runs_finished_total"
    assert _value(runs, total, status="succeeded", end_reason="completed") >= 1
    assert _value(runs, total, status="cancelled", end_reason="cancelled") >= 1
    durations = families["cancel_bus_run_duration_seconds"]
    assert _value(durations, "cancel_bus_run_duration_seconds_count") >= 2
    assert _value(durations, "cancel_bus_run_duration_seconds_bucket", le="+Inf") >= 2

    http = families["cancel_bus_http_requests"]
    http_total = "cancel_bus_http_requests_total"
    assert _value(http, http_total, method="POST", route="/v1/runs", status="201") >= 2
    assert _value(http, http_total, method="GET", route="/v1/runs/{run_id}", status="404") >= 1
    assert _value(http, http_total, method="GET", route="/v1/runs", status="422") >= 1
    assert _value(http, http_total, method="GET", route="unmatched", status="404") >= 1
    latency = families["cancel_bus_http_request_duration_seconds"]
    count = "cancel_bus_http_request_duration_seconds_count"
    assert _value(latency, count, method="POST", route="/v1/runs/{run_id}/cancel") >= 1

    delivered = families["cancel_bus_cancels_delivered"]
    assert _value(delivered, "cancel_bus_cancels_delivered_total") >= 1  # same-node cancel
    assert _value(families["cancel_bus_cancels"], "cancel_bus_cancels_total", outcome="cancelled")

    for name, samples in families.items():
        for sample in samples:
            assert not sample.name.endswith("_created"), sample.name
            if name.startswith("cancel_bus_") and name not in PROCESS_WIDE:
                assert sample.labels.get("bus_namespace") == cluster.namespace, sample


def test_static_files_and_the_docs_assets_are_labelled_by_their_route(cluster: Cluster) -> None:
    """The API docs' scripts and styles (a mount) count under their template, not as
    ``unmatched``; the dashboard's files and the docs pages under their own paths."""
    node = cluster.nodes[0]
    wanted = {
        "/docs/assets/swagger-ui.css": "/docs/assets/{path}",
        "/docs/assets/redoc.standalone.js": "/docs/assets/{path}",
        "/docs/assets/no-such-file.js": "/docs/assets/{path}",  # a 404 of the mount: its own
        "/docs": "/docs",
        "/redoc": "/redoc",
        "/openapi.json": "/openapi.json",
        "/dashboard/route.js": "/dashboard/route.js",
        "/dashboard.css": "/dashboard.css",
    }
    before = _scrape(node)["cancel_bus_http_requests"]
    answers = {path: httpx.get(f"{node.url}{path}", timeout=10).status_code for path in wanted}
    assert answers["/docs/assets/no-such-file.js"] == 404
    assert {code for path, code in answers.items() if "no-such" not in path} == {200}
    after = _scrape(node)["cancel_bus_http_requests"]
    total = "cancel_bus_http_requests_total"
    for path, route in wanted.items():
        code = str(answers[path])
        counted = sum(1 for p, r in wanted.items() if r == route and str(answers[p]) == code)
        grown = _value(after, total, method="GET", route=route, status=code) - _value(
            before, total, method="GET", route=route, status=code
        )
        assert grown == counted, (path, route, grown)
    unmatched = _value(after, total, route="unmatched") - _value(before, total, route="unmatched")
    assert unmatched == 0


def test_the_access_log_is_on_by_default_and_off_by_setting(
    cluster: Cluster, redis_server: EmbeddedServer, tmp_path: Path
) -> None:
    logged = cluster.nodes[0]
    quiet_cluster = Cluster(redis_server.url, 1, tmp_path, access_log="false").start()
    try:
        quiet = quiet_cluster.nodes[0]
        for node in (logged, quiet):
            assert httpx.get(f"{node.url}/v1/runs?limit=7", timeout=10).status_code == 200
        line = '"GET /v1/runs?limit=7 HTTP/1.1" 200'
        _wait_until(lambda: line in logged.log_path.read_text())
        # uvicorn logs (and flushes) the line as the response starts: it would be there now
        assert line not in quiet.log_path.read_text()
    finally:
        quiet_cluster.stop()
