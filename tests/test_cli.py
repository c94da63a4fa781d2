"""The `cancel-bus` command against real node processes: full ids and unique prefixes, human
times (ISO with --json), one-line errors with the server's message, --help with descriptions and
choices, distinct documented exit codes, a live view, and the README's commands."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from node.cli import Exit, build_parser
from node.embedded import EmbeddedServer

from .node_cluster import Cluster

README = Path(__file__).parent.parent / "README.md"
ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
EPOCH = re.compile(r"\b1\d{9}\.\d+")  # a raw timestamp


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


def _start(cluster: Cluster, session: str, run_id: str | None = None) -> dict[str, Any]:
    body = {
        "app_name": "app",
        "user_id": "cli",
        "session_id": session,
        "run_id": run_id,
        "agent": {"tokens": 100_000, "token_interval_ms": 5},
    }
    with cluster.nodes[0].client() as client:
        response = client.post("/v1/runs", json=body)
    assert response.status_code == 201, response.text
    run: dict[str, Any] = response.json()
    return run


def _one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    return result.stderr


def test_runs_run_nodes_and_cancel_through_another_node(cluster: Cluster) -> None:
    n1, n2 = cluster.nodes
    run = _start(cluster, uuid.uuid4().hex)
    listed = cli("runs", "--url", n2.url, "--json")
    assert listed.returncode == 0, listed.stderr
    runs = {r["run_id"]: r for r in json.loads(listed.stdout)}
    assert ISO.match(runs[run["run_id"]]["created_at"])  # ISO 8601 times for scripts
    table = cli("runs", "--url", n2.url, "--node", "node-1", COLUMNS="80")  # a narrow terminal
    assert table.returncode == 0 and run["run_id"] in table.stdout  # the whole id, never cut
    assert re.search(r"\d+(\.\d)? (ms|s) ago", table.stdout) and not EPOCH.search(table.stdout)

    details = cli("run", run["run_id"], "--url", n2.url, "--json")
    answer = json.loads(details.stdout)
    assert answer["events"][0]["type"] == "run.started" and ISO.match(answer["events"][0]["at"])
    shown = cli("run", run["run_id"], "--url", n2.url).stdout
    assert "run.started" in shown and " ago)" in shown and 'owner="node-1"' in shown
    assert not EPOCH.search(shown) and "{'" not in shown  # no raw times, no Python reprs

    nodes = cli("nodes", "--url", n1.url)
    assert nodes.returncode == 0 and "node-1" in nodes.stdout and "alive" in nodes.stdout
    listed_nodes = json.loads(cli("nodes", "--url", n1.url, "--json").stdout)
    assert {n["node_id"] for n in listed_nodes} == {"node-1", "node-2"}
    assert all(ISO.match(n["last_heartbeat"]) for n in listed_nodes)

    cancelled = cli("cancel", run["run_id"], "--url", n2.url, "--reason", "cli")
    assert cancelled.returncode == Exit.OK, cancelled.stderr
    assert cancelled.stdout.startswith(f"cancelled: run {run['run_id']} stopped ")
    assert "after the request" in cancelled.stdout
    again = cli("cancel", run["run_id"], "--url", n2.url, "--json")
    assert again.returncode == Exit.FINISHED
    assert json.loads(again.stdout)["outcome"] == "already_finished"


def test_run_and_cancel_take_a_unique_prefix(cluster: Cluster) -> None:
    url = cluster.nodes[1].url
    stem = f"cli-{uuid.uuid4().hex[:10]}"
    first = _start(cluster, uuid.uuid4().hex, run_id=f"{stem}-a1")
    second = _start(cluster, uuid.uuid4().hex, run_id=f"{stem}-b2")

    shown = cli("run", f"{stem}-a", "--url", url, "--json")
    assert shown.returncode == 0 and json.loads(shown.stdout)["run"]["run_id"] == first["run_id"]
    ambiguous = cli("run", stem, "--url", url)
    assert ambiguous.returncode == Exit.AMBIGUOUS
    said = _one_line(ambiguous)
    assert first["run_id"] in said and second["run_id"] in said

    cancelled = cli("cancel", f"{stem}-b", "--url", url)
    assert cancelled.returncode == Exit.OK, cancelled.stderr
    assert cancelled.stdout.startswith(f"cancelled: run {second['run_id']}")
    assert cli("cancel", stem, "--url", url).returncode == Exit.AMBIGUOUS  # never a guess
    with cluster.nodes[0].client() as client:
        assert client.get(f"/v1/runs/{first['run_id']}").json()["status"] == "running"
        client.post(f"/v1/runs/{first['run_id']}/cancel")


def test_cancel_a_session_without_waiting(cluster: Cluster) -> None:
    session = uuid.uuid4().hex
    run = _start(cluster, session)
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
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"stopping: run {run['run_id']}: the cancel is recorded")


def test_not_found_names_what_was_not_found(cluster: Cluster) -> None:
    url = cluster.nodes[0].url
    missing = cli("cancel", "deadbeef", "--url", url)
    assert missing.returncode == Exit.NOT_FOUND
    assert missing.stdout.startswith("not_found") and "deadbeef" in missing.stdout
    unknown = cli("run", "deadbeef", "--url", url)
    assert unknown.returncode == Exit.NOT_FOUND and "no run deadbeef" in _one_line(unknown)
    session = cli("cancel", "--session", "app", "nobody", "s0", "--url", url)
    assert session.returncode == Exit.NOT_FOUND and "app/nobody/s0" in session.stdout


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (["runs", "--url", "foo"], Exit.USAGE, "'foo' is not an http(s) URL"),
        (["runs", "--status", "bogus"], Exit.USAGE, "invalid choice: 'bogus' (choose from"),
        (["cancel", "x", "--mode", "soon"], Exit.USAGE, "invalid choice: 'soon'"),
        (["runs", "--older-than", "soon"], Exit.USAGE, "'soon' is not a duration"),
        (["runs", "--watch", "-1"], Exit.USAGE, "'-1' is not a positive float"),
        (["runs", "--url", "http://127.0.0.1:1"], Exit.ERROR, "cannot reach http://127.0.0.1:1"),
        (["runs", "--limit", "5000"], Exit.ERROR, "answered HTTP 422: query.limit: "),
        (["run", "a b"], Exit.ERROR, "answered HTTP 422: path.run_id: "),
        (["cancel", "x", "--timeout", "0"], Exit.ERROR, "HTTP 422: body.timeout: "),
        (["demo", "--nodes", "1"], Exit.USAGE, "at least 2 nodes"),
    ],
)
def test_errors_are_one_line_with_a_distinct_exit_code(
    cluster: Cluster, args: list[str], code: Exit, says: str
) -> None:
    url = [] if "--url" in args or args[0] == "demo" else ["--url", cluster.nodes[0].url]
    result = cli(*args, *url, COLUMNS="60")  # a narrow terminal: still one line
    assert result.returncode == code, result
    assert says in _one_line(result)


def test_help_describes_every_option_and_its_choices() -> None:
    top = cli("--help").stdout
    for command in ("serve", "demo", "runs", "run", "cancel", "nodes", "acl-rules"):
        assert re.search(rf"^    {command}\s+\S", top, re.M), command  # each with its help
    runs = cli("runs", "--help").stdout
    assert "{active,finished,all,queued,running,waiting,succeeded,failed,cancelled}" in runs
    cancel = cli("cancel", "--help").stdout
    assert "{after_turn,checkpoint,immediate}" in cancel
    parser = build_parser()
    subparsers = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for name, sub in subparsers.items():
        for action in sub._actions:
            assert action.help, f"cancel-bus {name} {action.option_strings or action.dest}"
    for code in Exit:
        assert re.search(rf"^  {code.value}  \S", top, re.M), code  # documented in --help


def test_exit_codes_are_documented_in_the_readme() -> None:
    readme = README.read_text()
    paragraph = re.search(r"^Exit codes of `cancel-bus`: (.*?)\n\n", readme, re.M | re.S)
    assert paragraph, "the README lost its exit codes"
    documented = {int(code) for code in re.findall(r"(?<![\w.,])(\d) ", paragraph.group(1))}
    assert documented == {code.value for code in Exit}


def test_the_readme_commands_parse_and_the_command_is_where_it_says() -> None:
    readme = README.read_text()
    commands = re.findall(r"^\$ (?:\.venv/bin/)?cancel-bus (.*?)(?:\s+#.*)?$", readme, re.M)
    assert len(commands) >= 8, commands
    parser = build_parser()
    for command in commands:
        parser.parse_args(shlex.split(command))  # exits (code 2) on what it does not know
    assert ".venv/bin/cancel-bus" in readme  # where ./scripts/serve installs it
    installed = Path(sys.executable).parent / "cancel-bus"
    version = subprocess.run([installed, "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.startswith("cancel-bus ")


def test_runs_watch_shows_the_list_again_until_stopped(cluster: Cluster) -> None:
    run = _start(cluster, uuid.uuid4().hex)
    try:
        result = cli("runs", "--watch", "0.1", "--count", "3", "--url", cluster.nodes[1].url)
        assert result.returncode == 0, result.stderr
        assert run["run_id"] in result.stdout and "Ctrl-C to stop" in result.stdout
        both = cli("runs", "--watch", "--json", "--url", cluster.nodes[1].url)
        assert both.returncode == Exit.USAGE and "--watch" in _one_line(both)
    finally:
        with cluster.nodes[0].client() as client:
            client.post(f"/v1/runs/{run['run_id']}/cancel")


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
    assert result.returncode == 1
    assert says in _one_line(result)
    assert result.stderr.startswith("cancel-bus: bad configuration: ")
    assert "a-token-of-16-chars" not in result.stderr
