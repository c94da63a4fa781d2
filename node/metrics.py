"""Prometheus metrics of one node: its process, its HTTP API, its runs and cancels, and the
bus's own counters. Every series about a bus carries ``bus_namespace``; the process-wide ones
(process, Python, HTTP, streams, tasks) do not. No ``_created`` series."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterator, Mapping

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cancel_bus import BusStats, CancelBus, CancelResult, RunInfo

disable_created_metrics()  # type: ignore[no-untyped-call]  # a _created series is noise

_LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)


def _counter_families() -> dict[str, tuple[str, list[tuple[str, str, dict[str, str]]]]]:
    """BusStats' fields as Prometheus families: family -> (help, [(field, labels)])."""
    families: dict[str, tuple[str, list[tuple[str, str, dict[str, str]]]]] = {}
    for stat in dataclasses.fields(BusStats):
        meta = dict(stat.metadata)
        family = meta.pop("family", stat.name)
        if not family:  # a total of a labelled family: Prometheus sums it
            continue
        help_text = meta.pop("help")
        families.setdefault(family, (help_text, []))[1].append((stat.name, help_text, meta))
    return families


_BUS_COUNTERS = _counter_families()


class _BusCollector(Collector):
    """Reads the buses' counters at scrape time, one series per namespace (label
    ``bus_namespace``: Prometheus keeps ``namespace`` for the Kubernetes one)."""

    def __init__(self, buses: Mapping[str, CancelBus]) -> None:
        self._buses = buses

    def collect(self) -> Iterator[Metric]:
        families: list[GaugeMetricFamily | CounterMetricFamily] = [
            GaugeMetricFamily(
                "cancel_bus_active_runs", "Runs executing on this node", labels=["bus_namespace"]
            ),
            GaugeMetricFamily(
                "cancel_bus_ready",
                "1 if the node is ready: it holds its lease, listens, and its probes come back",
                labels=["bus_namespace"],
            ),
            CounterMetricFamily(
                "cancel_bus_pubsub_reconnects",
                "Reconnects of the subscriber connection",
                labels=["bus_namespace"],
            ),
            GaugeMetricFamily(
                "cancel_bus_accepted_risks",
                "Risks the node runs with that its settings accepted (an evicting Redis: "
                "CANCEL_BUS_ACCEPT_EVICTION); /readyz names them",
                labels=["bus_namespace"],
            ),
        ]
        connections = GaugeMetricFamily(
            "cancel_bus_redis_connections",
            "Connections of the bus's command pool: idle, or used (checked out)",
            labels=["bus_namespace", "state"],
        )
        counters = {
            family: CounterMetricFamily(
                f"cancel_bus_{family}",
                help_text,
                labels=["bus_namespace", *stats[0][2]],
            )
            for family, (help_text, stats) in _BUS_COUNTERS.items()
        }
        for namespace, bus in self._buses.items():
            for state, count in bus.pool_stats().items():
                connections.add_metric([namespace, state], count)
            for family, value in zip(
                families,
                (len(bus.local_runs()), int(bus.ready), bus.pubsub_reconnects, len(bus.warnings)),
                strict=True,
            ):
                family.add_metric([namespace], value)
            for family_name, (_, stats) in _BUS_COUNTERS.items():
                for name, _, labels in stats:
                    counters[family_name].add_metric(
                        [namespace, *labels.values()], getattr(bus.stats, name)
                    )
        yield from families
        yield connections
        yield from counters.values()


_RUN_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
_HTTP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    """The node's Prometheus metrics, in a registry of its own: the process's, cancels and their
    latency, runs, HTTP requests, streams, the event loop's tasks, and the buses' counters
    (:meth:`watch`)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            self.registry.register(collector)
        ns = ["bus_namespace"]
        self.cancels = Counter(
            "cancel_bus_cancels",
            "Cancels answered by this node's API, by outcome",
            [*ns, "outcome"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "cancel_bus_cancel_latency_seconds",
            "Time from the cancel request to each phase: delivered, observed, finished",
            [*ns, "phase"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.runs_started = Counter(
            "cancel_bus_runs_started", "Runs started on this node", ns, registry=self.registry
        )
        self.runs_finished = Counter(
            "cancel_bus_runs_finished",
            "Runs of this node that ended, by status and end reason (as Redis recorded them)",
            [*ns, "status", "end_reason"],
            registry=self.registry,
        )
        self.run_duration = Histogram(
            "cancel_bus_run_duration_seconds",
            "Time from a run's start to its end, for the runs of this node, by status",
            [*ns, "status"],
            buckets=_RUN_BUCKETS,
            registry=self.registry,
        )
        self.http_requests = Counter(
            "cancel_bus_http_requests",
            "HTTP requests answered, by method, route (its template) and status",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.http_duration = Histogram(
            "cancel_bus_http_request_duration_seconds",
            "Time to answer an HTTP request (a stream: until it ends), by method and route",
            ["method", "route"],
            buckets=_HTTP_BUCKETS,
            registry=self.registry,
        )
        self.open_streams = Gauge(
            "cancel_bus_open_streams",
            "Server-sent event streams this node serves now",
            registry=self.registry,
        )
        self.streams_dropped = Counter(
            "cancel_bus_streams_dropped",
            "Streams ended because their client took nothing for CANCEL_BUS_SSE_SEND_TIMEOUT",
            registry=self.registry,
        )
        self.tasks = Gauge(
            "cancel_bus_node_tasks",
            "asyncio tasks alive in the node's event loop (a leak shows as growth)",
            registry=self.registry,
        )

    def watch(self, buses: Mapping[str, CancelBus]) -> None:
        """Read the buses' counters and the event loop's task count at scrape time."""
        self.registry.register(_BusCollector(buses))
        loop = asyncio.get_running_loop()
        self.tasks.set_function(lambda: len(asyncio.all_tasks(loop)))

    def observe_cancel(self, namespace: str, result: CancelResult) -> None:
        """Count a cancel the API answered, by outcome; for a run that ended, observe the time from
        the request to each phase (delivered, observed, finished)."""
        self.cancels.labels(namespace, result.outcome.value).inc()
        run = result.run
        if run is None or run.cancel_requested_at is None or run.is_active:
            return
        for phase, at in (
            ("delivered", run.cancel_delivered_at),
            ("observed", run.cancel_observed_at),
            ("finished", run.finished_at),
        ):
            if at is not None:
                self.latency.labels(namespace, phase).observe(
                    max(0.0, at - run.cancel_requested_at)
                )

    def observe_finished(self, namespace: str, run: RunInfo) -> None:
        """A run of this node ended (``run``: its final record)."""
        self.runs_finished.labels(namespace, run.status.value, run.end_reason or "").inc()
        if run.finished_at is not None:
            began = run.started_at if run.started_at is not None else run.created_at
            self.run_duration.labels(namespace, run.status.value).observe(
                max(0.0, run.finished_at - began)
            )

    def render(self) -> bytes:
        """The registry in Prometheus's text format."""
        return generate_latest(self.registry)


class HttpMetrics:
    """ASGI middleware: counts each request by method, route template and status, and times
    it. A path no route matches is counted as route ``unmatched`` (no label per stray URL); a
    mount's (the API docs' assets) is its template, ``/docs/assets/{path}``."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500  # if the app fails before it answers
        started = time.perf_counter()
        arrived = dict(scope)  # as it came in: routing writes into ``scope``

        async def counting_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            template = _template(scope, arrived)
            method = scope["method"]
            self.metrics.http_requests.labels(method, template, str(status)).inc()
            self.metrics.http_duration.labels(method, template).observe(
                time.perf_counter() - started
            )


def _template(scope: Scope, arrived: Scope) -> str:
    """The template of the route that answered: an API route puts itself in ``scope``; a plain
    route or a mount (the schema, the API docs' assets) does not, and is found again by matching
    the request as it ``arrived`` against the app's own routes."""
    route: BaseRoute | None = scope.get("route")
    path = getattr(route, "path", None)
    if path:
        return str(path)
    router = getattr(scope.get("app"), "router", None)
    for candidate in getattr(router, "routes", ()):
        template = getattr(candidate, "path_format", None)
        if template and candidate.matches(arrived)[0] is Match.FULL:
            return str(template)
    return "unmatched"
