"""The `cancel-bus` command against real node processes: full ids and unique prefixes, human
times (ISO with --json), one-line errors with the server's message, --help with descriptions and
choices, distinct documented exit codes, a live view, a run followed live, and the README's
commands."""

from __future__ import annotations

import json
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar
from unittest import mock

import click
import pytest
from pydantic import BaseModel, ValidationError, create_model

from cancel_bus import RunInfo, RunStatus, acl_rules
from node.cli import HTTP_TIMEOUT, Exit, main
from node.cli import cli as group
from node.cli.client import KEEPALIVE, server_sent
from node.embedded import EmbeddedServer
from node.queries import RunQuery
from node.schemas import CancelBody, NodeList, NodeView, SelectorCancel
from node.settings import Settings
from node.sse import KEEPALIVE_SECONDS

from ..node_cluster import COMMAND, Cluster

README = Path(__file__).parents[2] / "README.md"
DEPLOY = Path(__file__).parents[2] / "docs" / "deploy.md"
ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
EPOCH = re.compile(r"\b1\d{9}\.\d+")  # a raw timestamp


@pytest.fixture(scope="module")
def cluster(
    redis_server: EmbeddedServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    running = Cluster(
        redis_server.url, 2, tmp_path_factory.mktemp("cli"), profile_checkpoints="true"
    ).start()
    yield running
    running.stop()


def cli(
    *args: str, timeout: float = 60, answer: str | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    """The installed command in a process of its own; ``answer``: what it reads on stdin."""
    return subprocess.run(
        [COMMAND, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        input=answer,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", **env},
    )


def _start(
    cluster: Cluster, session: str, run_id: str | None = None, **extra: Any
) -> dict[str, Any]:
    body = {
        "app_name": "app",
        "user_id": "cli",
        "session_id": session,
        "run_id": run_id,
        "agent": {"tokens": 100_000, "token_interval_ms": 5},
        **extra,
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
    assert " probe " in nodes.stdout.splitlines()[0]
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
    said = f"stopping: run {run['run_id']}: the cancel is recorded; not waited for (--no-wait)\n"
    assert result.stdout == said  # it did not wait: it says so, and no "within 5 s"


def test_cancel_where_shows_the_preview_asks_then_cancels(cluster: Cluster) -> None:
    url = ["--url", cluster.nodes[1].url]
    user = f"cw-{uuid.uuid4().hex[:8]}"
    runs = [_start(cluster, uuid.uuid4().hex, user_id=user) for _ in range(2)]
    ids = sorted(run["run_id"] for run in runs)

    preview = cli("cancel-where", "--user", user, "--dry-run", *url)
    assert preview.returncode == Exit.OK, preview.stderr
    assert preview.stdout.startswith(f"2 active run(s) match user={user}\n")
    assert all(run_id in preview.stdout for run_id in ids) and " ago" in preview.stdout
    declined = cli("cancel-where", "--user", user, *url, answer="n\n")
    assert declined.returncode == Exit.ERROR
    assert "Cancel 2 run(s) and the runs below them? [y/N] n\nnothing cancelled" in declined.stdout
    listed = json.loads(cli("cancel-where", "--user", user, "--dry-run", "--json", *url).stdout)
    assert sorted(listed["run_ids"]) == ids and listed["matched"] == 2  # untouched

    done = cli("cancel-where", "--user", user, "--ttl", "1m", "--reason", "cli", *url, answer="y")
    assert done.returncode == Exit.OK, done.stderr
    assert "in the next 60 s? [y/N] y\n2 run(s) matched: 2 cancelled\n" in done.stdout
    for run_id in ids:
        assert f"  cancelled: run {run_id} stopped " in done.stdout
    tombstone = re.search(
        r"^tombstone (\w+): runs of user=\S+ started in the next", done.stdout, re.M
    )
    assert tombstone, done.stdout
    held = cli("tombstones", *url)
    assert tombstone[1] in held.stdout and f"user={user}" in held.stdout and "cli" in held.stdout
    removed = cli("tombstones", "rm", tombstone[1], *url)
    assert removed.returncode == Exit.OK and removed.stdout.startswith("removed tombstone")
    assert cli("tombstones", "rm", tombstone[1], *url).returncode == Exit.NOT_FOUND
    assert tombstone[1] not in cli("tombstones", *url).stdout

    nothing = cli("cancel-where", "--user", user, "--dry-run", *url)
    assert nothing.returncode == Exit.NOT_FOUND and "0 active run(s) match" in nothing.stdout
    last = _start(cluster, uuid.uuid4().hex, user_id=user)
    scripted = cli("cancel-where", "--user", user, "--older-than", "0s", "--yes", "--json", *url)
    answer = json.loads(scripted.stdout)
    assert scripted.returncode == Exit.OK and answer["run_ids"] == [last["run_id"]]
    assert answer["results"][0]["outcome"] == "cancelled"


def test_a_tree_in_run_and_cancel(cluster: Cluster) -> None:
    url = ["--url", cluster.nodes[1].url]
    slow = {"tokens": 100_000, "token_interval_ms": 20}  # the profile notes stretches > 10 ms
    parent = _start(cluster, uuid.uuid4().hex, agent=slow)
    child = _start(cluster, uuid.uuid4().hex, parent=parent["run_id"])
    _profiled(cluster, parent["run_id"])
    shown = cli("run", parent["run_id"], *url).stdout
    assert re.search(rf"^child +{child['run_id']} \(running\)", shown, re.M), shown
    assert re.search(r"^no checkpoint +[\d.]+ m?s after \S+/node/agent\.py:\d+", shown, re.M)
    children = cli("runs", "--parent", parent["run_id"], "--json", *url).stdout
    assert [run["run_id"] for run in json.loads(children)] == [child["run_id"]]
    below_it = cli("run", child["run_id"], *url).stdout
    assert re.search(rf"^parent +{parent['run_id']}\b", below_it, re.M), below_it
    cancelled = cli("cancel", parent["run_id"], *url)
    assert cancelled.returncode == Exit.OK, cancelled.stderr
    first, below = cancelled.stdout.splitlines()
    assert first.startswith(f"cancelled: run {parent['run_id']} stopped ")
    assert below.startswith(f"  below it: cancelled: run {child['run_id']} stopped ")


def _profiled(cluster: Cluster, run_id: str) -> None:
    """Wait for the run's checkpoint profile to reach Redis (its owner syncs in batches)."""
    deadline = time.monotonic() + 10
    with cluster.nodes[0].client() as client:
        while not client.get(f"/v1/runs/{run_id}").json()["slowest_checkpoints"]:
            assert time.monotonic() < deadline, "no checkpoint profile recorded"
            time.sleep(0.05)


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
        (["runs", "--status", "bogus"], Exit.USAGE, "--status: 'bogus' is not one of 'active',"),
        (["cancel", "x", "--mode", "soon"], Exit.USAGE, "--mode: 'soon' is not one of"),
        (["runs", "--older-than", "soon"], Exit.USAGE, "'soon' is not a duration"),
        (["runs", "--watch", "0"], Exit.USAGE, "'0' is out of range (above 0, at most"),
        (["runs", "--watch", "-1"], Exit.USAGE, "No such option '-1'"),
        (["runs", "--url", "http://127.0.0.1:1"], Exit.ERROR, "cannot reach http://127.0.0.1:1"),
        (["runs", "--limit", "5000"], Exit.USAGE, "--limit: '5000' is out of range (1-1000)"),
        (["run", "a b"], Exit.ERROR, "answered HTTP 422: path.run_id: "),
        (["cancel", "x", "--timeout", "0"], Exit.USAGE, "'0' is out of range (0.1-60)"),
        (["cancel", "x", "--timeout", "nan"], Exit.USAGE, "--timeout: 'nan' is not a number"),
        (["cancel", "x", "--timeout", "inf"], Exit.USAGE, "--timeout: 'inf' is not a number"),
        (["cancel", "x", "--timeout", "1e400"], Exit.USAGE, "'1e400' is not a number"),
        (["cancel-where", "--app", "a", "--timeout", "nan"], Exit.USAGE, "is not a number"),
        (["runs", "--http-timeout", "nan"], Exit.USAGE, "--http-timeout: 'nan' is not a"),
        (["runs", "--http-timeout", "0"], Exit.USAGE, "--http-timeout: '0' is out of range"),
        (["runs", "--limit", "0"], Exit.USAGE, "--limit: '0' is out of range (1-1000)"),
        (["runs", "--limit", "nan"], Exit.USAGE, "--limit: 'nan' is not a whole number"),
        (["runs", "--older-than", "3651d"], Exit.USAGE, "'3651d' is out of range (0s-3650d)"),
        (["runs", "--watch", "1e308", "--count", "2"], Exit.USAGE, "'1e308' is out of range"),
        (["cancel-where", "--app", "a", "--ttl", "0"], Exit.USAGE, "(above 0s, at most 7d)"),
        (["cancel-where", "--app", "a", "--ttl", "8d"], Exit.USAGE, "'8d' is out of range"),
        (["serve", "--port", "99999"], Exit.USAGE, "--port: '99999' is out of range (0-65535)"),
        (["serve", "--port", "nan"], Exit.USAGE, "--port: 'nan' is not a whole number"),
        (["demo", "--nodes", "1"], Exit.USAGE, "at least 2 nodes"),
        (["demo", "--nodes", "two"], Exit.USAGE, "--nodes: 'two' is not a whole number"),
        (["cancel-where", "--meta", "tier"], Exit.USAGE, "'tier' is not KEY=VALUE"),
        (["cancel-where", "--meta", "n:=[1]"], Exit.USAGE, "KEY:= takes a number"),
        (["cancel-where", "--started-before", "soon"], Exit.USAGE, "'soon' is not a time"),
        (["cancel-where", "--ttl", "1m", "--until", "12:00"], Exit.USAGE, "not allowed with"),
        (["cancel-where", "--app", "a", "--json"], Exit.USAGE, "--json needs --yes or --dry-run"),
        (["cancel-where", "--dry-run"], Exit.USAGE, "give at least one of --app, --user,"),
        (["cancel-where", "--yes"], Exit.USAGE, "give at least one of --app, --user,"),
        (["cancel-where", "--app", "a b", "--yes"], Exit.USAGE, "--app: String should match"),
        (["cancel-where", "--app", "a", "--reason", "x" * 1001], Exit.USAGE, "--reason: String"),
        (["cancel", "x", "--reason", "x" * 1001], Exit.USAGE, "--reason: String should have at"),
        (["runs", "--session", "a b"], Exit.USAGE, "--session: String should match pattern"),
        (["tombstones", "rm"], Exit.USAGE, "tombstones rm needs a TOMBSTONE_ID"),
        (["tombstones", "drop"], Exit.USAGE, "'drop': tombstones takes nothing (a list), or rm"),
        (["tombstones", "rm", ""], Exit.USAGE, "an empty id"),
        (["run", ""], Exit.USAGE, "RUN_ID: an empty id"),  # not the list's 307
        (["follow", ""], Exit.USAGE, "RUN_ID: an empty id"),
        (["cancel", ""], Exit.USAGE, "RUN_ID: an empty id"),
        (["cancel", "--session", "app", "", "s"], Exit.USAGE, "--session: an empty id"),
        (["cancel"], Exit.USAGE, "give a RUN_ID or --session APP USER SESSION"),
        (["cancel", "x", "--session", "a", "u", "s"], Exit.USAGE, "give a RUN_ID or --session"),
        (["runs", "--wat"], Exit.USAGE, "No such option '--wat'"),  # never --watch: no loop
        (["runs", "--lim", "5"], Exit.USAGE, "No such option '--lim'"),
        (["cancel", "x", "--no-w"], Exit.USAGE, "No such option '--no-w'"),
        (["--url", "http://127.0.0.1:1", "serve"], Exit.USAGE, "--url is for the commands that"),
        (["--json", "acl-rules", "x"], Exit.USAGE, "--json is for the commands that ask a node"),
        (["acl-rules", "x", "--name", "a b"], Exit.USAGE, "--name: 'a b' is not a user name"),
        (["stop"], Exit.USAGE, "No such command 'stop'"),
        ([], Exit.USAGE, "Missing command"),
    ],
)
def test_errors_are_one_line_with_a_distinct_exit_code(
    cluster: Cluster, args: list[str], code: Exit, says: str
) -> None:
    local = "--url" in args or not args or args[0] in ("demo", "serve", "acl-rules", "stop")
    url = [] if local else ["--url", cluster.nodes[0].url]
    result = cli(*args, *url, COLUMNS="60")  # a narrow terminal: still one line
    assert result.returncode == code, result
    assert says in _one_line(result)


def test_help_describes_every_option_and_its_choices(capsys: pytest.CaptureFixture[str]) -> None:
    def shown(*args: str) -> str:
        assert main([*args, "--help"]) == Exit.OK
        return capsys.readouterr().out

    top = cli("--help").stdout  # as installed
    commands = ("serve", "demo", "runs", "run", "follow", "cancel", "cancel-where", "tombstones")
    for command in (*commands, "nodes", "acl-rules"):
        assert re.search(rf"^  {command}\s+\S", top, re.M), command  # each with its help
    runs = shown("runs")
    assert "[active|finished|all|queued|running|waiting|succeeded|failed|cancelled]" in runs
    assert "[after_turn|checkpoint|immediate]" in shown("cancel")
    for name, command in group.commands.items():
        text = " ".join(shown(name).split())
        for param in command.params:
            if isinstance(param, click.Option):
                assert param.help, f"cancel-bus {name} {param.opts}"
            else:  # an argument: named in the usage line and the description
                metavar = (param.metavar or "").strip("[]. ").split()[0]
                assert text.count(metavar) >= 2, f"cancel-bus {name} {metavar}"
    for code in Exit:
        assert re.search(rf"^    {code.value} +\S", top, re.M), code  # documented in --help


def test_exit_codes_are_documented_in_the_readme() -> None:
    readme = README.read_text()
    paragraph = re.search(r"^Exit codes of `cancel-bus`: (.*?)\n\n", readme, re.M | re.S)
    assert paragraph, "the README lost its exit codes"
    documented = {int(code) for code in re.findall(r"(?<![\w.,])(\d+)\s", paragraph.group(1))}
    assert documented == {code.value for code in Exit}


def test_the_readme_commands_parse_and_the_command_is_where_it_says() -> None:
    readme = README.read_text()
    commands = re.findall(r"^\$ (?:\.venv/bin/)?cancel-bus (.*?)(?:\s+#.*)?$", readme, re.M)
    assert len(commands) >= 8, commands
    for command in commands:
        assert parses(*shlex.split(command)) == Exit.OK, command
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


DAY = 86400


@pytest.mark.parametrize(
    ("command", "option", "model", "field", "values"),
    [
        (["cancel", "x"], "--timeout", CancelBody, "timeout", [0, 0.09, 0.1, 60, 60.1]),
        (["cancel-where", "--app", "a"], "--timeout", SelectorCancel, "timeout", [0.1, 61]),
        (["cancel-where", "--app", "a"], "--ttl", SelectorCancel, "ttl", [0, 1, 7 * DAY, 8 * DAY]),
        (["runs"], "--limit", RunQuery, "limit", [0, 1, 1000, 1001]),
        (["runs"], "--older-than", RunQuery, "min_age", [0, 3650 * DAY, 3651 * DAY]),
        (["runs"], "--newer-than", RunQuery, "max_age", [0, 3650 * DAY, 3651 * DAY]),
        (["serve"], "--port", Settings, "port", [-1, 0, 65535, 65536]),
    ],
)
def test_number_options_refuse_exactly_what_the_node_refuses(
    command: list[str], option: str, model: type[BaseModel], field: str, values: list[float]
) -> None:
    """Each bound is the node's own (its model's field), on both sides of it."""
    info = model.model_fields[field]
    annotation: Any = info.annotation
    node_side = create_model("NodeSide", value=(annotation, info))
    for value in values:
        code = parses(*command, option, str(value))
        assert code in (Exit.OK, Exit.USAGE)
        cli_takes = code == Exit.OK
        try:
            node_side.model_validate({"value": value})
        except ValidationError:
            node_takes = False
        else:
            node_takes = True
        assert cli_takes == node_takes, f"{option} {value}: the CLI and the node disagree"


class Stranger(BaseHTTPRequestHandler):
    """A web server that is no cancel-bus node: pages, JSON of its own, 404 pages."""

    ANSWERS: ClassVar[dict[str, tuple[int, str, bytes]]] = {
        "/v1/runs": (200, "application/json", b'{"status": "ok", "items": []}'),
        "/v1/nodes": (200, "text/html", b"<html><body>Welcome to nginx!</body></html>"),
        "/v1/tombstones": (200, "application/json", b"[]"),
        "/v1/cancel-where": (404, "application/json", b'{"error": "no such route"}'),
    }

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        missing = (404, "text/html", b"<html><h1>404 Not Found</h1></html>")
        status, kind, body = self.ANSWERS.get(self.path.partition("?")[0], missing)
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_DELETE = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """The URL of a plain HTTP server on a free loopback port, in a thread of this process."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)
    assert not thread.is_alive()


@pytest.fixture(scope="module")
def stranger() -> Iterator[str]:
    yield from serving(Stranger)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["runs"], "HTTP 200 to GET /v1/runs: runs: Field required"),
        (["runs", "--watch", "0.1", "--count", "2"], "HTTP 200 to GET /v1/runs: runs: Field"),
        (["nodes"], "HTTP 200 to GET /v1/nodes: text/html, not JSON: '<html><body>Welcome"),
        (["tombstones"], "HTTP 200 to GET /v1/tombstones: body: Input should be a valid dict"),
        (["tombstones", "rm", "t1"], "HTTP 404 to DELETE /v1/tombstones/t1: text/html, not JSON"),
        (["run", "abc"], "HTTP 404 to GET /v1/runs/abc: text/html, not JSON"),
        (["cancel", "abc"], "HTTP 404 to POST /v1/runs/abc/cancel: text/html"),
        (["cancel", "--session", "a", "u", "s"], "HTTP 404 to POST /v1/sessions/a/u/s/cancel"),
        (["cancel-where", "--app", "a", "--yes"], "HTTP 404 to POST /v1/cancel-where: detail:"),
    ],
)
def test_a_server_that_is_no_node_is_named_in_one_line(
    stranger: str, args: list[str], says: str
) -> None:
    result = cli(*args, "--url", stranger, COLUMNS="60")
    assert result.returncode == Exit.ERROR, result
    said = _one_line(result)
    assert said.startswith(f"cancel-bus: {stranger} did not answer as a cancel-bus node ("), said
    assert says in said


@pytest.fixture
def silent() -> Iterator[str]:
    """The URL of a socket that takes connections (the kernel's backlog holds them) and never
    answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


def test_a_node_that_never_answers_is_given_up_on_after_the_http_timeout(silent: str) -> None:
    listed = cli("runs", "--url", silent, "--http-timeout", "0.3")
    assert listed.returncode == Exit.ERROR
    assert _one_line(listed) == f"cancel-bus: {silent} did not answer within 0.3 s\n"
    recorded = cli("cancel", "x", "--no-wait", "--url", silent, "--http-timeout", "0.3")
    assert _one_line(recorded) == f"cancel-bus: {silent} did not answer within 0.3 s\n"
    started = time.monotonic()
    waited = cli("cancel", "x", "--timeout", "0.5", "--url", silent, "--http-timeout", "0.3")
    assert time.monotonic() - started >= 0.8  # the node gets the cancel's own wait on top
    assert waited.returncode == Exit.ERROR
    assert _one_line(waited) == f"cancel-bus: {silent} did not answer within 0.8 s\n"


def test_the_http_timeout_is_short_and_documented() -> None:
    for command in group.commands.values():
        for param in command.params:
            if param.name == "http_timeout":
                assert param.default == HTTP_TIMEOUT <= 10
    shown = " ".join(cli("runs", "--help").stdout.split())
    assert re.search(rf"--http-timeout SECONDS how long .*default {HTTP_TIMEOUT:g}\)", shown)


def parses(*argv: str) -> int:
    """The exit code of this command line with every command's action replaced by nothing: 0
    when it parses, 2 (a bad command line) when it does not."""
    with ExitStack() as stack:
        for command in group.commands.values():
            stack.enter_context(mock.patch.object(command, "callback", lambda **_: Exit.OK))
        return main(argv)


Answer = tuple[int, str, bytes]


class FakeNode(BaseHTTPRequestHandler):
    """A server that answers as a node would, from a script: the answers to each path in turn
    (the last one again and again). It keeps each request's Authorization header."""

    script: ClassVar[dict[str, list[Answer]]]
    authorizations: ClassVar[list[str | None]]

    def do_GET(self) -> None:
        self.authorizations.append(self.headers.get("Authorization"))
        missing: Answer = (404, "application/json", b'{"detail": "not found"}')
        answers = self.script.get(self.path.partition("?")[0], [missing])
        status, kind, body = answers.pop(0) if len(answers) > 1 else answers[0]
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def fake_node() -> Iterator[tuple[str, type[FakeNode]]]:
    handler = type("Scripted", (FakeNode,), {"script": {}, "authorizations": []})
    for url in serving(handler):
        yield url, handler


def as_answer(model: BaseModel) -> Answer:
    return 200, "application/json", model.model_dump_json().encode()


def a_run(run_id: str, status: str = "running", **fields: Any) -> RunInfo:
    now = time.time()
    return RunInfo(
        run_id=run_id,
        status=RunStatus(status),
        owner="pod-a",
        app_name="app",
        user_id="u",
        session_id="s",
        created_at=now - 2,
        started_at=now - 2,
        finished_at=None if status == "running" else now,
        **fields,
    )


def a_stream(*events: tuple[str, Any]) -> Answer:
    """Server-sent events as a node sends them (a keep-alive comment first, relay ids)."""
    text = ": keepalive\n\n" + "".join(
        f"event: {name}\nid: 17000-{i}\ndata: {json.dumps(data)}\n\n"
        for i, (name, data) in enumerate(events)
    )
    return 200, "text/event-stream; charset=utf-8", text.encode()


def test_nodes_shows_node_ids_whole_on_a_narrow_terminal(
    fake_node: tuple[str, type[FakeNode]],
) -> None:
    url, node = fake_node
    now = time.time()
    pod = "cancel-bus-7d9f8c6b5-x2k4q.eu-west-1.compute.internal-4242-c0ffee"  # a pod's name
    view = NodeView(
        node_id=pod,
        epoch="e1",
        started_at=now - 60,
        last_heartbeat=now - 1,
        lease_expires_at=now + 9,
        active_runs=3,
        version="0.1.0",
        probe_at=now - 2,
        probe_latency_ms=1.5,
        state="alive",
        heartbeat_age=1,
        lease_left=9,
    )
    node.script["/v1/nodes"] = [as_answer(NodeList(nodes=[view], at=now))]
    for columns in ("200", "80", "40"):
        shown = cli("nodes", "--url", url, COLUMNS=columns)
        assert shown.returncode == 0, shown.stderr
        assert pod in shown.stdout and "…" not in shown.stdout, (columns, shown.stdout)
        assert "1.50 ms, 2.0 s ago" in shown.stdout
    narrow = cli("nodes", "--url", url, COLUMNS="80").stdout.splitlines()
    assert narrow[0] == f"{pod}  alive"
    assert narrow[1].startswith("  heartbeat 1.0 s ago · lease left 9.0 s · probe 1.50 ms")


def test_client_options_come_before_or_after_the_command(
    cluster: Cluster, fake_node: tuple[str, type[FakeNode]], silent: str
) -> None:
    n2 = cluster.nodes[1].url
    before = cli("--url", n2, "--json", "runs", "--status", "all", "--limit", "1")
    assert before.returncode == 0, before.stderr
    assert isinstance(json.loads(before.stdout), list)
    after_wins = cli("--url", "http://127.0.0.1:1", "runs", "--url", n2)
    assert after_wins.returncode == 0, after_wins.stderr
    assert cli("runs", CANCEL_BUS_URL=n2).returncode == 0
    assert cli("--url", n2, "runs", CANCEL_BUS_URL="http://127.0.0.1:1").returncode == 0

    url, node = fake_node
    node.script["/v1/nodes"] = [as_answer(NodeList(nodes=[], at=time.time()))]
    for args, env, sent in [
        (["--token", "token-before", "nodes", "--url", url], {}, "token-before"),
        (["--token", "token-before", "nodes", "--token", "after", "--url", url], {}, "after"),
        (["nodes", "--url", url], {"CANCEL_BUS_TOKEN": "from-env"}, "from-env"),
        (
            ["--token", "token-before", "nodes", "--url", url],
            {"CANCEL_BUS_TOKEN": "e"},
            "token-before",
        ),
    ]:
        result = cli(*args, **env)
        assert result.returncode == 0, result.stderr
        assert node.authorizations[-1] == f"Bearer {sent}", args
    timed = cli("--http-timeout", "0.3", "runs", "--url", silent)
    assert _one_line(timed) == f"cancel-bus: {silent} did not answer within 0.3 s\n"


def test_acl_rules_print_the_lines_the_docs_show() -> None:
    lines = re.findall(r"^ACL SETUSER .*$", DEPLOY.read_text(), re.M)
    assert len(lines) >= 2
    for line in lines:
        namespaces = re.findall(r"(?<= )~cb:\{([^}]+)\}:\*(?= )", line)
        printed = cli("acl-rules", *namespaces)
        assert printed.returncode == 0 and printed.stdout == f"{line}\n", printed
    named = cli("acl-rules", "tenant-a", "--name", "agents").stdout
    assert named == f"ACL SETUSER agents on >PASSWORD {acl_rules('tenant-a')}\n"


def _follow(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [COMMAND, "follow", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )


def test_follow_shows_a_run_live_until_it_succeeds(cluster: Cluster) -> None:
    url = cluster.nodes[1].url
    agent = {
        "tokens": 100,
        "token_interval_ms": 25,
        "tools": [{"name": "search", "duration_ms": 50}],
    }
    shown, scripted = (_start(cluster, uuid.uuid4().hex, agent=agent) for _ in range(2))
    text = _follow(shown["run_id"][:12], "--url", url)  # a prefix, as elsewhere
    lines = _follow(scripted["run_id"], "--url", url, "--json")
    out, err = text.communicate(timeout=60)
    assert text.returncode == Exit.OK, err
    first, *middle, last = out.splitlines()
    assert first == (
        f"run {shown['run_id']}: running on node-1 (app / cli / {shown['session_id']}); its "
        "output from now on (Ctrl-C stops following, not the run):"
    )
    assert "the agent thinks about your question" in " ".join(middle)
    assert '[tool_call] name="search" turn=0' in middle
    assert re.match(rf"succeeded: run {shown['run_id']} ended after [\d.]+ s$", last), last

    out, err = lines.communicate(timeout=60)
    assert lines.returncode == Exit.OK, err
    events = [json.loads(line) for line in out.splitlines()]
    names = [event["event"] for event in events]
    assert names[0] == "run" and names[-2:] == ["run.finished", "run"], names
    assert {"output", "tool_call", "tool_result"} <= set(names)
    assert ISO.match(events[0]["data"]["created_at"]) and ISO.match(
        events[-1]["data"]["finished_at"]
    )
    assert events[-1]["data"]["status"] == "succeeded" and events[1]["id"]
    assert all(set(event) == {"event", "id", "data"} for event in events)


def test_follow_ends_with_the_runs_end_and_ctrl_c_ends_only_the_following(
    cluster: Cluster,
) -> None:
    url = cluster.nodes[1].url
    cancelled, interrupted = (_start(cluster, uuid.uuid4().hex) for _ in range(2))
    following = [_follow(run["run_id"], "--url", url) for run in (cancelled, interrupted)]
    for process in following:  # the header: the stream is open
        assert process.stdout is not None
        assert process.stdout.readline().startswith("run ")
    with cluster.nodes[0].client() as client:
        client.post(f"/v1/runs/{cancelled['run_id']}/cancel", json={"reason": "enough"})
    out, err = following[0].communicate(timeout=30)
    assert following[0].returncode == Exit.CANCELLED, err
    assert re.search(
        rf"^cancelled: run {cancelled['run_id']} ended after .+; reason: enough$", out, re.M
    ), out

    following[1].send_signal(signal.SIGINT)
    out, err = following[1].communicate(timeout=30)
    assert following[1].returncode == Exit.INTERRUPTED
    said = f"cancel-bus: stopped following run {interrupted['run_id']} (the run itself is not"
    assert err.startswith(said) and err.count("\n") == 1, err
    with cluster.nodes[0].client() as client:
        assert client.get(f"/v1/runs/{interrupted['run_id']}").json()["status"] == "running"
        client.post(f"/v1/runs/{interrupted['run_id']}/cancel")

    ended = cli("follow", cancelled["run_id"], "--url", url)  # a run that had ended
    assert ended.returncode == Exit.CANCELLED
    assert ended.stdout.startswith(f"cancelled: run {cancelled['run_id']} ended after ")
    assert cli("follow", "deadbeef", "--url", url).returncode == Exit.NOT_FOUND


def test_follow_takes_a_run_up_again_when_a_node_drains(
    fake_node: tuple[str, type[FakeNode]],
) -> None:
    url, node = fake_node
    run = a_run("r-1").model_dump(mode="json")
    done = a_run("r-1", "succeeded", end_reason="completed").model_dump(mode="json")
    failed = a_run("r-1", "failed", end_reason="error").model_dump(mode="json")
    node.script["/v1/runs/r-1"] = [as_answer(a_run("r-1"))]
    node.script["/v1/runs/r-1/stream"] = [
        a_stream(("run", run), ("output", {"text": "hel"}), ("node.draining", {"run_id": "r-1"})),
        a_stream(
            ("run", run),
            ("output", {"text": "lo"}),
            ("run.finished", {"status": "succeeded", "end_reason": "completed"}),
            ("run", done),
        ),
    ]
    result = cli("follow", "r-1", "--url", url)
    assert result.returncode == Exit.OK, result.stderr
    lines = result.stdout.splitlines()
    assert lines[1:4] == [
        "hel",
        f"({url} stopped streaming the run: it drains; following again)",
        "lo",
    ]
    assert lines[-1].startswith("succeeded: run r-1 ended after")

    finished = ("run.finished", {"status": "failed", "end_reason": "error"})
    node.script["/v1/runs/r-1/stream"] = [a_stream(("run", run), finished, ("run", failed))]
    result = cli("follow", "r-1", "--url", url)
    assert result.returncode == Exit.FAILED
    assert result.stdout.splitlines()[-1].startswith("failed (error): run r-1 ended after")


@pytest.mark.parametrize(
    ("stream", "says"),
    [
        (
            a_stream(("run", {}), ("unavailable", {"detail": "Redis unavailable (Timeout)"})),
            "stopped streaming: Redis unavailable (Timeout)",
        ),
        (a_stream(("run", {})), "ended the stream of run r-1 before the run ended"),
        (a_stream(("output", {"words": 1})), "(HTTP 200 to GET /v1/runs/r-1/stream: event output:"),
        ((200, "text/html", b"<html></html>"), "stream: text/html, not an event stream)"),
        ((404, "application/json", b'{"detail": "run r-1 not found"}'), "HTTP 404: run r-1 not"),
    ],
)
def test_follow_reports_a_stream_that_goes_wrong_in_one_line(
    fake_node: tuple[str, type[FakeNode]], stream: Answer, says: str
) -> None:
    url, node = fake_node
    run = a_run("r-1").model_dump_json()
    node.script["/v1/runs/r-1"] = [as_answer(a_run("r-1"))]
    status, kind, body = stream
    node.script["/v1/runs/r-1/stream"] = [(status, kind, body.replace(b"{}", run.encode()))]
    result = cli("follow", "r-1", "--url", url, COLUMNS="60")
    assert result.returncode == Exit.ERROR
    assert says in _one_line(result)


def test_server_sent_events_are_read_as_the_standard_says() -> None:
    lines = [": keepalive", "", "event: output", "id: 1-0", 'data: {"text":', 'data: "a"}', ""]
    lines += ["data:plain", "", "event: lost"]  # no blank line after it: never dispatched
    assert list(server_sent(lines)) == [
        ("output", "1-0", '{"text":\n"a"}'),
        ("message", None, "plain"),
    ]
    assert KEEPALIVE == KEEPALIVE_SECONDS  # a stream's read waits for the node's keep-alive


def test_the_command_runs_as_a_module_too() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "node.cli", "--version"], capture_output=True, text=True
    )
    assert result.returncode == 0 and result.stdout.startswith("cancel-bus ")
