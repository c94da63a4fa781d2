"""Property-based fuzzing of the OpenAPI spec against a live node with tokens configured, as
each role (no token, a user token, an ops token), with inputs that fit the schema and inputs
that do not: no 5xx, and every answer as documented (a declared status, its content type, a
body that matches its schema).

At least ``CANCEL_BUS_FUZZ_CASES`` requests per role (1,000 by default: the bounded CI run, which
draws the same cases every time, so that CI does not pass or fail on a new draw). A run with the
variable set draws new cases each time; a long one::

    CANCEL_BUS_FUZZ_CASES=50000 .venv/bin/pytest -q tests/node/test_node_schema.py --timeout=0
"""

from __future__ import annotations

import json
import math
import os
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from node.embedded import EmbeddedServer

from ..node_cluster import Cluster

CASES = int(os.environ.get("CANCEL_BUS_FUZZ_CASES", "1000"))
SAME_DRAW = "CANCEL_BUS_FUZZ_CASES" not in os.environ
OPS = "ops-" + uuid.uuid4().hex
USER = "user-" + uuid.uuid4().hex
ROLES = {"anonymous": None, "user": USER, "ops": OPS}
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
MODES = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
# Headers that frame the HTTP message or steer the connection: the client and the server's HTTP
# layer own them. Negative cases carry random extra headers, and one drew "content-length: ry",
# which uvicorn answers with its own plain 400 before any route runs: a broken HTTP message, not
# an input to the API.
FRAMING = frozenset(
    {
        "content-length",
        "transfer-encoding",
        "host",
        "connection",
        "keep-alive",
        "te",
        "trailer",
        "expect",
        "upgrade",
    }
)


@pytest.fixture(scope="module")
def live_node(
    redis_server: EmbeddedServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    tokens = {OPS: {"role": "ops"}, USER: {"role": "user", "user_id": "alice"}}
    cluster = Cluster(
        redis_server.url,
        1,
        tmp_path_factory.mktemp("schema"),
        api_tokens=json.dumps(tokens),
        drain_timeout="0",
    ).start()
    yield cluster
    cluster.stop()


@pytest.mark.parametrize("role", ROLES)
def test_no_input_makes_the_node_fail_or_break_its_schema(live_node: Cluster, role: str) -> None:
    node = live_node.nodes[0]
    config = schemathesis.Config.from_dict({"max-stream-events": 1})  # an SSE answer: 1 event
    api = schemathesis.openapi.from_url(f"{node.url}/openapi.json", config=config)
    operations = [result.ok() for result in api.get_all_operations()]
    assert len(operations) >= 13
    token = ROLES[role]
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    ops = {"Authorization": f"Bearer {OPS}"}
    with_input = [op for op in operations if op.path_parameters or op.query or op.body]
    budget = math.ceil(CASES / (len(with_input) * len(MODES)))
    statuses: Counter[int] = Counter()
    session = requests.Session()  # keep-alive: the fuzzer's own cost stays small
    for operation in operations:
        for mode in MODES:

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(
                max_examples=budget,
                deadline=None,
                database=None,
                derandomize=SAME_DRAW,
                phases=[Phase.generate],  # no shrinking: a failure is reported as found
                suppress_health_check=list(HealthCheck),
            )
            def answers_as_documented(case: Any) -> None:
                for name in [n for n in case.headers or {} if n.lower() in FRAMING]:
                    del case.headers[name]  # the server answers these itself
                response = case.call(session=session, headers=headers, timeout=30)
                statuses[response.status_code] += 1
                case.validate_response(response, checks=CHECKS, headers=headers)
                if response.status_code == 201:  # a started run: stop it, not to load the node
                    run_id = response.json()["run_id"]
                    session.post(
                        f"{node.url}/v1/runs/{run_id}/cancel", json={"wait": False}, headers=ops
                    )

            try:
                answers_as_documented()
            except Unsatisfiable:
                assert mode is GenerationMode.NEGATIVE  # nothing to break: no input at all
    session.close()
    assert sum(statuses.values()) >= CASES, statuses
    # a body that is not JSON is a 400 before the token is looked at (FastAPI reads the body
    # first); JSON of the wrong shape waits for the token (401), then is a 422
    expected = {"anonymous": {400, 401}, "user": {200, 403, 422}, "ops": {200, 201, 422}}[role]
    assert expected <= set(statuses), statuses
