"""What a node process agrees to serve: auth off (no tokens, or an empty table) only on loopback
unless told otherwise, a log that says where it listens, /metrics behind a token by default
when tokens are set; and a node that cannot join says so in one line and leaves nothing behind."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import httpx
import pytest
import redis
import redis.asyncio as aioredis

from cancel_bus import BusUnavailable, CancelBus
from cancel_bus._keys import KeySpace
from node.embedded import EmbeddedServer, free_port
from node.service import NodeService
from node.settings import Settings

from ..node_cluster import COMMAND, READY_TIMEOUT, Cluster

OPS = "ops-" + uuid.uuid4().hex


def _serve(redis_url: str, *args: str, port: int = 0, **env: str) -> subprocess.Popen[str]:
    """``cancel-bus serve`` with ``args`` (its output kept), tokens and host only from ``env``."""
    environment = {
        **os.environ,
        "CANCEL_BUS_REDIS_URL": redis_url,
        "CANCEL_BUS_API_TOKENS": "",
        "CANCEL_BUS_API_TOKENS_FILE": "",
        "CANCEL_BUS_HOST": "",
        **{f"CANCEL_BUS_{key.upper()}": value for key, value in env.items()},
    }
    environment = {key: value for key, value in environment.items() if value != ""}
    return subprocess.Popen(
        [COMMAND, "serve", "--port", str(port or free_port()), *args],
        env={**environment, "COLUMNS": "80"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize(
    ("args", "env"),
    [
        (["--host", "0.0.0.0"], {"api_tokens": "{}"}),  # an empty table is auth off
        (["--host", "0.0.0.0"], {}),
        ([], {"host": "::"}),
        ([], {"host": "10.1.2.3", "api_tokens": "{}", "insecure_no_auth": "false"}),
        (["--host", "node.example.com"], {}),  # a name may resolve anywhere
    ],
)
def test_auth_off_on_an_exposed_address_refuses_to_start(
    redis_server: EmbeddedServer, args: list[str], env: dict[str, str]
) -> None:
    process = _serve(redis_server.url, *args, **env)
    try:
        stdout, stderr = process.communicate(timeout=30)
    finally:
        process.kill()  # if it did start
        process.wait()
    assert process.returncode == 1, (stdout, stderr)
    assert stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
    assert stderr.startswith("cancel-bus: bad configuration: auth is off")
    assert "CANCEL_BUS_INSECURE_NO_AUTH=true" in stderr and "--insecure-no-auth" in stderr


def _auth_off_warning(log: str) -> str:
    return next(line for line in log.splitlines() if "AUTH IS OFF" in line)


def test_insecure_no_auth_serves_the_exposed_address_and_says_so(
    redis_server: EmbeddedServer, tmp_path: Path
) -> None:
    cluster = Cluster(
        redis_server.url, 1, tmp_path, host="0.0.0.0", api_tokens="{}", insecure_no_auth="true"
    )
    node = cluster.nodes[0]
    try:
        cluster.start()
        with node.client() as client:
            assert client.get("/v1/nodes").status_code == 200  # anonymous ops, as asked
        log = node.log_path.read_text()
        warning = _auth_off_warning(log)
        assert f"0.0.0.0:{node.port}" in warning and "INSECURE_NO_AUTH" in warning
        assert f"ready: dashboard at http://0.0.0.0:{node.port}/" in log
        assert f"127.0.0.1:{node.port}" not in log  # (the access log names its clients)
    finally:
        cluster.stop()


def _wait_ready(url: str, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    while process.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return
        time.sleep(0.05)
    raise AssertionError(f"no node ready at {url} (exit code {process.poll()})")


def test_the_flag_says_the_same_as_the_variable(redis_server: EmbeddedServer) -> None:
    port = free_port()
    process = _serve(redis_server.url, "--host", "0.0.0.0", "--insecure-no-auth", port=port)
    try:
        _wait_ready(f"http://127.0.0.1:{port}", process)
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=30)
    assert f"0.0.0.0:{port}" in _auth_off_warning(stderr)


def test_without_tokens_on_loopback_it_starts_and_warns_loudly(
    redis_server: EmbeddedServer, tmp_path: Path
) -> None:
    cluster = Cluster(redis_server.url, 1, tmp_path).start()
    try:
        node = cluster.nodes[0]
        warning = _auth_off_warning(node.log_path.read_text())
        assert f"127.0.0.1:{node.port}" in warning and "INSECURE" not in warning
        with node.client() as client:
            assert client.get("/metrics").status_code == 200
    finally:
        cluster.stop()


@pytest.mark.parametrize(("require", "anonymous"), [(None, 401), ("false", 200)])
def test_metrics_need_a_token_by_default_and_can_be_opened(
    redis_server: EmbeddedServer, tmp_path: Path, require: str | None, anonymous: int
) -> None:
    settings = {"metrics_require_token": require} if require is not None else {}
    tokens = json.dumps({OPS: {"role": "ops"}})
    cluster = Cluster(redis_server.url, 1, tmp_path, api_tokens=tokens, **settings).start()
    try:
        node = cluster.nodes[0]
        assert httpx.get(f"{node.url}/metrics").status_code == anonymous
        assert httpx.get(f"{node.url}/v1/runs").status_code == 401  # the API stays closed
        with node.client(OPS) as client:
            assert "cancel_bus_node_tasks" in client.get("/metrics").text
    finally:
        cluster.stop()


def _refusal(process: subprocess.Popen[str]) -> str:
    """The last line of a ``serve`` that refused to start: exit code 1, no traceback."""
    try:
        stdout, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == 1, (stdout, stderr)
    assert "Traceback" not in stderr, stderr
    return stderr.strip().splitlines()[-1]


def test_a_redis_that_is_not_there_is_one_line_and_exit_code_1() -> None:
    last = _refusal(_serve(f"redis://127.0.0.1:{free_port()}/0"))
    assert last.startswith("cancel-bus: cannot start: register_node: Redis unavailable"), last


async def test_a_namespace_that_cannot_join_leaves_nothing_behind(
    redis_server: EmbeddedServer, raw_redis: aioredis.Redis
) -> None:
    allowed, forbidden = f"ok-{uuid.uuid4().hex[:8]}", f"no-{uuid.uuid4().hex[:8]}"
    user, password = f"u-{allowed}", "pw-" + uuid.uuid4().hex
    await raw_redis.execute_command(
        "ACL", "SETUSER", user, "on", f">{password}", *KeySpace(allowed).acl_rules().split()
    )
    settings = Settings(
        redis_url=f"redis://{user}:{password}@127.0.0.1:{redis_server.port}/0",
        namespace=allowed,
        app_namespaces={"other": forbidden},
        lease_ttl=2.0,
    )
    node = NodeService(settings)
    with pytest.raises(BusUnavailable, match="refused access"):
        await node.start()  # the first namespace joined, the second was refused
    assert node.buses == []
    async with CancelBus(redis_server.url, namespace=allowed) as observer:
        nodes = await observer.list_nodes()
    assert [n.node_id for n in nodes] == [observer.node_id]  # the one that joined has left


def test_an_embedded_server_that_cannot_load_its_data_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "redis").mkdir()
    (tmp_path / "redis" / "dump.rdb").write_bytes(os.urandom(300))  # a corrupt snapshot
    last = _refusal(_serve("", data_dir=str(tmp_path)))
    assert last.startswith("cancel-bus: cannot start: ") and "exited at start: " in last, last
    assert f"(its log: {tmp_path / 'redis' / 'server.log'})" in last


async def test_a_stop_while_the_node_joins_ends_the_join_at_once(
    redis_server: EmbeddedServer, raw_redis: aioredis.Redis
) -> None:
    namespace = f"deaf-{uuid.uuid4().hex[:8]}"
    user, password = f"u-{namespace}", "pw-" + uuid.uuid4().hex
    rules = [rule for rule in KeySpace(namespace).acl_rules().split() if rule[0] != "&"]
    await raw_redis.execute_command("ACL", "SETUSER", user, "on", f">{password}", *rules)
    url = f"redis://{user}:{password}@127.0.0.1:{redis_server.port}/0"
    process = _serve(url, namespace=namespace, lease_ttl="60")  # it waits a lease to subscribe
    try:
        async with asyncio.timeout(READY_TIMEOUT):
            while not await raw_redis.zcard(KeySpace(namespace).nodes):  # registered: waiting
                await asyncio.sleep(0.05)
        started = time.monotonic()
        process.terminate()
        _, stderr = await asyncio.to_thread(process.communicate, timeout=30)
        assert time.monotonic() - started < 15  # not the 60 s lease
    finally:
        process.kill()
        process.wait()
        await raw_redis.execute_command("ACL", "DELUSER", user)
    assert process.returncode == 0, stderr
    assert "Traceback" not in stderr and "stopped while joining the cluster" in stderr, stderr
    assert not await raw_redis.zcard(KeySpace(namespace).nodes)  # it withdrew its registration


@pytest.mark.parametrize(
    ("env", "said"),
    [
        (
            {"redis_ulr": "redis://elsewhere:6379/0"},  # it would start an embedded server
            "bad configuration: unknown setting CANCEL_BUS_REDIS_ULR: did you mean "
            "CANCEL_BUS_REDIS_URL?",
        ),
        (
            {"lease_ttl": "5", "self_fence_after": "0"},
            "bad configuration: CANCEL_BUS_SELF_FENCE_AFTER: Input should be greater than 0",
        ),
        ({"retention": "inf"}, "bad configuration: CANCEL_BUS_RETENTION: Input should be a finite"),
    ],
)
def test_a_setting_that_cannot_work_is_one_line(
    redis_server: EmbeddedServer, env: dict[str, str], said: str
) -> None:
    process = _serve(redis_server.url, **env)
    stdout, stderr = process.communicate(timeout=30)
    assert process.returncode == 1, (stdout, stderr)
    assert stderr.count("\n") == 1 and stderr.startswith(f"cancel-bus: {said}"), stderr


def test_a_data_dir_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "state").write_text("not a directory")
    assert _refusal(_serve("", data_dir=str(tmp_path / "state"))) == (
        f"cancel-bus: cannot start: the embedded server's data dir {tmp_path}/state/redis cannot "
        "be used: Not a directory (set CANCEL_BUS_DATA_DIR to a writable directory, or "
        "CANCEL_BUS_REDIS_URL)"
    )


def test_an_embedded_server_that_dies_is_started_again(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = _serve("", port=port, data_dir=str(tmp_path))
    body = {"app_name": "a", "user_id": "u", "session_id": "s", "agent": {"tokens": 1}}
    try:
        _wait_ready(url, process)
        redis_url = json.loads((tmp_path / "redis" / "lock").read_text())["redis_url"]
        with redis.Redis.from_url(redis_url) as server:
            first = server.info("server")["run_id"]
            with contextlib.suppress(redis.RedisError):
                server.shutdown(nosave=True)  # the server process exits
        deadline = time.monotonic() + READY_TIMEOUT
        started = None
        while started is None or started == first:  # a new server on the same port
            assert time.monotonic() < deadline and process.poll() is None
            with contextlib.suppress(redis.RedisError), redis.Redis.from_url(redis_url) as server:
                started = server.info("server")["run_id"]
            time.sleep(0.05)
        while (answer := httpx.post(f"{url}/v1/runs", json=body, timeout=10)).status_code == 503:
            assert time.monotonic() < deadline  # 503 until the node has registered again
            time.sleep(0.05)
        assert answer.status_code == 201, answer.text
        assert httpx.get(f"{url}/healthz", timeout=5).json() == {"status": "ok"}
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=30)
    assert "the embedded server exited (code 0)" in stderr, stderr
    assert "the embedded server is back at" in stderr and "Traceback" not in stderr, stderr


def test_an_evicting_redis_is_refused_unless_accepted_then_named_by_readiness(
    own_server: EmbeddedServer,
) -> None:
    with redis.Redis.from_url(own_server.url) as admin:
        admin.config_set("maxmemory-policy", "allkeys-lru")
    last = _refusal(_serve(own_server.url))
    assert last.startswith("cancel-bus: cannot start: Redis's maxmemory-policy is allkeys-lru"), (
        last
    )
    assert "CANCEL_BUS_ACCEPT_EVICTION=true" in last
    port = free_port()
    process = _serve(own_server.url, port=port, accept_eviction="true")
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, process)
        (warning,) = httpx.get(f"{url}/readyz", timeout=5).json()["warnings"]
        assert "maxmemory-policy is allkeys-lru (accepted)" in warning
        metrics = httpx.get(f"{url}/metrics", timeout=5).text
        assert 'cancel_bus_accepted_risks{bus_namespace="cancel-bus"} 1.0' in metrics
    finally:
        process.terminate()
        process.communicate(timeout=30)
