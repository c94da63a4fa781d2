"""The `cancel-bus` command against real node processes."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from node.embedded import EmbeddedServer

from .node_cluster import Cluster


@pytest.fixture(scope="module")
def cluster(
    redis_server: EmbeddedServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    running = Cluster(redis_server.url, 2, tmp_path_factory.mktemp("cli")).start()
    yield running
    running.stop()


def cli(*args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "node.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", **env},
    )


def _start(cluster: Cluster, session: str) -> dict[str, Any]:
    body = {
        "app_name": "app",
        "user_id": "cli",
        "session_id": session,
        "agent": {"tokens": 100_000, "token_interval_ms": 5},
    }
    with cluster.nodes[0].client() as client:
        run: dict[str, Any] = client.post("/v1/runs", json=body).json()
    return run


def test_runs_run_nodes_and_cancel_through_another_node(cluster: Cluster) -> None:
    n1, n2 = cluster.nodes
    run = _start(cluster, uuid.uuid4().hex)
    listed = cli("runs", "--url", n2.url, "--json")
    assert listed.returncode == 0, listed.stderr
    assert run["run_id"] in {r["run_id"] for r in json.loads(listed.stdout)}
    table = cli("runs", "--url", n2.url, "--node", "node-1")
    assert table.returncode == 0 and run["run_id"][:12] in table.stdout

    details = cli("run", run["run_id"], "--url", n2.url, "--json")
    assert json.loads(details.stdout)["events"][0]["type"] == "run.started"
    assert "run.started" in cli("run", run["run_id"], "--url", n2.url).stdout

    nodes = json.loads(cli("nodes", "--url", n1.url, "--json").stdout)
    assert {n["node_id"] for n in nodes} == {"node-1", "node-2"}

    cancelled = cli("cancel", run["run_id"], "--url", n2.url, "--reason", "cli")
    assert cancelled.returncode == 0 and cancelled.stdout.startswith("cancelled")
    again = cli("cancel", run["run_id"], "--url", n2.url, "--json")
    assert again.returncode == 3 and json.loads(again.stdout)["outcome"] == "already_finished"


def test_cancel_a_session_without_waiting(cluster: Cluster) -> None:
    session = uuid.uuid4().hex
    _start(cluster, session)
    result = cli(
        "cancel",
        "--session",
        "app",
        "cli",
        session,
        "--no-wait",
        "--mode",
        "immediate",
        "--url",
        cluster.nodes[1].url,
    )
    assert result.returncode == 0 and result.stdout.startswith("stopping"), result.stdout


def test_errors_are_one_line_and_a_non_zero_exit(cluster: Cluster) -> None:
    missing = cli("cancel", "no-such-run", "--url", cluster.nodes[0].url)
    assert missing.returncode == 2 and missing.stdout.startswith("not_found")
    unreachable = cli("runs", "--url", "http://127.0.0.1:1")
    assert unreachable.returncode == 1
    assert unreachable.stderr.count("\n") == 1 and "cannot reach" in unreachable.stderr
    bad = cli("runs", "--status", "nope", "--url", cluster.nodes[0].url)
    assert bad.returncode == 1 and "HTTP 422" in bad.stderr and "Traceback" not in bad.stderr
    unknown = cli("run", "nope", "--url", cluster.nodes[0].url)
    assert unknown.returncode == 1 and "not found" in unknown.stderr


def test_demo_shows_a_cross_node_cancel() -> None:
    result = cli("demo", "--nodes", "2", "--exit", timeout=120)
    assert result.returncode == 0, result.stderr
    assert "HTTP 200 cancelled" in result.stdout
    assert "delivered" in result.stdout and "dashboards:" in result.stdout


def test_acl_rules_of_several_namespaces() -> None:
    result = cli("acl-rules", "tenant-a", "tenant-b")
    assert result.returncode == 0
    rules = result.stdout.split()
    assert rules.count("resetkeys") == 1 and rules.count("resetchannels") == 1
    assert "~cb:{tenant-a}:*" in rules and "&cb:{tenant-b}:*" in rules
    assert rules.index("~cb:{tenant-b}:*") < rules.index("resetchannels")
    bad = cli("acl-rules", "a b")
    assert bad.returncode == 1 and "invalid namespace" in bad.stderr


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"CANCEL_BUS_LEASE_TTL": "0"}, "CANCEL_BUS_LEASE_TTL: Input should be greater than"),
        ({"CANCEL_BUS_API_TOKENS_FILE": "/nonexistent/tokens.json"}, "/nonexistent/tokens.json"),
        ({"CANCEL_BUS_API_TOKENS": '{"a-token-of-16-chars": {"role": "user"}}'}, "user_id"),
    ],
)
def test_serve_reports_a_bad_configuration_in_one_line(env: dict[str, str], says: str) -> None:
    result = cli("serve", "--port", "1", COLUMNS="60", **env)  # a narrow terminal: no wrapping
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and says in result.stderr, result.stderr
    assert result.stderr.startswith("cancel-bus: bad configuration: ")
    assert "a-token-of-16-chars" not in result.stderr
