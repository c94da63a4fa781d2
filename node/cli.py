"""The ``cancel-bus`` command: serve a node, demo a local cluster, inspect and cancel runs.

Client commands talk HTTP to ``--url`` (default: the local node) with ``--token``; ``--json``
prints machine-readable output. Errors are one line on stderr and a non-zero exit.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from types import FrameType
from typing import Any

import httpx
import uvicorn
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from cancel_bus import InvalidArgument, __version__, acl_rules

DEFAULT_URL = "http://127.0.0.1:8080"
EXIT_ERROR, EXIT_NOT_FOUND, EXIT_FINISHED = 1, 2, 3
OUTCOME_EXIT = {"not_found": EXIT_NOT_FOUND, "already_finished": EXIT_FINISHED}

out = Console()
err = Console(stderr=True)


class CliError(Exception):
    """A failure to report as one line."""


# -- serve ------------------------------------------------------------------------------------


class DrainingServer(uvicorn.Server):
    """On the first SIGTERM/SIGINT: fail readiness, drain the node (runs get the drain timeout,
    the rest are cancelled and recorded), then stop serving. A second signal forces the exit."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._drain: asyncio.Task[None] | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._drain is not None:
            self.force_exit = True
            super().handle_exit(sig, frame)
            return
        self._captured_signals.append(sig)
        loop = asyncio.get_event_loop()
        self._drain = loop.create_task(self._drain_then_exit())

    async def _drain_then_exit(self) -> None:
        node = _find_node(self.config.loaded_app)
        try:
            if node is not None:
                await node.drain()
        finally:
            self.should_exit = True


def _find_node(app: Any) -> Any:
    """The node service of the app uvicorn serves (possibly wrapped in middleware)."""
    while app is not None:
        state = getattr(app, "state", None)
        if state is not None and hasattr(state, "node"):
            return state.node
        app = getattr(app, "app", None)
    return None


def serve(args: argparse.Namespace) -> int:
    for flag, key in (
        ("redis_url", "REDIS_URL"),
        ("node_id", "NODE_ID"),
        ("host", "HOST"),
        ("port", "PORT"),
        ("namespace", "NAMESPACE"),
    ):
        value = getattr(args, flag)
        if value is not None:
            os.environ[f"CANCEL_BUS_{key}"] = str(value)
    if args.insecure_no_auth:
        os.environ["CANCEL_BUS_INSECURE_NO_AUTH"] = "true"
    from .app import create_app  # noqa: PLC0415 (settings read the environment set above)
    from .settings import ENV_PREFIX, Settings  # noqa: PLC0415

    try:
        settings = Settings()
        app = create_app(settings)
    except ValidationError as exc:
        problems = (f"{ENV_PREFIX}{str(e['loc'][0]).upper()}: {e['msg']}" for e in exc.errors())
        raise CliError(f"bad configuration: {'; '.join(problems)}") from None
    except (ValueError, OSError) as exc:
        raise CliError(f"bad configuration: {exc}") from None
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(levelname)s:     %(name)s: %(message)s"
    )
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        timeout_graceful_shutdown=5,  # after the drain: streams have ended, runs are recorded
        access_log=False,
    )
    server = DrainingServer(config)
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    out.print(f"cancel-bus node: dashboard at http://{host}:{settings.port}/  (API docs: /docs)")
    server.run()
    return 0


# -- demo -------------------------------------------------------------------------------------


def demo(args: argparse.Namespace) -> int:
    from .embedded import EmbeddedServer, free_port  # noqa: PLC0415

    if args.nodes < 2:
        raise CliError("a demo of a cross-node cancel needs at least 2 nodes")
    server = EmbeddedServer().start()
    processes = []
    try:
        ports = [free_port() for _ in range(args.nodes)]
        out.print(f"embedded server: {server.url}")
        for i, port in enumerate(ports, 1):
            env = {
                **os.environ,
                "CANCEL_BUS_REDIS_URL": server.url,
                "CANCEL_BUS_NODE_ID": f"node-{i}",
                "CANCEL_BUS_PORT": str(port),
                "CANCEL_BUS_HOST": "127.0.0.1",
                "CANCEL_BUS_LOG_LEVEL": "warning",
            }
            for key in ("CANCEL_BUS_API_TOKENS", "CANCEL_BUS_API_TOKENS_FILE"):
                env.pop(key, None)
            processes.append(_spawn_node(env))
        urls = [f"http://127.0.0.1:{port}" for port in ports]
        for url in urls:
            _wait_ready(url, timeout=30)
        out.print(f"{args.nodes} nodes ready: " + ", ".join(urls))
        _show_cross_node_cancel(urls)
        out.print("\ndashboards: " + "  ".join(f"{url}/" for url in urls))
        if args.exit:
            return 0
        out.print("Ctrl-C to stop the cluster.")
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
        return 0
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(30)
            except Exception:
                process.kill()
        server.cleanup()


def _spawn_node(env: dict[str, str]) -> Any:
    import subprocess  # noqa: PLC0415

    return subprocess.Popen(
        [sys.executable, "-m", "node.cli", "serve"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _wait_ready(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise CliError(f"node at {url} was not ready within {timeout:.0f}s")


def _show_cross_node_cancel(urls: list[str]) -> None:
    first, second = urls[0], urls[1]
    body = {
        "app_name": "demo",
        "user_id": "alice",
        "session_id": "s1",
        "agent": {
            "tokens": 2000,
            "token_interval_ms": 20,
            "tools": [{"name": "search", "duration_ms": 300}],
        },
    }
    started = httpx.post(f"{first}/v1/runs", json=body, timeout=10).json()
    run_id = started["run_id"]
    out.print(f"\nstarted run {run_id} on node-1 ({started['owner']})")
    time.sleep(0.5)
    out.print(f"cancelling it through node-2 ({second}) ...")
    t0 = time.perf_counter()
    response = httpx.post(f"{second}/v1/runs/{run_id}/cancel", json={"reason": "demo"}, timeout=10)
    elapsed = (time.perf_counter() - t0) * 1000
    answer = response.json()
    run = answer["run"]
    out.print(
        f"HTTP {response.status_code} {answer['outcome']} in {elapsed:.1f} ms "
        f"(status {run['status']}, {len(run['output'])} chars of partial output kept)"
    )
    requested = run["cancel_requested_at"]
    for phase in ("cancel_delivered_at", "cancel_observed_at", "finished_at"):
        if run.get(phase):
            label = phase.removesuffix("_at").replace("cancel_", "")
            out.print(f"  {label:>9}: +{(run[phase] - requested) * 1000:.2f} ms after request")


# -- client commands --------------------------------------------------------------------------


def _client(args: argparse.Namespace) -> httpx.Client:
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    return httpx.Client(base_url=args.url, headers=headers, timeout=args.http_timeout)


def _call(args: argparse.Namespace, method: str, path: str, **kwargs: Any) -> httpx.Response:
    try:
        with _client(args) as client:
            response = client.request(method, path, **kwargs)
    except httpx.HTTPError as exc:
        raise CliError(f"cannot reach {args.url}: {exc}") from None
    if response.status_code in (401, 403, 422, 503) or response.status_code >= 500:
        raise CliError(f"HTTP {response.status_code}: {_detail(response)}")
    return response


def _detail(response: httpx.Response) -> str:
    try:
        detail = response.json().get("detail")
    except ValueError:
        return response.text[:200]
    return detail if isinstance(detail, str) else json.dumps(detail)[:300]


def runs(args: argparse.Namespace) -> int:
    params = {"status": args.status, "limit": args.limit}
    for key in ("node", "user", "app"):
        value = getattr(args, key)
        if value:
            params[{"node": "node_id", "user": "user_id", "app": "app_name"}[key]] = value
    found = _call(args, "GET", "/v1/runs", params=params).json()["runs"]
    if args.json:
        print(json.dumps(found, indent=2))
        return 0
    table = Table("run", "status", "owner", "phase", "app / user / session", "age")
    now = time.time()
    for run in found:
        status = "stopping" if run["stopping"] else run["status"]
        session = " / ".join(filter(None, (run["app_name"], run["user_id"], run["session_id"])))
        table.add_row(
            run["run_id"],
            status,
            run["owner"] or "-",
            run["phase"] or "-",
            session or "-",
            f"{now - run['created_at']:.0f}s",
        )
    out.print(table)
    return 0


def run_details(args: argparse.Namespace) -> int:
    response = _call(args, "GET", f"/v1/runs/{args.run_id}")
    if response.status_code == 404:
        raise CliError(f"run {args.run_id} not found")
    run = response.json()
    events = _call(args, "GET", f"/v1/runs/{args.run_id}/events").json()["events"]
    if args.json:
        print(json.dumps({"run": run, "events": events}, indent=2))
        return 0
    table = Table("field", "value", show_header=False)
    for key, value in run.items():
        if value not in (None, "", False) and key != "output":
            table.add_row(key, str(value))
    table.add_row("output", _shorten(run["output"]))
    out.print(table)
    timeline = Table("event", "at (+ms)", "data")
    start = events[0]["at"] if events else 0
    for event in events:
        timeline.add_row(
            event["type"], f"{(event['at'] - start) * 1000:.1f}", json.dumps(event["data"])
        )
    out.print(timeline)
    return 0


def cancel(args: argparse.Namespace) -> int:
    body = {
        "mode": args.mode,
        "wait": not args.no_wait,
        "timeout": args.timeout,
        "reason": args.reason,
    }
    if args.session:
        app, user, session = args.session
        path = f"/v1/sessions/{app}/{user}/{session}/cancel"
    elif args.run_id:
        path = f"/v1/runs/{args.run_id}/cancel"
    else:
        raise CliError("give a RUN_ID or --session APP USER SESSION")
    answer = _call(args, "POST", path, json=body).json()
    outcome = answer["outcome"]
    if args.json:
        print(json.dumps(answer, indent=2))
    else:
        run = answer.get("run") or {}
        status = f" (run {run['run_id']}: {run['status']})" if run else ""
        out.print(f"{outcome}{status}")
    return OUTCOME_EXIT.get(outcome, 0)


def nodes(args: argparse.Namespace) -> int:
    found = _call(args, "GET", "/v1/nodes").json()["nodes"]
    if args.json:
        print(json.dumps(found, indent=2))
        return 0
    table = Table("node", "epoch", "heartbeat", "lease left", "active runs", "version")
    now = time.time()
    for node in found:
        lease = "expired" if node["expired"] else f"{node['lease_expires_at'] - now:.1f}s"
        table.add_row(
            node["node_id"],
            str(node["epoch"]),
            f"{now - node['last_heartbeat']:.1f}s ago",
            lease,
            str(node["active_runs"]),
            node["version"],
        )
    out.print(table)
    return 0


def print_acl_rules(args: argparse.Namespace) -> int:
    try:
        print(acl_rules(*args.namespaces))
    except InvalidArgument as exc:
        raise CliError(str(exc)) from None
    return 0


def _shorten(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[:limit] + f"… ({len(text)} chars)"


# -- parser -----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cancel-bus", description="Cancel long-running work from any node of a cluster."
    )
    parser.add_argument("--version", action="version", version=f"cancel-bus {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    p = commands.add_parser("serve", help="run a node (no Redis URL: an embedded server)")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--redis-url")
    p.add_argument("--node-id")
    p.add_argument("--namespace")
    p.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="without API tokens, listen beyond loopback all the same (anyone may cancel)",
    )
    p.set_defaults(func=serve)

    p = commands.add_parser("demo", help="a local cluster: cancel a run on node 1 via node 2")
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--exit", action="store_true", help="stop after the demo instead of waiting")
    p.set_defaults(func=demo)

    client = argparse.ArgumentParser(add_help=False)
    client.add_argument("--url", default=os.environ.get("CANCEL_BUS_URL", DEFAULT_URL))
    client.add_argument("--token", default=os.environ.get("CANCEL_BUS_TOKEN"))
    client.add_argument("--json", action="store_true", help="machine-readable output")
    client.add_argument("--http-timeout", type=float, default=70.0, help=argparse.SUPPRESS)

    p = commands.add_parser("runs", parents=[client], help="list runs across the cluster")
    p.add_argument("--status", default="active")
    p.add_argument("--node")
    p.add_argument("--user")
    p.add_argument("--app")
    p.add_argument("--limit", type=int, default=100)
    p.set_defaults(func=runs)

    p = commands.add_parser("run", parents=[client], help="one run: details and events")
    p.add_argument("run_id")
    p.set_defaults(func=run_details)

    p = commands.add_parser("cancel", parents=[client], help="cancel a run from any node")
    p.add_argument("run_id", nargs="?")
    p.add_argument("--session", nargs=3, metavar=("APP", "USER", "SESSION"))
    p.add_argument(
        "--mode", default="checkpoint", choices=["checkpoint", "immediate", "after_turn"]
    )
    p.add_argument("--reason")
    p.add_argument("--no-wait", action="store_true")
    p.add_argument("--timeout", type=float, default=5.0)
    p.set_defaults(func=cancel)

    p = commands.add_parser("nodes", parents=[client], help="the live nodes")
    p.set_defaults(func=nodes)

    p = commands.add_parser(
        "acl-rules", help="the Redis ACL rules of a user for these namespaces (and nothing else)"
    )
    p.add_argument("namespaces", nargs="+", metavar="NAMESPACE")
    p.set_defaults(func=print_acl_rules)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except CliError as exc:
        err.print(f"cancel-bus: {exc}", highlight=False, markup=False, soft_wrap=True)
        return EXIT_ERROR
    return code


if __name__ == "__main__":
    sys.exit(main())
