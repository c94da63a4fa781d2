"""One deployment serving several namespaces (one per app or tenant): runs go to their app's
namespace, and every route finds them from any node."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import redis

from node.embedded import EmbeddedServer

from ..node_cluster import Cluster


def test_apps_live_in_their_own_namespaces(redis_server: EmbeddedServer, tmp_path: Path) -> None:
    billing = f"ns-billing-{uuid.uuid4().hex[:6]}"
    cluster = Cluster(
        redis_server.url, 2, tmp_path, app_namespaces=json.dumps({"billing": billing})
    ).start()
    try:
        n1, n2 = cluster.nodes
        agent = {"tokens": 100_000, "token_interval_ms": 5}
        runs = {}
        with n1.client() as client:
            for app in ("billing", "chat"):
                body = {"app_name": app, "user_id": "u", "session_id": "s", "agent": agent}
                response = client.post("/v1/runs", json=body)
                assert response.status_code == 201
                runs[app] = response.json()["run_id"]
            # a run id is unique across the namespaces: chat cannot reuse billing's
            reused = {"app_name": "chat", "user_id": "u", "session_id": "s2", "agent": agent}
            taken = client.post("/v1/runs", json={**reused, "run_id": runs["billing"]})
            assert taken.status_code == 409 and runs["billing"] not in taken.text
        server = redis.Redis(port=redis_server.port)
        assert server.exists(f"cb:{{{billing}}}:run:{runs['billing']}")
        assert server.exists(f"cb:{{{cluster.namespace}}}:run:{runs['chat']}")
        assert not server.exists(f"cb:{{{cluster.namespace}}}:run:{runs['billing']}")

        with n2.client() as client:
            listed = {r["run_id"] for r in client.get("/v1/runs").json()["runs"]}
            assert listed == set(runs.values())
            only = client.get("/v1/runs?app_name=billing").json()["runs"]
            assert [r["run_id"] for r in only] == [runs["billing"]]
            assert client.get(f"/v1/runs/{runs['billing']}/events").json()["events"]
            by_id = client.post(f"/v1/runs/{runs['billing']}/cancel", json={"timeout": 10})
            by_session = client.post("/v1/sessions/chat/u/s/cancel", json={"timeout": 10})
            assert by_id.json()["outcome"] == by_session.json()["outcome"] == "cancelled"
            metrics = client.get("/metrics").text
        assert f'cancel_bus_ready{{bus_namespace="{billing}"}} 1.0' in metrics
        assert f'cancel_bus_ready{{bus_namespace="{cluster.namespace}"}} 1.0' in metrics
    finally:
        cluster.stop()
