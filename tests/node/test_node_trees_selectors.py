"""Cancel trees, selector cancels, tombstones and readiness through the node's HTTP API, on real
node processes: a tree across three nodes cancelled from a fourth, a preview that changes
nothing, a tombstone that catches a run started after the cancel, a user's selector confined to
its own runs, and a node whose subscription dies turning unready with the reason."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from cancel_bus._keys import KeySpace
from node.api import MAX_USER_TOMBSTONES
from node.embedded import EmbeddedServer

from ..node_cluster import Cluster, NodeProcess

OPS = "ops-" + uuid.uuid4().hex
ALICE = "alice-" + uuid.uuid4().hex
BOB = "bob-" + uuid.uuid4().hex
TOKENS = {
    OPS: {"role": "ops", "name": "oncall"},
    ALICE: {"role": "user", "user_id": "alice"},
    BOB: {"role": "user", "user_id": "bob"},
}
LONG = {"tokens": 100_000, "token_interval_ms": 5}
OTHER_APP = "billing"  # served in a namespace of its own


@pytest.fixture(scope="module")
def cluster(
    redis_server: EmbeddedServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    billing = f"billing-{uuid.uuid4().hex[:8]}"
    running = Cluster(
        redis_server.url,
        4,
        tmp_path_factory.mktemp("trees"),
        api_tokens=json.dumps(TOKENS),
        app_namespaces=json.dumps({OTHER_APP: billing}),
    ).start()
    yield running
    running.stop()


def _call(
    node: NodeProcess, method: str, path: str, body: Any = None, token: str = OPS
) -> httpx.Response:
    with node.client(token) as client:
        return client.request(method, path, json=body)


def _start(
    node: NodeProcess, user: str = "u", app: str = "app", token: str = OPS, **extra: Any
) -> httpx.Response:
    body = {"app_name": app, "user_id": user, "session_id": uuid.uuid4().hex, "agent": LONG}
    return _call(node, "POST", "/v1/runs", {**body, **extra}, token)


def _started(node: NodeProcess, **options: Any) -> dict[str, Any]:
    response = _start(node, **options)
    assert response.status_code == 201, response.text
    run: dict[str, Any] = response.json()
    return run


def _run(node: NodeProcess, run_id: str) -> dict[str, Any]:
    response = _call(node, "GET", f"/v1/runs/{run_id}")
    assert response.status_code == 200, response.text
    run: dict[str, Any] = response.json()
    return run


def _cancel_where(
    node: NodeProcess, token: str = OPS, expect: int = 200, **body: Any
) -> dict[str, Any]:
    response = _call(node, "POST", "/v1/cancel-where", body, token)
    assert response.status_code == expect, response.text
    answer: dict[str, Any] = response.json()
    return answer


def _user() -> str:
    return f"u-{uuid.uuid4().hex[:8]}"


def test_a_tree_across_three_nodes_is_cancelled_from_a_fourth_leaves_first(
    cluster: Cluster,
) -> None:
    n1, n2, n3, n4 = cluster.nodes
    root = _started(n1)
    child = _started(n2, parent=root["run_id"])
    grandchild = _started(n3, parent=child["run_id"])
    assert (root["owner"], child["owner"], grandchild["owner"]) == ("node-1", "node-2", "node-3")
    assert child["parent"] == root["run_id"] and grandchild["parent"] == child["run_id"]
    children = _call(n4, "GET", f"/v1/runs?status=all&parent={root['run_id']}").json()["runs"]
    assert [run["run_id"] for run in children] == [child["run_id"]]

    answer = _call(n4, "POST", f"/v1/runs/{root['run_id']}/cancel", {"reason": "tree"})
    assert answer.status_code == 200, answer.text
    tree = answer.json()
    assert tree["outcome"] == "cancelled" and tree["run"]["run_id"] == root["run_id"]
    below = tree["descendants"]
    assert [d["run"]["run_id"] for d in below] == [grandchild["run_id"], child["run_id"]]
    assert all(d["outcome"] == "cancelled" and d["run"]["status"] == "cancelled" for d in below)
    for run_id, cause in (
        (root["run_id"], "user"),
        (child["run_id"], "parent"),
        (grandchild["run_id"], "parent"),
    ):
        final = _run(n4, run_id)
        assert final["status"] == "cancelled" and final["cancel_cause"] == cause, final
        assert final["cancel_reason"] == "tree"

    late = _start(n2, parent=root["run_id"])  # a child of a cancelled run never starts
    assert late.status_code == 409
    detail = late.json()["detail"]
    assert "cancelled at its start: its parent's cancel was accepted" in detail
    late_id = detail.split()[1]
    assert _run(n1, late_id)["status"] == "cancelled"
    leak = _run(n1, root["run_id"])["leaked_after_cancel"]  # its code started it after its end
    assert leak is not None and leak["calls"] == {"child_started": 1}


def test_a_parent_must_be_a_visible_run_of_the_same_namespace(cluster: Cluster) -> None:
    n1 = cluster.nodes[0]
    assert _start(n1, parent="no-such-run").status_code == 404
    assert _start(n1, parent="a b").status_code == 422
    bobs = _started(n1, user="bob", token=BOB)
    hidden = _start(n1, user="alice", token=ALICE, parent=bobs["run_id"])
    assert hidden.status_code == 404 and hidden.json() == {
        "detail": f"parent run {bobs['run_id']} not found"
    }
    elsewhere = _start(n1, app=OTHER_APP, parent=bobs["run_id"])
    assert elsewhere.status_code == 422 and "body.parent" in elsewhere.json()["detail"]
    _call(n1, "POST", f"/v1/runs/{bobs['run_id']}/cancel")


def test_the_preview_changes_nothing_then_the_cancel_takes_what_matches(cluster: Cluster) -> None:
    n1, n2, n3, n4 = cluster.nodes
    user = _user()
    chosen = [_started(n1, user=user, app="shop"), _started(n2, user=user, app="shop")]
    spared = _started(n3, user=user, app="bank")

    preview = _cancel_where(n4, user_id=user, app_name="shop")  # dry_run is the default
    assert preview["dry_run"] is True and preview["matched"] == 2
    assert sorted(preview["run_ids"]) == sorted(run["run_id"] for run in chosen)
    assert preview["results"] == [] and preview["tombstones"] == []
    assert all(_run(n4, run["run_id"])["status"] == "running" for run in (*chosen, spared))

    done = _cancel_where(n4, user_id=user, app_name="shop", dry_run=False, reason="bulk")
    assert done["matched"] == 2 and not done["dry_run"] and done["tombstones"] == []
    outcomes = {result["run_id"]: result for result in done["results"]}
    assert outcomes.keys() == {run["run_id"] for run in chosen}
    for result in outcomes.values():
        assert result["outcome"] == "cancelled" and result["status"] == "cancelled"
        assert result["stopped_after"] is not None and result["descendants"] == []
        final = _run(n4, result["run_id"])
        assert final["cancel_reason"] == "bulk" and final["requested_by"] == "oncall"
    assert _run(n4, spared["run_id"])["status"] == "running"
    _call(n4, "POST", f"/v1/runs/{spared['run_id']}/cancel")


def test_a_tombstone_cancels_a_run_started_after_the_cancel(cluster: Cluster) -> None:
    n1, n2 = cluster.nodes[:2]
    user = _user()
    laid = _cancel_where(
        n1, user_id=user, app_name="app", dry_run=False, ttl=30, reason="stop everything"
    )
    assert laid["matched"] == 0
    [tombstone] = laid["tombstones"]
    assert tombstone["selector"] == {"app_name": "app", "user_id": user}
    assert 29 <= tombstone["expires_at"] - laid["at"] <= 31
    time.sleep(0.1)  # the scenario: a run being started 100 ms after the "stop everything"
    caught = _start(n2, user=user)
    assert caught.status_code == 409, caught.text
    detail = caught.json()["detail"]
    assert "cancelled at its start: a tombstone holds runs like it" in detail
    run = _run(n1, detail.split()[1])
    assert run["status"] == "cancelled" and run["cancel_reason"] == "stop everything"
    assert run["started_at"] is None  # it never ran

    listed = _call(n2, "GET", "/v1/tombstones").json()["tombstones"]
    assert tombstone["tombstone_id"] in {t["tombstone_id"] for t in listed}
    removed = _call(n2, "DELETE", f"/v1/tombstones/{tombstone['tombstone_id']}")
    assert removed.status_code == 200
    assert removed.json()["tombstone_id"] == tombstone["tombstone_id"]
    again = _call(n2, "DELETE", f"/v1/tombstones/{tombstone['tombstone_id']}")
    assert again.status_code == 404
    free = _started(n2, user=user)  # lifted: runs start again
    _call(n1, "POST", f"/v1/runs/{free['run_id']}/cancel")


def test_a_user_token_cancels_and_holds_only_its_own_runs(cluster: Cluster) -> None:
    n1, n2 = cluster.nodes[:2]
    app = f"shared-{uuid.uuid4().hex[:6]}"
    alices = _started(n1, user="alice", app=app, token=ALICE)
    bobs = _started(n2, user="bob", app=app, token=BOB)

    others = _cancel_where(n1, ALICE, user_id="bob", dry_run=False, ttl=30)
    assert others["matched"] == 0 and others["tombstones"] == []  # like an unknown user
    everything = _cancel_where(n1, ALICE, app_name=app, dry_run=False, ttl=30)
    assert everything["run_ids"] == [alices["run_id"]]
    assert everything["results"][0]["outcome"] == "cancelled"
    [tombstone] = everything["tombstones"]
    assert tombstone["selector"] == {"app_name": app, "user_id": "alice"}
    assert _run(n2, bobs["run_id"])["status"] == "running"  # untouched
    later = _started(n2, user="bob", app=app, token=BOB)  # alice's tombstone holds only hers
    assert _start(n2, user="alice", app=app, token=ALICE).status_code == 409

    ops_hold = _cancel_where(n1, app_name=f"{app}-x", dry_run=False, ttl=30)["tombstones"][0]
    mine, theirs = tombstone["tombstone_id"], ops_hold["tombstone_id"]
    assert _tombstone_ids(n1, ALICE) == {mine} and _tombstone_ids(n1, BOB) == set()
    assert {mine, theirs} <= _tombstone_ids(n1, OPS)
    for token, tombstone_id in ((BOB, mine), (ALICE, theirs)):  # as if there were none
        path = f"/v1/tombstones/{tombstone_id}"
        assert _call(n1, "DELETE", path, token=token).status_code == 404
    for token, tombstone_id in ((ALICE, mine), (OPS, theirs)):
        path = f"/v1/tombstones/{tombstone_id}"
        assert _call(n1, "DELETE", path, token=token).status_code == 200
    for run in (bobs, later):
        _call(n1, "POST", f"/v1/runs/{run['run_id']}/cancel")


def test_a_user_token_holds_a_bounded_number_of_tombstones(cluster: Cluster) -> None:
    """A namespace holds at most 1,000 tombstones, for everyone: a user may not take them."""
    n1 = cluster.nodes[0]
    app = f"cap-{uuid.uuid4().hex[:6]}"
    laid: list[dict[str, Any]] = []
    for _ in range(MAX_USER_TOMBSTONES):
        laid += _cancel_where(n1, ALICE, app_name=app, dry_run=False, ttl=30)["tombstones"]
    assert len(_tombstone_ids(n1, ALICE)) == MAX_USER_TOMBSTONES
    refused = _cancel_where(n1, ALICE, expect=422, app_name=app, dry_run=False, ttl=30)
    assert f"at most {MAX_USER_TOMBSTONES} live tombstones" in refused["detail"]
    unheld = _cancel_where(n1, ALICE, app_name=app, dry_run=False)  # a cancel with no hold: yes
    assert unheld["tombstones"] == []
    laid += _cancel_where(n1, app_name=app, dry_run=False, ttl=30)["tombstones"]  # ops: yes
    for tombstone in laid:
        _call(n1, "DELETE", f"/v1/tombstones/{tombstone['tombstone_id']}")
    assert _tombstone_ids(n1, ALICE) == set()


def _tombstone_ids(node: NodeProcess, token: str) -> set[str]:
    response = _call(node, "GET", "/v1/tombstones", token=token)
    assert response.status_code == 200, response.text
    return {tombstone["tombstone_id"] for tombstone in response.json()["tombstones"]}


def test_a_selector_spans_the_namespaces_the_node_serves(cluster: Cluster) -> None:
    n1 = cluster.nodes[0]
    user = _user()
    runs = [_started(n1, user=user, app=app) for app in ("app", OTHER_APP)]
    done = _cancel_where(n1, user_id=user, dry_run=False, ttl=5)
    assert sorted(done["run_ids"]) == sorted(run["run_id"] for run in runs)
    assert [result["outcome"] for result in done["results"]] == ["cancelled", "cancelled"]
    assert len(done["tombstones"]) == 2  # one in each namespace
    for app in ("app", OTHER_APP):
        assert _start(n1, user=user, app=app).status_code == 409
    only_one = _cancel_where(n1, user_id=user, app_name=OTHER_APP, dry_run=False, ttl=5)
    assert len(only_one["tombstones"]) == 1  # an app's selector: the app's namespace
    for tombstone in (*done["tombstones"], *only_one["tombstones"]):
        _call(n1, "DELETE", f"/v1/tombstones/{tombstone['tombstone_id']}")


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({}, "a selector needs at least one of"),
        ({"dry_run": False, "mode": "immediate"}, "a selector needs at least one of"),
        ({"user_id": "u", "ttl": 5, "until": 2e9}, "give ttl or until, not both"),
        ({"user_id": "u", "min_age": 5, "started_before": 2e9}, "not both"),
        ({"user_id": "u", "ttl": 0}, "body.ttl"),
        ({"user_id": "u", "ttl": 8 * 86400}, "body.ttl"),
        ({"user_id": "u", "until": 1000, "dry_run": False}, "a tombstone holds for"),
        ({"metadata": {}}, "body.metadata"),
        ({"metadata": {"k": {"nested": 1}}}, "body.metadata"),
        ({"user_id": "a b"}, "body.user_id"),
        ({"user_id": "u", "mode": "soon"}, "body.mode"),
        ({"user_id": "u", "timeout": 0}, "body.timeout"),
        ({"user_id": "u", "status": "active"}, "body.status"),
    ],
)
def test_a_bad_selector_is_a_422_that_says_why(
    cluster: Cluster, body: dict[str, Any], says: str
) -> None:
    answer = _cancel_where(cluster.nodes[0], expect=422, **body)
    assert says in answer["detail"], answer


def test_bad_tombstone_ids_and_parents_are_4xx(cluster: Cluster) -> None:
    n1 = cluster.nodes[0]
    assert _call(n1, "DELETE", "/v1/tombstones/a%20b").status_code == 422
    assert _call(n1, "DELETE", "/v1/tombstones/feedface").status_code == 404
    assert _call(n1, "GET", "/v1/tombstones", token="nope-" + uuid.uuid4().hex).status_code == 401


def test_nodes_show_their_last_probe(cluster: Cluster) -> None:
    deadline = time.monotonic() + 10
    while True:
        nodes = _call(cluster.nodes[0], "GET", "/v1/nodes").json()["nodes"]
        if all(node["probe_at"] is not None for node in nodes):
            break
        assert time.monotonic() < deadline, nodes
        time.sleep(0.05)
    for node in nodes:
        assert 0 <= node["probe_latency_ms"] < 1000
        assert node["probe_at"] <= node["last_heartbeat"] + 1


def test_a_node_whose_subscription_dies_turns_unready_and_says_why(
    redis_server: EmbeddedServer, tmp_path: Path
) -> None:
    """The node's ACL user loses its channel: Redis drops the subscription and refuses it
    again, as a misconfigured ACL or proxy would; everything else still answers."""
    admin = redis.Redis(port=redis_server.port)
    user, password = f"ready-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    cluster = Cluster(f"redis://{user}:{password}@127.0.0.1:{redis_server.port}/0", 1, tmp_path)
    keys = KeySpace(cluster.namespace)
    admin.execute_command("ACL", "SETUSER", user, "on", f">{password}", *keys.acl_rules().split())
    cluster.start()
    node = cluster.nodes[0]
    try:
        assert _call(node, "GET", "/readyz").status_code == 200
        admin.execute_command(
            "ACL", "SETUSER", user, "resetchannels", f"&{keys.channel('somebody-else')}"
        )
        answer = _poll_readyz(node, 503)
        problem = f"namespace {cluster.namespace}: the subscriber is not connected"
        assert answer["ready"] is False and problem in answer["problems"], answer
        admin.execute_command("ACL", "SETUSER", user, f"&{keys.prefix}*")
        assert _poll_readyz(node, 200)["problems"] == []  # restored: ready again
    finally:
        cluster.stop()
        admin.execute_command("ACL", "DELUSER", user)
        admin.close()


def _poll_readyz(node: NodeProcess, status: int, timeout: float = 10) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        response = _call(node, "GET", "/readyz")
        if response.status_code == status:
            answer: dict[str, Any] = response.json()
            return answer
        assert time.monotonic() < deadline, response.text
        time.sleep(0.05)
