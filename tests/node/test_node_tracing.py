"""OpenTelemetry across node processes: a cancel asked on one node of a run on another is one
trace, continued from the caller's ``traceparent``, with the spans of both nodes in order. The
nodes export over OTLP/HTTP to a receiver this test runs; the bus messages are sealed (the
trace context is one of the fields the seal covers)."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from node.embedded import EmbeddedServer, free_port
from node.telemetry import wanted

from ..helpers import WAIT
from ..node_cluster import Cluster

pytest.importorskip("opentelemetry.sdk")
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)

LONG = {"tokens": 100_000, "token_interval_ms": 20}


@dataclass(frozen=True)
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    instance: str  # the exporting node (service.instance.id)
    attributes: dict[str, str]


class Receiver:
    """An OTLP/HTTP trace receiver: every span exported to it, decoded."""

    def __init__(self) -> None:
        self.port = free_port()
        self.spans: list[Span] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest.FromString(body)
                receiver.add(request)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def add(self, request: ExportTraceServiceRequest) -> None:
        for resource_spans in request.resource_spans:
            resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    attributes = {a.key: a.value.string_value for a in span.attributes}
                    with self._lock:
                        self.spans.append(
                            Span(
                                span.name,
                                span.trace_id.hex(),
                                span.span_id.hex(),
                                span.parent_span_id.hex(),
                                span.kind,
                                resource.get("service.instance.id", ""),
                                attributes,
                            )
                        )

    def trace(self, trace_id: str) -> list[Span]:
        with self._lock:
            return [span for span in self.spans if span.trace_id == trace_id]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    running = Receiver()
    yield running
    running.close()


@pytest.fixture
def traced(redis_server: EmbeddedServer, receiver: Receiver, tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster(redis_server.url, 2, tmp_path, signing_key=secrets.token_hex(16))
    for node in cluster.nodes:
        node.env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{receiver.port}"
        node.env["OTEL_RESOURCE_ATTRIBUTES"] = f"service.instance.id={node.name}"
        node.env["OTEL_BSP_SCHEDULE_DELAY"] = "50"  # ms: exported soon after they end
    yield cluster.start()
    cluster.stop()


def test_a_cancel_across_two_nodes_is_one_trace_from_the_callers_context(
    traced: Cluster, receiver: Receiver
) -> None:
    owner, asker = traced.nodes
    with owner.client() as client:
        started = client.post(
            "/v1/runs", json={"app_name": "a", "user_id": "u", "session_id": "s", "agent": LONG}
        )
    assert started.status_code == 201, started.text
    run_id = started.json()["run_id"]
    trace_id, caller_span = secrets.token_hex(16), secrets.token_hex(8)
    with asker.client() as client:
        answer = client.post(
            f"/v1/runs/{run_id}/cancel",
            json={"timeout": 5},
            headers={"traceparent": f"00-{trace_id}-{caller_span}-01"},
        )
    assert answer.status_code == 200 and answer.json()["outcome"] == "cancelled", answer.text
    record = answer.json()["run"]
    assert record["cancel_traceparent"].split("-")[1] == trace_id  # kept with the cancel

    wanted_names = {"cancel_bus.cancel", "cancel_bus.deliver", "cancel_bus.observe"}
    wanted_names |= {"cancel_bus.finish"}
    deadline = time.monotonic() + WAIT
    while not wanted_names <= {span.name for span in receiver.trace(trace_id)}:
        assert time.monotonic() < deadline, receiver.trace(trace_id)
        time.sleep(0.05)
    spans = receiver.trace(trace_id)
    by_name = {span.name: span for span in spans}
    server = next(s for s in spans if s.parent_id == caller_span)  # the HTTP server's span
    assert server.instance == asker.name and server.kind == 2  # SPAN_KIND_SERVER
    cancel = by_name["cancel_bus.cancel"]
    assert cancel.instance == asker.name and cancel.parent_id == server.span_id
    assert cancel.attributes["cancel_bus.target"] == f"run:{run_id}"
    assert cancel.attributes["cancel_bus.outcome"] == "cancelled"
    for name in ("cancel_bus.deliver", "cancel_bus.observe", "cancel_bus.finish"):
        span = by_name[name]  # on the owner, below the asker's cancel
        assert span.instance == owner.name and span.parent_id == cancel.span_id, span
        assert span.attributes["cancel_bus.run_id"] == run_id
    assert by_name["cancel_bus.finish"].attributes["cancel_bus.status"] == "cancelled"


@pytest.mark.parametrize(
    ("environ", "asks"),
    [
        ({}, None),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, "OTEL_EXPORTER_OTLP_ENDPOINT"),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c"}, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": " "}, None),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_SDK_DISABLED": "TRUE"}, None),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_TRACES_EXPORTER": "none"}, None),
        ({"OTEL_SERVICE_NAME": "x"}, None),  # naming a service asks for nothing
    ],
)
def test_only_an_otlp_endpoint_turns_tracing_on(environ: dict[str, str], asks: str | None) -> None:
    assert wanted(environ) == asks
