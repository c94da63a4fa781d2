"""(5) Over HTTP: ``POST /v1/runs/{id}/cancel`` with ``wait=true`` on node B, to the 200
response, from a client process with a kept-alive connection. Nodes A and B are real
``python -m node.cli serve`` processes (uvicorn).

* the service path: the run is the node's simulated agent on A, started with ``POST /v1/runs``
  (``token_interval_ms=0``: a checkpoint after every chunk, each chunk relayed for followers);
* the HTTP layer alone: the run is a tight checkpoint loop on a library node in the same
  cluster, exactly as in the cross-node measurement, so the difference is B's HTTP path.
"""

from __future__ import annotations

from typing import Any

from ._cluster import CANCEL_TIMEOUT, SAMPLE_TIMEOUT, Bench, PairedFloor, new_namespace
from ._harness import Worker

SECTION = "cancel over HTTP (node services, uvicorn)"
FLOOR = "hop:http"
AGENT = {"tokens": 100_000, "token_interval_ms": 0, "turns": 1}


async def _cancel(client: Worker, url: str, run_id: str) -> int:
    answer: dict[str, Any] = await client.call(
        "http_cancel", url=url, run_id=run_id, timeout=CANCEL_TIMEOUT, within=SAMPLE_TIMEOUT
    )
    if answer["code"] != 200:
        raise RuntimeError(f"HTTP cancel of {run_id} answered {answer['code']}")
    elapsed: int = answer["elapsed_ns"]
    return elapsed


async def run(bench: Bench) -> None:
    profile, report = bench.profile, bench.report
    async with bench.stage("http") as (scope, server):
        namespace = new_namespace()
        node_a = await scope.service(server, namespace, "service-a")
        node_b = await scope.service(server, namespace, "service-b")
        library_owner = await scope.node(server, namespace, "library-a")
        client = await scope.worker("http-client")
        floor = await PairedFloor(server, client, library_owner).start()
        hops: list[int] = []
        health: list[int] = []
        service_path: list[int] = []
        http_layer: list[int] = []
        for i in range(profile.warmup + profile.n):
            hop = await floor.sample()
            alive = await client.call("http_get", url=node_b.url, path="/healthz")
            body = {"app_name": "bench", "user_id": "user", "session_id": f"s{i}", "agent": AGENT}
            run_id = await client.call("http_start", url=node_a.url, body=body)
            agent_run = await _cancel(client, node_b.url, run_id)
            run_id = await library_owner.call("run_start")
            tight_run = await _cancel(client, node_b.url, run_id)
            await library_owner.call("run_end", run_id=run_id, timeout=CANCEL_TIMEOUT)
            if i >= profile.warmup:
                hops.append(hop)
                health.append(alive)
                service_path.append(agent_run)
                http_layer.append(tight_run)
    report.set_floor(FLOOR, report.latency(SECTION, "floor: pub/sub hop (paired)", hops))
    report.latency(SECTION, "GET /healthz on node B (the HTTP stack alone)", health, floor=FLOOR)
    row = report.latency(
        SECTION, "HTTP cancel, confirmed (agent on service A)", service_path, floor=FLOOR
    )
    row.expect("p50 ≤ 10x floor", row.ratios["p50"] <= 10.0)
    report.latency(
        SECTION,
        "HTTP cancel, confirmed (tight loop on library node A)",
        http_layer,
        floor=FLOOR,
    )
