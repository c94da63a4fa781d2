"""Every Redis key and channel name, and the validation of the ids they are built from.

All names of one namespace share the hash tag ``{namespace}``, so every script touches a single
slot and runs unchanged on Redis Cluster. Ids are validated before any name is built: an id can
never smuggle a separator, a glob character or a hash tag into a key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ._errors import InvalidArgument, InvalidId

MAX_ID_LENGTH = 200
ID_PATTERN = r"^[A-Za-z0-9._@+=-]+$"
_ID_RE = re.compile(ID_PATTERN)


def validate_id(value: object, what: str) -> str:
    """Return ``value`` if it is a safe id, else raise :class:`InvalidId` naming ``what``."""
    if not isinstance(value, str):
        raise InvalidId(what, value, "must be a string")
    if not value:
        raise InvalidId(what, value, "must not be empty")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidId(what, value, f"must be at most {MAX_ID_LENGTH} characters")
    if _ID_RE.fullmatch(value) is None:
        raise InvalidId(what, value, "may contain only letters, digits and . _ @ + = -")
    return value


# Every command the library sends, directly or from its scripts (Redis checks both).
ACL_COMMANDS = (
    "evalsha", "eval", "script|load", "script|exists", "time", "ping", "multi", "exec",
    "discard", "select", "hello", "client|setname",
    "get", "set", "del", "exists", "incr", "pexpire",
    "hget", "hmget", "hset", "hsetnx", "hgetall", "hdel", "hstrlen",
    "sadd", "srem", "spop", "scard", "smembers",
    "zadd", "zrem", "zrange", "zrevrange", "zrangebyscore", "zremrangebyscore", "zscore",
    "rpush", "lrange", "ltrim", "xadd", "xrevrange", "xread",
    "publish", "spublish", "subscribe", "ssubscribe", "unsubscribe", "sunsubscribe",
    # Redis Cluster: the client's view of the slots, and the slot migration handshake
    "cluster|slots", "cluster|shards", "command", "asking", "readonly",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class KeySpace:
    """Names of one namespace. Scripts derive per-run and per-node names from :attr:`prefix`
    the same way (see ``_scripts.py``); this class is the Python side of that contract."""

    namespace: str

    def __post_init__(self) -> None:
        validate_id(self.namespace, "namespace")

    @property
    def prefix(self) -> str:
        return f"cb:{{{self.namespace}}}:"

    def acl_rules(self) -> str:
        """The minimal Redis ACL rules for a user of this namespace only: its keys, its channels,
        the commands the library uses. ``ACL SETUSER <name> on ><password> <rules>``."""
        return acl_rules(self.namespace)

    @property
    def active(self) -> str:
        """Sorted set of active run ids (queued, running, waiting), scored by creation time."""
        return f"{self.prefix}active"

    @property
    def finished(self) -> str:
        """Sorted set of finished run ids, scored by finish time; pruned after retention."""
        return f"{self.prefix}finished"

    @property
    def nodes(self) -> str:
        """Sorted set of live node ids, scored by lease expiry (seconds, Redis clock)."""
        return f"{self.prefix}nodes"

    @property
    def lease_clock(self) -> str:
        """Hash: the lease clock (``last`` heartbeat on the server clock, the clock's value ``at``
        it, the ``cap`` of one beat): lease time runs only while heartbeats reach Redis."""
        return f"{self.prefix}clock"

    def run(self, run_id: str) -> str:
        return f"{self.prefix}run:{run_id}"

    def events(self, run_id: str) -> str:
        """List of the run's lifecycle events after its start (JSON entries)."""
        return f"{self.prefix}ev:{run_id}"

    def relay(self, run_id: str) -> str:
        """Stream of what the run emits (output, app events), for followers on other nodes."""
        return f"{self.prefix}out:{run_id}"

    def waiters(self, run_id: str) -> str:
        """Set of node ids waiting for the run to finish."""
        return f"{self.prefix}wait:{run_id}"

    def session(self, app_name: str, user_id: str, session_id: str) -> str:
        """The active run id of a session key (ids cannot hold ':', so this is unambiguous)."""
        return f"{self.prefix}sess:{app_name}:{user_id}:{session_id}"

    def node(self, node_id: str) -> str:
        return f"{self.prefix}node:{node_id}"

    def node_runs(self, node_id: str) -> str:
        return f"{self.prefix}node:{node_id}:runs"

    def node_pending(self, node_id: str) -> str:
        """Hash run id -> cancel mode of the cancels pending on the node's runs."""
        return f"{self.prefix}node:{node_id}:pending"

    def channel(self, node_id: str) -> str:
        """The node's own pub/sub channel: cancels for its runs, finishes it waits for."""
        return f"{self.prefix}chan:{node_id}"


def acl_rules(*namespaces: str) -> str:
    """The minimal Redis ACL rules for one user of the given namespaces (a node serving several):
    their keys and channels side by side, then the commands the library uses, once (a second
    ``resetkeys`` would drop the patterns before it)."""
    if not namespaces:
        raise InvalidArgument("acl_rules needs at least one namespace")
    prefixes = [KeySpace(namespace).prefix for namespace in namespaces]
    keys = " ".join(f"~{prefix}*" for prefix in prefixes)
    channels = " ".join(f"&{prefix}*" for prefix in prefixes)
    commands = " ".join(f"+{command}" for command in ACL_COMMANDS)
    return f"resetkeys {keys} resetchannels {channels} -@all {commands}"
