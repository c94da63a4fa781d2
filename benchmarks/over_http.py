"""(5) Over HTTP: the node's own cost over the framework's (issue 16, target 4).

Everything here is in one stage (one Redis server, the same processes) and taken in rounds: each
round takes one sample of every kind below, in this order, so that all see the same machine:

* a floor hop (the client process -> library node A: PUBLISH, then A's waker wakes);
* the HTTP floor: ``GET /healthz`` on a bare FastAPI/uvicorn app (``_bare_app``: a real server
  process, the node's uvicorn options), and the same on node service B (in turn, one round the
  bare app first, the next node B);
* an HTTP run start: ``POST /v1/runs`` on service A, to its 201 (a run of the simulated agent,
  ``token_interval_ms=0``: a checkpoint and a relayed chunk per loop);
* an HTTP cancel of that run: ``POST /v1/runs/{id}/cancel`` with ``wait=true`` on service B, to
  its 200 (``cancelled``): the service path;
* an HTTP cancel, the same way, of a run in a tight checkpoint loop on library node A: the HTTP
  layer alone over the library's cancel;
* the library's own figures on the same server: a cross-node cancel (library node B cancels a
  tight-loop run on library node A, ``cancel_sample``: observed and confirmed), and one run
  lifecycle (``async with bus.run(): pass``, 1 in flight) on library node B.

Every HTTP request is sent by the same client process (httpx, one kept-alive connection per
server). The targets compare p50s of the same stage: an HTTP cancel ≤ (the HTTP floor + the
library's confirmed cancel) x 1.2, an HTTP start ≤ (the HTTP floor + one lifecycle) x 1.2.
"""

from __future__ import annotations

from typing import Any

from ._cluster import (
    CANCEL_TIMEOUT,
    SAMPLE_TIMEOUT,
    Bench,
    PairedFloor,
    cancel_sample,
    new_namespace,
)
from ._harness import Worker
from ._report import Row

SECTION = "cancel over HTTP (node services, uvicorn)"
FLOOR = "hop:http"
HTTP_FLOOR = "http:bare"
AGENT = {"tokens": 100_000, "token_interval_ms": 0, "turns": 1}
MARGIN = 1.2  # the issue's + 20 %


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
    kinds = ("hop", "bare", "health", "start", "agent", "tight", "lib_observed")
    samples: dict[str, list[int]] = {k: [] for k in (*kinds, "lib_confirmed", "lifecycle")}
    async with bench.stage("http") as (scope, server):
        namespace = new_namespace()
        node_a = await scope.service(server, namespace, "service-a")
        node_b = await scope.service(server, namespace, "service-b")
        bare_app = await scope.bare_app("bare-app")
        library_a, library_b = await scope.nodes(server, namespace, ["library-a", "library-b"])
        client = await scope.worker("http-client")
        floor = await PairedFloor(server, client, library_a).start()
        for i in range(profile.warmup + profile.n):
            taken: dict[str, int] = {"hop": await floor.sample()}
            gets = [("bare", bare_app.url), ("health", node_b.url)]
            for kind, url in gets if i % 2 else gets[::-1]:  # neither always goes first
                taken[kind] = await client.call("http_get", url=url, path="/healthz")
            body = {"app_name": "bench", "user_id": "user", "session_id": f"s{i}", "agent": AGENT}
            started = await client.call("http_start", url=node_a.url, body=body)
            taken["start"] = started["elapsed_ns"]
            taken["agent"] = await _cancel(client, node_b.url, started["run_id"])
            run_id = await library_a.call("run_start")
            taken["tight"] = await _cancel(client, node_b.url, run_id)
            await library_a.call("run_end", run_id=run_id, timeout=CANCEL_TIMEOUT)
            taken["lib_observed"], taken["lib_confirmed"] = await cancel_sample(
                library_a, library_b
            )
            (taken["lifecycle"],) = await library_b.call("lifecycle_once", n=1)
            if i >= profile.warmup:
                for kind, value in taken.items():
                    samples[kind].append(value)
    report.set_floor(FLOOR, report.latency(SECTION, "floor: pub/sub hop (paired)", samples["hop"]))
    bare = report.latency(
        SECTION,
        "HTTP floor: GET /healthz on a bare FastAPI app (uvicorn, the node's options)",
        samples["bare"],
        floor=FLOOR,
    )
    report.set_floor(HTTP_FLOOR, bare, divided=True)
    report.latency(
        SECTION,
        "GET /healthz on node B (÷ the HTTP floor)",
        samples["health"],
        floor=HTTP_FLOOR,
    )
    start = report.latency(
        SECTION,
        "HTTP run start: POST /v1/runs, 201 (agent on service A; ÷ the HTTP floor)",
        samples["start"],
        floor=HTTP_FLOOR,
    )
    agent = report.latency(
        SECTION, "HTTP cancel, confirmed (agent on service A)", samples["agent"], floor=FLOOR
    )
    tight = report.latency(
        SECTION,
        "HTTP cancel, confirmed (tight loop on library node A)",
        samples["tight"],
        floor=FLOOR,
    )
    report.latency(
        SECTION, "library: cross-node cancel, observed", samples["lib_observed"], floor=FLOOR
    )
    confirmed = report.latency(
        SECTION, "library: cross-node cancel, confirmed", samples["lib_confirmed"], floor=FLOOR
    )
    lifecycle = report.latency(
        SECTION, "library: one lifecycle, 1 in flight", samples["lifecycle"], floor=FLOOR
    )
    name = "HTTP cancel (agent) p50 ÷ (HTTP floor + library confirmed cancel)"
    _target(bench, name, agent, bare, confirmed, "library confirmed cancel", expect=True)
    name = "HTTP cancel (tight loop) p50 ÷ (HTTP floor + library confirmed cancel)"
    _target(bench, name, tight, bare, confirmed, "library confirmed cancel", expect=False)
    name = "HTTP run start p50 ÷ (HTTP floor + one lifecycle)"
    _target(bench, name, start, bare, lifecycle, "one lifecycle", expect=True)


def _target(
    bench: Bench, name: str, measured: Row, http: Row, library: Row, what: str, *, expect: bool
) -> None:
    """``measured`` p50 against (``http`` p50 + ``library`` p50): the ratio, and the issue's
    bound (x 1.2) when ``expect``."""
    assert measured.stats is not None and http.stats is not None and library.stats is not None
    allowed = http.stats["p50"] + library.stats["p50"]
    ratio = measured.stats["p50"] / allowed
    note = (
        f"({measured.stats['p50']:.3f} ms against {http.stats['p50']:.3f} ms HTTP floor + "
        f"{library.stats['p50']:.3f} ms {what} = {allowed:.3f} ms; "
        f"the node's own cost {measured.stats['p50'] - allowed:+.3f} ms)"
    )
    row = bench.report.figure(SECTION, name, ratio, "x", note=note)
    if expect:
        row.expect(f"≤ {MARGIN}x (+20 %)", ratio <= MARGIN)
