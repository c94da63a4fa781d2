"""Local multi-process Redis topologies for the tests: a Sentinel group (1 primary, 1 replica,
3 sentinels; it can fail over again and again) and a Cluster (3 primaries, 3 replicas), built
from real server processes."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import redis

from cancel_bus._redis import CLUSTER_NEEDS
from node.embedded import EmbeddedServer, free_port

SERVICE = "mymaster"
SLOTS = 16384
# the lowest-versions job runs an older redis-py: a Cluster URL refuses it (test_urls.py)
needs_sharded_pubsub = pytest.mark.skipif(
    tuple(int(p) for p in redis.__version__.split(".")[:2]) < CLUSTER_NEEDS,
    reason=f"a Cluster needs redis-py 8.0 or later; installed {redis.__version__}",
)


def _until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except redis.RedisError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what}")


class SentinelServer(EmbeddedServer):
    """A sentinel: the same binary in sentinel mode, with its own (rewritable) config file."""

    def __init__(self, conf: Path, **options: object) -> None:
        super().__init__(**options)  # type: ignore[arg-type]
        self.conf = conf

    def args(self) -> list[str]:
        return [self.binary, str(self.conf), "--sentinel", "--logfile", str(self.log_path)]


def _info(port: int, section: str) -> dict[str, Any]:
    with redis.Redis(port=port, decode_responses=True) as client:
        info: dict[str, Any] = client.info(section)
        return info


class SentinelGroup:
    """``server_args``: extra arguments for the primary and the replica (not the sentinels)."""

    def __init__(
        self, workdir: Path, down_after_ms: int = 1000, server_args: Sequence[str] = ()
    ) -> None:
        self.server_args = list(server_args)
        self.primary = EmbeddedServer(extra_args=self.server_args)
        self.replica = EmbeddedServer(extra_args=self._replica_args(0))
        self.sentinels: list[EmbeddedServer] = []
        self.workdir = workdir
        self.down_after_ms = down_after_ms

    def _replica_args(self, primary_port: int) -> list[str]:
        return [*self.server_args, "--replicaof", "127.0.0.1", str(primary_port)]

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def start(self) -> SentinelGroup:
        self.primary.start()
        self.replica.extra_args = self._replica_args(self.primary.port)
        self.replica.start()
        _until(lambda: self._synced(self.replica.port), 20, "the replica to sync")
        for i in range(3):
            port = free_port()
            conf = self.workdir / f"sentinel-{i}.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.workdir}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary.port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} {self.down_after_ms}\n"
                f"sentinel failover-timeout {SERVICE} 4000\n"
                f"sentinel parallel-syncs {SERVICE} 1\n"
            )
            sentinel = SentinelServer(conf, port=port, data_dir=self.workdir / f"s{i}")
            self.sentinels.append(sentinel.start())
        _until(self._sentinels_agree, 20, "the sentinels to see the primary and each other")
        return self

    def _synced(self, port: int) -> bool:
        info = redis.Redis(port=port).info("replication")
        return info.get("master_link_status") == "up"

    def _sentinels_agree(self) -> bool:
        for sentinel in self.sentinels:
            state = redis.Redis(port=sentinel.port, decode_responses=True).sentinel_master(SERVICE)
            if int(state["num-other-sentinels"]) < 2 or int(state["num-slaves"]) < 1:
                return False
        return True

    def current_primary_port(self) -> int:
        address = redis.Redis(port=self.sentinels[0].port, decode_responses=True).execute_command(
            "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE
        )
        return int(address[1])

    def failovers(self) -> int:
        """How many failovers a sentinel has seen (its log's ``+switch-master`` events)."""
        return self.sentinels[0].log_path.read_text().count("+switch-master")

    def wait_failover(self, old_port: int, timeout: float = 30) -> None:
        _until(lambda: self.current_primary_port() != old_port, timeout, "a failover")

    def replica_caught_up(self) -> bool:
        """The replica has applied everything the primary has (meaningful while writes are
        paused on the primary)."""
        replica = _info(self.replica.port, "replication")
        primary = _info(self.primary.port, "replication")
        return bool(
            replica.get("master_link_status") == "up"
            and replica["slave_repl_offset"] >= primary["master_repl_offset"]
        )

    def promote(self, timeout: float = 30) -> None:
        """A failover the sentinels decide: once the replica has caught up, SIGKILL the primary
        and wait until every sentinel names the replica as the primary. The old primary is
        left dead, as :attr:`replica` (see :meth:`restore_replica`)."""
        _until(self.replica_caught_up, timeout, "the replica to catch up")
        old, new = self.primary, self.replica
        old.kill()
        _until(lambda: self._all_name_primary(new.port), timeout, "the sentinels to promote")
        self.primary, self.replica = new, old

    def restore_replica(self, timeout: float = 30) -> None:
        """Start the dead former primary again as a replica of the current one and wait until
        it is synced and every sentinel sees it (so that another failover can follow)."""
        self.replica.extra_args = self._replica_args(self.primary.port)
        self.replica.start()
        _until(lambda: self._synced(self.replica.port), timeout, "the new replica to sync")
        _until(self._all_see_replica, timeout, "the sentinels to see the new replica")

    def _all_name_primary(self, port: int) -> bool:
        for sentinel in self.sentinels:
            with redis.Redis(port=sentinel.port, decode_responses=True) as client:
                address = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
            if int(address[1]) != port:
                return False
        return True

    def _all_see_replica(self) -> bool:
        for sentinel in self.sentinels:
            with redis.Redis(port=sentinel.port, decode_responses=True) as client:
                replicas = client.sentinel_slaves(SERVICE)
            if not any(
                r["port"] == self.replica.port and not (r["is_sdown"] or r["is_disconnected"])
                for r in replicas
            ):
                return False
        return True

    def cleanup(self) -> None:
        for server in [*self.sentinels, self.replica, self.primary]:
            server.cleanup()


class Cluster:
    def __init__(self, primaries: int = 3, replicas_each: int = 1, node_timeout_ms: int = 1500):
        args = [
            "--cluster-enabled",
            "yes",
            "--cluster-node-timeout",
            str(node_timeout_ms),
            "--cluster-require-full-coverage",
            "no",
        ]
        self.primaries = [self._server(args) for _ in range(primaries)]
        self.replicas = [self._server(args) for _ in range(primaries * replicas_each)]
        self.replicas_each = replicas_each
        self.started = self.servers  # every process, for cleanup after failovers
        for server in self.servers:
            server.extra_args.extend(["--cluster-config-file", str(server.data_dir / "nodes.conf")])

    @staticmethod
    def _server(args: list[str]) -> EmbeddedServer:
        # the cluster bus port is given: the default (port + 10000) may not exist
        return EmbeddedServer(extra_args=[*args, "--cluster-port", str(free_port())])

    @property
    def servers(self) -> list[EmbeddedServer]:
        return [*self.primaries, *self.replicas]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{s.port}" for s in self.primaries)

    def client(self, server: EmbeddedServer) -> redis.Redis:
        return redis.Redis(port=server.port, decode_responses=True)

    def start(self) -> Cluster:
        for server in self.servers:
            server.start()
        first = self.client(self.primaries[0])
        per = SLOTS // len(self.primaries)
        for i, server in enumerate(self.primaries):
            end = SLOTS - 1 if i == len(self.primaries) - 1 else (i + 1) * per - 1
            self.client(server).execute_command("CLUSTER", "ADDSLOTSRANGE", i * per, end)
        for server in self.servers[1:]:
            bus_port = server.extra_args[server.extra_args.index("--cluster-port") + 1]
            first.execute_command("CLUSTER", "MEET", "127.0.0.1", server.port, bus_port)
        _until(lambda: all(self._knows_all(s) for s in self.servers), 30, "cluster gossip")
        for i, replica in enumerate(self.replicas):
            primary = self.primaries[i // self.replicas_each]
            node_id = self.client(primary).execute_command("CLUSTER", "MYID")
            self.client(replica).execute_command("CLUSTER", "REPLICATE", node_id)
        _until(self._ok, 30, "the cluster to be ok")
        return self

    def _knows_all(self, server: EmbeddedServer) -> bool:
        nodes = self.client(server).execute_command("CLUSTER", "NODES")
        text = nodes if isinstance(nodes, str) else str(nodes)
        return text.count("connected") >= len(self.servers)

    def _ok(self) -> bool:
        for server in self.servers:
            info = self.client(server).execute_command("CLUSTER", "INFO")
            if "cluster_state:ok" not in str(info):
                return False
        for replica in self.replicas:
            if self.client(replica).info("replication").get("master_link_status") != "up":
                return False
        return True

    def owner(self, key: str) -> EmbeddedServer:
        """The primary serving the slot of ``key``."""
        slot = int(self.client(self.primaries[0]).execute_command("CLUSTER", "KEYSLOT", key))
        for server in self.primaries:
            for entry in self.client(server).execute_command("CLUSTER", "SLOTS"):
                start, end, master = entry[0], entry[1], entry[2]
                if start <= slot <= end and int(master[1]) == server.port:
                    return server
        raise RuntimeError(f"no primary serves slot {slot}")

    def move_slot(self, key: str, target: EmbeddedServer) -> None:
        """Migrate the slot of ``key`` (and its keys) to ``target``, as redis-cli reshard does."""
        source = self.owner(key)
        src, dst = self.client(source), self.client(target)
        slot = int(src.execute_command("CLUSTER", "KEYSLOT", key))
        src_id = src.execute_command("CLUSTER", "MYID")
        dst_id = dst.execute_command("CLUSTER", "MYID")
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
        while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
            src.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys)
        for server in self.primaries:
            self.client(server).execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        _until(lambda: self.owner(key) is target, 20, "the slot to move")

    def fail_over(self, primary: EmbeddedServer) -> EmbeddedServer:
        """Kill ``primary``; its replica is promoted by the cluster itself. Returns the replica."""
        node_id = self.client(primary).execute_command("CLUSTER", "MYID")
        replica = next(
            r
            for r in self.replicas
            if self.client(r).info("replication").get("master_port") == primary.port
        )
        primary.kill()
        _until(
            lambda: self.client(replica).info("replication")["role"] == "master",
            30,
            f"the replica of {node_id} to take over",
        )
        self.primaries[self.primaries.index(primary)] = replica
        self.replicas.remove(replica)
        return replica

    def cleanup(self) -> None:
        for server in self.started:
            server.cleanup()
