"""``GET /v1/runs`` answers exactly what it is asked, on a real node serving two namespaces: the
status filter (``finished`` included), the most recent first across namespaces (an active run
by its creation, a finished one by its end), the filters the node applies, and pages."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from cancel_bus import CancelBus
from node.embedded import EmbeddedServer

from ..node_cluster import Cluster, NodeProcess

LONG = {"tokens": 100_000, "token_interval_ms": 10}
SHORT = {"tokens": 2, "token_interval_ms": 1}


@pytest.fixture(scope="module")
def node(
    redis_server: EmbeddedServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[NodeProcess]:
    other = f"other-{uuid.uuid4().hex[:8]}"  # app "other" is served in a namespace of its own
    cluster = Cluster(
        redis_server.url,
        1,
        tmp_path_factory.mktemp("runs"),
        app_namespaces=json.dumps({"other": other}),
    ).start()
    yield cluster.nodes[0]
    cluster.stop()


def _start(node: NodeProcess, user: str, app: str = "app", **extra: Any) -> dict[str, Any]:
    body = {"app_name": app, "user_id": user, "session_id": uuid.uuid4().hex, **extra}
    body.setdefault("agent", LONG)
    with node.client() as client:
        response = client.post("/v1/runs", json=body)
    assert response.status_code == 201, response.text
    run: dict[str, Any] = response.json()
    return run


def _list(node: NodeProcess, **params: Any) -> dict[str, Any]:
    with node.client() as client:
        response = client.get("/v1/runs", params=params)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def _ids(answer: dict[str, Any]) -> list[str]:
    return [run["run_id"] for run in answer["runs"]]


def _wait_finished(node: NodeProcess, run_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 10
    with node.client() as client:
        while time.monotonic() < deadline:
            run: dict[str, Any] = client.get(f"/v1/runs/{run_id}").json()
            if run["finished_at"] is not None:
                return run
            time.sleep(0.02)
    raise AssertionError(f"run {run_id} did not finish")


def _cancel_all(node: NodeProcess, runs: list[dict[str, Any]]) -> None:
    with node.client() as client:
        for run in runs:
            client.post(f"/v1/runs/{run['run_id']}/cancel", json={"wait": False})


def test_the_most_recent_first_across_namespaces_whatever_the_status(node: NodeProcess) -> None:
    user = f"u-{uuid.uuid4().hex[:8]}"
    # created first, in the other namespace, it ends after the three others have started
    ends_last = _start(node, user, app="other", agent={"tokens": 30, "token_interval_ms": 20})
    active = [_start(node, user) for _ in range(3)]
    final = _wait_finished(node, ends_last["run_id"])
    assert final["finished_at"] > max(run["created_at"] for run in active)
    try:
        newest = [ends_last["run_id"], active[2]["run_id"], active[1]["run_id"]]
        assert _ids(_list(node, status="all", user_id=user, limit=3)) == newest
        finished = _list(node, status="finished", user_id=user)
        assert _ids(finished) == [ends_last["run_id"]] and not finished["more"]
        assert _ids(_list(node, status="succeeded", user_id=user)) == [ends_last["run_id"]]
        running = [run["run_id"] for run in reversed(active)]
        assert _ids(_list(node, status="active", user_id=user)) == running
        assert _ids(_list(node, status="running", user_id=user)) == running
        assert _list(node, status="cancelled", user_id=user)["runs"] == []
        answer = _list(node, status="all", user_id=user, limit=2)
        assert answer["more"] and abs(answer["at"] - time.time()) < 5  # the server's clock
    finally:
        _cancel_all(node, active)


def test_the_filters_the_node_applies_and_pages(node: NodeProcess) -> None:
    user = f"u-{uuid.uuid4().hex[:8]}"
    done = [_start(node, user, agent=SHORT) for _ in range(2)]
    active = [_start(node, user) for _ in range(3)]
    for run in done:
        _wait_finished(node, run["run_id"])
    try:
        everyone = _ids(_list(node, status="all", user_id=user))
        assert len(everyone) == 5
        pick = active[1]
        by_session = _list(node, status="all", user_id=user, session_id=pick["session_id"])
        assert _ids(by_session) == [pick["run_id"]]
        by_prefix = _list(node, status="all", user_id=user, id_prefix=pick["run_id"][:12])
        assert _ids(by_prefix) == [pick["run_id"]]
        assert set(_ids(_list(node, status="all", user_id=user, phase="done"))) == {
            run["run_id"] for run in done
        }
        assert len(_ids(_list(node, status="all", user_id=user, phase="llm"))) == 3
        assert _list(node, status="all", user_id=user, phase="tool")["runs"] == []
        assert _list(node, status="all", user_id=user, min_age=3600)["runs"] == []
        assert len(_ids(_list(node, status="all", user_id=user, max_age=3600))) == 5
        assert _list(node, status="all", user_id=user, max_age=0.000001)["runs"] == []

        pages = [_list(node, status="all", user_id=user, limit=2, offset=i) for i in (0, 2, 4)]
        assert [page["more"] for page in pages] == [True, True, False]
        assert [run_id for page in pages for run_id in _ids(page)] == everyone
        paged_filter = _list(node, status="all", user_id=user, phase="llm", limit=2, offset=2)
        assert len(paged_filter["runs"]) == 1 and not paged_filter["more"]
    finally:
        _cancel_all(node, active)


def test_a_parents_children_are_found_however_many_runs_came_after(
    node: NodeProcess, redis_server: EmbeddedServer
) -> None:
    user = f"u-{uuid.uuid4().hex[:8]}"
    parent = _start(node, user)
    child = _start(node, user, agent=SHORT, parent=parent["run_id"])
    _wait_finished(node, child["run_id"])

    async def crowd() -> None:  # more runs than a list looks through, all of them newer
        bus = CancelBus(redis_server.url, namespace=node.env["CANCEL_BUS_NAMESPACE"])
        await bus.start()
        try:
            for _ in range(11):
                await asyncio.gather(*(_empty_run(bus, user) for _ in range(100)))
        finally:
            await bus.close()

    asyncio.run(crowd())
    try:
        found = _list(node, status="all", user_id=user, parent=parent["run_id"])
        assert _ids(found) == [child["run_id"]]
        assert _list(node, status="active", parent=parent["run_id"])["runs"] == []
    finally:
        _cancel_all(node, [parent])


async def _empty_run(bus: CancelBus, user: str) -> None:
    async with bus.run(app_name="app", user_id=user, session_id=uuid.uuid4().hex, detached=True):
        pass


@pytest.mark.parametrize(
    ("params", "where"),
    [
        ({"status": "bogus"}, "query.status"),
        ({"limit": 900, "offset": 200}, "query.offset"),
        ({"min_age": "NaN"}, "query.min_age"),
        ({"id_prefix": "a b"}, "query.id_prefix"),
        ({"session_id": "*"}, "query.session_id"),
    ],
)
def test_a_bad_filter_is_a_422_that_says_where(
    node: NodeProcess, params: dict[str, Any], where: str
) -> None:
    with node.client() as client:
        response = client.get("/v1/runs", params=params)
    assert response.status_code == 422 and where in response.json()["detail"], response.text
