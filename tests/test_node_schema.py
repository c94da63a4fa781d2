"""Property-based fuzzing of the OpenAPI spec against a live node, with inputs that fit the
schema and inputs that do not: zero 5xx responses."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.generation.modes import GenerationMode

from node.embedded import EmbeddedServer

from .node_cluster import Cluster

EXAMPLES = 40


@pytest.fixture(scope="module")
def live_node(
    redis_server: EmbeddedServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    cluster = Cluster(
        redis_server.url, 1, tmp_path_factory.mktemp("schema"), drain_timeout="0"
    ).start()
    yield cluster
    cluster.stop()


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_input_makes_the_node_fail(live_node: Cluster, mode: GenerationMode) -> None:
    api = schemathesis.openapi.from_url(f"{live_node.nodes[0].url}/openapi.json")
    operations = [result.ok() for result in api.get_all_operations()]
    assert len(operations) >= 12
    statuses: set[int] = set()
    for operation in operations:

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def no_server_error(case: Any) -> None:
            # stream=True: an SSE response is judged by its status line, then closed
            with requests.request(**case.as_transport_kwargs(), timeout=30, stream=True) as r:
                statuses.add(r.status_code)
                assert r.status_code < 500, (case.method, case.formatted_path, r.status_code)

        try:
            no_server_error()
        except Unsatisfiable:
            assert mode is GenerationMode.NEGATIVE  # nothing to break: no parameters, no body
    assert statuses & {200, 201} if mode is GenerationMode.POSITIVE else 422 in statuses
