"""Double texting over HTTP, on two node processes: ``POST /v1/runs`` with
``multitask_strategy`` on a session whose run is active on the other node."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from node.embedded import EmbeddedServer

from ..helpers import WAIT
from ..node_cluster import Cluster, NodeProcess
from .test_cli import cli

LONG = {"tokens": 100_000, "token_interval_ms": 10}


@pytest.fixture(scope="module")
def nodes(
    redis_server: EmbeddedServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[NodeProcess]]:
    cluster = Cluster(redis_server.url, 2, tmp_path_factory.mktemp("texting")).start()
    yield cluster.nodes
    cluster.stop()


def _start(node: NodeProcess, session: str, **extra: Any) -> tuple[int, dict[str, Any]]:
    body = {"app_name": "chat", "user_id": "u1", "session_id": session, "agent": LONG, **extra}
    with node.client() as client:
        response = client.post("/v1/runs", json=body)
    return response.status_code, response.json()


def _run(node: NodeProcess, run_id: str) -> dict[str, Any]:
    with node.client() as client:
        response = client.get(f"/v1/runs/{run_id}")
    assert response.status_code == 200, response.text
    run: dict[str, Any] = response.json()
    return run


def _ended(node: NodeProcess, run_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT
    while (run := _run(node, run_id))["status"] in ("queued", "running", "waiting"):
        assert time.monotonic() < deadline, run
        time.sleep(0.02)
    return run


@pytest.mark.parametrize(
    ("strategy", "reason"), [("interrupt", "interrupted"), ("rollback", "rolled_back")]
)
def test_a_follow_up_on_another_node_interrupts_the_active_run(
    nodes: list[NodeProcess], strategy: str, reason: str
) -> None:
    session = uuid.uuid4().hex
    status, first = _start(nodes[0], session)
    assert status == 201, first
    status, second = _start(nodes[1], session, multitask_strategy=strategy)
    assert status == 201, second
    ended = _ended(nodes[1], first["run_id"])
    assert ended["status"] == "cancelled" and ended["end_reason"] == reason
    assert ended["cancel_cause"] == strategy and ended["requested_by"] == second["run_id"]
    follow_up = _run(nodes[0], second["run_id"])
    assert follow_up["status"] == "running" and follow_up["interrupted"] == first["run_id"]
    shown = cli("run", first["run_id"], "--url", nodes[0].url)  # the CLI names its successor
    assert shown.returncode == 0, shown.stderr
    assert re.search(rf"replaced by\s+{second['run_id']}", shown.stdout), shown.stdout
    shown = cli("run", second["run_id"], "--url", nodes[0].url)  # and the one it replaced
    assert shown.returncode == 0, shown.stderr
    assert re.search(rf"replaced\s+{first['run_id']}", shown.stdout), shown.stdout


def test_reject_is_a_409_and_leaves_the_run_alone(nodes: list[NodeProcess]) -> None:
    session = uuid.uuid4().hex
    status, first = _start(nodes[0], session)
    assert status == 201, first
    status, answer = _start(nodes[1], session)
    assert status == 409 and first["run_id"] in answer["detail"], answer
    run = _run(nodes[1], first["run_id"])
    assert run["status"] == "running" and run["cancel_requested_at"] is None


def test_follow_ups_enqueued_on_both_nodes_start_in_turn_and_a_session_cancel_stops_all(
    nodes: list[NodeProcess],
) -> None:
    session = uuid.uuid4().hex
    status, first = _start(nodes[0], session)
    assert status == 201, first
    queued = []
    for node in (nodes[1], nodes[0]):  # one on each node, in this order
        status, run = _start(node, session, multitask_strategy="enqueue")
        assert status == 201 and run["status"] == "queued" and run["started_at"] is None, run
        queued.append(run)
    with nodes[1].client() as client:
        answer = client.post(f"/v1/runs/{first['run_id']}/cancel", json={"timeout": WAIT})
    assert answer.status_code == 200 and answer.json()["outcome"] == "cancelled", answer.text
    second = _started(nodes[0], queued[0]["run_id"])
    assert second["owner"] == queued[0]["owner"]  # on the node that asked
    assert _run(nodes[0], queued[1]["run_id"])["status"] == "queued"  # still behind it
    with nodes[0].client() as client:
        answer = client.post(f"/v1/sessions/chat/u1/{session}/cancel", json={"timeout": WAIT})
    assert answer.status_code == 200, answer.text
    assert answer.json()["outcome"] == "cancelled"
    for run in queued:
        ended = _ended(nodes[1], run["run_id"])
        assert ended["status"] == "cancelled", ended
    assert _run(nodes[1], queued[1]["run_id"])["started_at"] is None  # it never started


def _started(node: NodeProcess, run_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT
    while (run := _run(node, run_id))["status"] == "queued":
        assert time.monotonic() < deadline, run
        time.sleep(0.02)
    assert run["status"] == "running", run
    return run


def test_an_unknown_strategy_is_a_422(nodes: list[NodeProcess]) -> None:
    status, answer = _start(nodes[0], uuid.uuid4().hex, multitask_strategy="enqueue-ish")
    assert status == 422 and "multitask_strategy" in answer["detail"], answer
