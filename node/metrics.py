"""Prometheus metrics of one node: what its API answered, and the bus's own counters."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from cancel_bus import BusStats, CancelBus, CancelResult

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


# the attribute redis-py's get_connection_count() tells a pool's connections apart by
_CONNECTION_STATE = "db.client.connection.state"


def _pool_counts(bus: CancelBus) -> list[tuple[int, dict[str, Any]]]:
    """redis-py's count of the bus's command pool, idle and used (none on a cluster, whose
    client has a pool per shard, nor with a redis-py that does not count)."""
    pool = getattr(bus.redis, "connection_pool", None)
    counts = getattr(pool, "get_connection_count", None)
    return list(counts()) if counts is not None else []


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
                "1 if the node holds its lease and listens",
                labels=["bus_namespace"],
            ),
            CounterMetricFamily(
                "cancel_bus_pubsub_reconnects",
                "Reconnects of the subscriber connection",
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
            for count, attributes in _pool_counts(bus):
                connections.add_metric([namespace, str(attributes[_CONNECTION_STATE])], count)
            for family, value in zip(
                families,
                (len(bus.local_runs()), int(bus.ready), bus.pubsub_reconnects),
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


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.cancels = Counter(
            "cancel_bus_cancels",
            "Cancels answered by this node's API, by outcome",
            ["outcome"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "cancel_bus_cancel_latency_seconds",
            "Time from the cancel request to each phase: delivered, observed, finished",
            ["phase"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.runs_started = Counter(
            "cancel_bus_runs_started", "Runs started on this node", registry=self.registry
        )
        self.open_streams = Gauge(
            "cancel_bus_open_streams",
            "Server-sent event streams this node serves now",
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

    def observe_cancel(self, result: CancelResult) -> None:
        self.cancels.labels(result.outcome.value).inc()
        run = result.run
        if run is None or run.cancel_requested_at is None or run.is_active:
            return
        for phase, at in (
            ("delivered", run.cancel_delivered_at),
            ("observed", run.cancel_observed_at),
            ("finished", run.finished_at),
        ):
            if at is not None:
                self.latency.labels(phase).observe(max(0.0, at - run.cancel_requested_at))

    def render(self) -> bytes:
        return generate_latest(self.registry)
