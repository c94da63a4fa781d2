"""The `cancel-bus` command against real node processes: full ids and unique prefixes, human
times (ISO with --json), one-line errors with the server's message, --help with descriptions and
choices, distinct documented exit codes, a live view, and the README's commands."""

from __future__ import annotations

import json
import re
import shlex
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from pydantic import BaseModel, ValidationError, create_model

from node.cli import HTTP_TIMEOUT, Exit, build_parser
from node.embedded import EmbeddedServer
from node.queries import RunQuery
from node.schemas import CancelBody, SelectorCancel
from node.settings import Settings

from ..node_cluster import COMMAND, Cluster

README = Path(__file__).parents[2] / "README.md"
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
    assert result.stdout.startswith(f"stopping: run {run['run_id']}: the cancel is recorded")


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
        (["runs", "--status", "bogus"], Exit.USAGE, "invalid choice: 'bogus' (choose from"),
        (["cancel", "x", "--mode", "soon"], Exit.USAGE, "invalid choice: 'soon'"),
        (["runs", "--older-than", "soon"], Exit.USAGE, "'soon' is not a duration"),
        (["runs", "--watch", "-1"], Exit.USAGE, "'-1' is out of range (above 0, at most"),
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
        (["cancel-where", "--meta", "tier"], Exit.USAGE, "'tier' is not KEY=VALUE"),
        (["cancel-where", "--meta", "n:=[1]"], Exit.USAGE, "KEY:= takes a number"),
        (["cancel-where", "--started-before", "soon"], Exit.USAGE, "'soon' is not a time"),
        (["cancel-where", "--ttl", "1m", "--until", "12:00"], Exit.USAGE, "not allowed with"),
        (["cancel-where", "--app", "a", "--json"], Exit.USAGE, "--json needs --yes or --dry-run"),
        (["cancel-where", "--dry-run"], Exit.ERROR, "HTTP 422: body: Value error, a selector"),
        (["tombstones", "rm"], Exit.USAGE, "tombstones rm needs a TOMBSTONE_ID"),
        (["tombstones", "drop"], Exit.USAGE, "invalid choice: 'drop'"),
    ],
)
def test_errors_are_one_line_with_a_distinct_exit_code(
    cluster: Cluster, args: list[str], code: Exit, says: str
) -> None:
    local = "--url" in args or args[0] in ("demo", "serve")
    url = [] if local else ["--url", cluster.nodes[0].url]
    result = cli(*args, *url, COLUMNS="60")  # a narrow terminal: still one line
    assert result.returncode == code, result
    assert says in _one_line(result)


def test_help_describes_every_option_and_its_choices() -> None:
    top = cli("--help").stdout
    commands = ("serve", "demo", "runs", "run", "cancel", "cancel-where", "tombstones", "nodes")
    for command in (*commands, "acl-rules"):
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
    parser = build_parser()
    info = model.model_fields[field]
    annotation: Any = info.annotation
    node_side = create_model("NodeSide", value=(annotation, info))
    for value in values:
        try:
            parser.parse_args([*command, option, str(value)])
        except SystemExit as exc:
            assert exc.code == Exit.USAGE
            cli_takes = False
        else:
            cli_takes = True
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


@pytest.fixture(scope="module")
def stranger() -> Iterator[str]:
    """The URL of a plain HTTP server on a free loopback port, in a thread of this process."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Stranger)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)
    assert not thread.is_alive()


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
    args = build_parser().parse_args(["runs"])
    assert args.http_timeout == HTTP_TIMEOUT <= 10
    shown = " ".join(cli("runs", "--help").stdout.split())
    assert re.search(rf"--http-timeout SECONDS how long .*default {HTTP_TIMEOUT:g}\)", shown)
