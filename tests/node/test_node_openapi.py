"""The OpenAPI document declares the bearer scheme and, route by route, the answers it can give;
/docs and /redoc are served from the node's own files (no CDN). The rendering in a real browser,
offline, is in tests/node/test_dashboard.py."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from node.app import create_app
from node.settings import Settings

OPEN = {("get", "/healthz"), ("get", "/readyz")}
BODY = {400, 413, 422, 503}
# route -> every status it can answer (the fuzzing of tests/node/test_node_schema.py checks that
# nothing else comes back; this checks nothing else is promised)
ANSWERS = {
    ("post", "/v1/runs"): {201, 401, 403, 404, 409} | BODY,
    ("post", "/v1/runs/stream"): {200, 401, 403, 404, 409} | BODY,
    ("get", "/v1/runs/{run_id}/stream"): {200, 401, 404, 422, 503},
    ("post", "/v1/runs/{run_id}/cancel"): {200, 202, 401, 404, 409} | BODY,
    ("post", "/v1/sessions/{app_name}/{user_id}/{session_id}/cancel"): {200, 202, 401, 404, 409}
    | BODY,
    ("get", "/v1/runs"): {200, 401, 422, 503},
    ("get", "/v1/runs/{run_id}"): {200, 401, 404, 422, 503},
    ("get", "/v1/runs/{run_id}/events"): {200, 401, 404, 422, 503},
    ("get", "/v1/nodes"): {200, 401, 403, 503},
    ("post", "/v1/cancel-where"): {200, 401} | BODY,
    ("get", "/v1/tombstones"): {200, 401, 503},
    ("delete", "/v1/tombstones/{tombstone_id}"): {200, 401, 404, 422, 503},
    ("get", "/v1/dashboard/feed"): {200, 401, 422},
    ("get", "/metrics"): {200, 401, 403},
    ("get", "/healthz"): {200, 503},
    ("get", "/readyz"): {200, 503},
}


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    # no lifespan: the node does not start, the static routes and the schema answer alone
    yield TestClient(create_app(Settings(redis_url="redis://unused")))


def _operations(spec: dict[str, Any]) -> Iterator[tuple[tuple[str, str], dict[str, Any]]]:
    for path, item in spec["paths"].items():
        for method, operation in item.items():
            yield (method, path), operation


def test_each_route_declares_the_bearer_scheme_and_its_own_answers(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    bearer = spec["components"]["securitySchemes"]["HTTPBearer"]
    assert bearer["type"] == "http" and bearer["scheme"] == "bearer"
    assert dict(_operations(spec)).keys() == ANSWERS.keys()
    for route, operation in _operations(spec):
        statuses = {int(code) for code in operation["responses"]}
        assert statuses == ANSWERS[route], route
        for code, answer in operation["responses"].items():
            assert answer["description"] not in ("Additional Response", ""), (route, code)
        security = operation.get("security")
        if route in OPEN:
            assert security is None, route
        elif route == ("get", "/metrics"):  # a token unless CANCEL_BUS_METRICS_REQUIRE_TOKEN=false
            assert security == [{"HTTPBearer": []}, {}]
        else:
            assert security == [{"HTTPBearer": []}], route
    text = client.get("/openapi.json").text
    assert "HTTPValidationError" not in text  # every 422 is the node's own ValidationProblem


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_api_docs_load_only_the_node_own_assets(client: TestClient, page: str) -> None:
    html = client.get(page).text
    assets = re.findall(r"""(?:src|href)=["']([^"']+)["']""", html)
    assert assets, html
    for asset in assets:
        assert asset.startswith("/"), f"{page} loads {asset} from elsewhere"
        response = client.get(asset)
        assert response.status_code == 200, asset
        if asset.endswith((".js", ".css")):
            assert len(response.content) > 100_000, asset  # the real bundle, not a stub
    assert "cdn" not in html and "https://" not in html


def test_healthz_fails_while_the_embedded_server_is_down(client: TestClient) -> None:
    node = client.app.state.node  # type: ignore[attr-defined]
    problem = "the embedded server did not start again: ..."
    node.embedded.problem = problem
    try:
        answer = client.get("/healthz")
    finally:
        node.embedded.problem = None
    assert answer.status_code == 503
    assert answer.json() == {"status": "failing", "problem": problem}
    assert client.get("/healthz").json() == {"status": "ok"}
