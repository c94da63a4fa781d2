"""Every Redis key and channel name, and the validation of the ids they are built from.

All names of one namespace share the hash tag ``{namespace}``, so every script touches a single
slot and runs unchanged on Redis Cluster. Ids are validated before any name is built: an id can
never smuggle a separator, a glob character or a hash tag into a key.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
from dataclasses import dataclass, field

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
    "discard", "select", "hello", "client|setname", "info",
    "get", "set", "del", "exists", "incr", "pexpire",
    "hget", "hmget", "hset", "hsetnx", "hgetall", "hdel", "hstrlen",
    "sadd", "srem", "spop", "scard", "smembers",
    "zadd", "zrem", "zcard", "zrange", "zrevrange", "zrangebyscore", "zremrangebyscore", "zscore",
    "rpush", "lrange", "ltrim", "xadd", "xrevrange", "xread",
    "publish", "spublish", "subscribe", "ssubscribe", "unsubscribe", "sunsubscribe",
    # Redis Cluster: the client's view of the slots, and the slot migration handshake
    "cluster|slots", "cluster|shards", "command", "asking", "readonly",
)  # fmt: skip


# Every name of a namespace after its prefix, one table for both sides: :class:`KeySpace` builds
# names from it in Python, and :func:`lua_key_functions` gives the scripts a function per name
# (``key_run(run_id)`` ...) built from the same templates.
KEY_TEMPLATES: dict[str, str] = {
    "active": "active",
    "finished": "finished",
    "nodes": "nodes",
    "lease_clock": "clock",
    "run": "run:{run_id}",
    "events": "ev:{run_id}",
    "relay": "out:{run_id}",
    "waiters": "wait:{run_id}",
    "session": "sess:{app_name}:{user_id}:{session_id}",
    "session_queue": "sessq:{app_name}:{user_id}:{session_id}",
    "node": "node:{node_id}",
    "node_runs": "node:{node_id}:runs",
    "node_pending": "node:{node_id}:pending",
    "node_queued": "node:{node_id}:queued",
    "channel": "chan:{node_id}",
    "children": "kids:{run_id}",
    "tombstones": "tombstones",
    "tombstone": "tomb:{tombstone_id}",
    "cancel_request": "creq:{request_id}",
    "recovering": "recovering",
}
_FIELD = re.compile(r"{(\w+)}")


@dataclass(frozen=True, slots=True)
class KeySpace:
    """Names of one namespace (see :data:`KEY_TEMPLATES`; the scripts build the same names)."""

    namespace: str
    prefix: str = field(init=False)  # cb:{<namespace>}: — the hash tag

    def __post_init__(self) -> None:
        validate_id(self.namespace, "namespace")
        object.__setattr__(self, "prefix", f"cb:{{{self.namespace}}}:")

    def name(self, kind: str, **ids: str) -> str:
        return self.prefix + KEY_TEMPLATES[kind].format_map(ids)

    def acl_rules(self) -> str:
        """The minimal Redis ACL rules for a user of this namespace only: its keys, its channels,
        the commands the library uses. ``ACL SETUSER <name> on ><password> <rules>``."""
        return acl_rules(self.namespace)

    @property
    def active(self) -> str:
        """Sorted set of active run ids (queued, running, waiting), scored by creation time."""
        return self.name("active")

    @property
    def finished(self) -> str:
        """Sorted set of finished run ids, scored by finish time; pruned after retention."""
        return self.name("finished")

    @property
    def nodes(self) -> str:
        """Sorted set of live node ids, scored by lease expiry on the lease clock."""
        return self.name("nodes")

    @property
    def lease_clock(self) -> str:
        """Hash: the lease clock (``last`` heartbeat on the server clock, the clock's value ``at``
        it, the ``cap`` of one beat): lease time runs only while heartbeats reach Redis."""
        return self.name("lease_clock")

    @property
    def recovering(self) -> str:
        """String, for a lease after a node re-registered because Redis had lost its data:
        meanwhile an unknown run may be one its owner has not re-asserted yet."""
        return self.name("recovering")

    def run(self, run_id: str) -> str:
        return self.name("run", run_id=run_id)

    def events(self, run_id: str) -> str:
        """List of the run's lifecycle events after its start (JSON entries)."""
        return self.name("events", run_id=run_id)

    def relay(self, run_id: str) -> str:
        """Stream of what the run emits (output, app events), for followers on other nodes."""
        return self.name("relay", run_id=run_id)

    def waiters(self, run_id: str) -> str:
        """Set of node ids waiting for the run to finish."""
        return self.name("waiters", run_id=run_id)

    def session(self, app_name: str, user_id: str, session_id: str) -> str:
        """The active run id of a session key (ids cannot hold ':', so this is unambiguous)."""
        return self.name("session", app_name=app_name, user_id=user_id, session_id=session_id)

    def session_queue(self, app_name: str, user_id: str, session_id: str) -> str:
        """Sorted set of the runs queued behind the session's active run (strategy
        ``enqueue``), scored by arrival."""
        return self.name("session_queue", app_name=app_name, user_id=user_id, session_id=session_id)

    def node(self, node_id: str) -> str:
        return self.name("node", node_id=node_id)

    def node_runs(self, node_id: str) -> str:
        return self.name("node_runs", node_id=node_id)

    def node_pending(self, node_id: str) -> str:
        """Hash run id -> cancel mode of the cancels pending on the node's runs."""
        return self.name("node_pending", node_id=node_id)

    def node_queued(self, node_id: str) -> str:
        """Set of the queued runs waiting for their turn on the node (strategy ``enqueue``)."""
        return self.name("node_queued", node_id=node_id)

    def channel(self, node_id: str) -> str:
        """The node's own pub/sub channel: cancels for its runs, finishes it waits for."""
        return self.name("channel", node_id=node_id)

    def children(self, run_id: str) -> str:
        """Set of the runs started as children of the run (a cancel of it cancels them)."""
        return self.name("children", run_id=run_id)

    @property
    def tombstones(self) -> str:
        """Sorted set of live tombstones by expiry (server clock): selector cancels that also
        cancel matching runs started or queued later."""
        return self.name("tombstones")

    def cancel_request(self, request_id: str) -> str:
        """String, for a while: the run a cancel request reached ('-': none), so a call that
        redis-py repeats after its answer was lost answers for that run as it now stands."""
        return self.name("cancel_request", request_id=request_id)

    def tombstone(self, tombstone_id: str) -> str:
        """Hash: a tombstone's selector (JSON), its request (mode, reason, requested_by, cause)
        and its times."""
        return self.name("tombstone", tombstone_id=tombstone_id)


def lua_key_functions() -> str:
    """Lua: ``local function key_<kind>(<ids>) return P .. '<literal>' .. <id> ... end`` for
    every template, ``P`` being the namespace prefix the script reads off ``KEYS[1]``."""
    lines = []
    for kind, template in KEY_TEMPLATES.items():
        parts = _FIELD.split(template)  # literal, field, literal, field, ...
        pieces = ["P"]
        for i, part in enumerate(parts):
            if i % 2:
                pieces.append(part)
            elif part:
                pieces.append(f"'{part}'")
        args = ", ".join(parts[1::2])
        lines.append(f"local function key_{kind}({args}) return {' .. '.join(pieces)} end")
    return "\n".join(lines)


def new_node_id() -> str:
    """host-pid-random: unique among live nodes, readable in a node list."""
    host = "".join(c if c.isalnum() or c in "._-" else "-" for c in socket.gethostname())[:100]
    return f"{host or 'node'}-{os.getpid()}-{secrets.token_hex(3)}"


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
