"""The Lua scripts (``lua/*.lua``): every state transition of a run or a node is one of them,
atomic in Redis.

Each script is its file's flags line, then the names generated here from their one Python
definition (result codes ``C``, record fields ``R``/``N``/``T``, event types ``E``, message
fields ``F`` and kinds ``MSG``, the key functions ``key_<name>()``, the active statuses, the
strength of modes, the limits), then ``lua/prelude.lua`` (the shared helpers), then its body.
Keys a script derives from stored data (an owner's pending hash, a waiter's channel) are built
inside it from the namespace prefix it reads off ``KEYS[1]``; they share the hash tag, so on
Redis Cluster they live in the same slot (scripts declare only ``KEYS[1]``: the hash tag, not
KEYS, keeps a script on one slot — tested on a real cluster).

**A named protocol.** A script's body is one call, ``one(KEYS, A)``: ``A`` holds its arguments by
name (a JSON object); it answers a table of named fields, sent back as JSON. Every script runs in
batches of calls (``BATCH_HEAD``/``BATCH_TAIL``): ``ARGV[1]`` is the JSON list of calls, each
``[keys, args]``, run one after another inside the one atomic script; the answer is the list of
the calls' JSON answers. A call's notices (messages a signed bus must seal before they are
sent: ``pub == ''``) come back in its answer's ``notices``.

**Flags** (Redis 7): a script that declares them is refused as a whole when Redis is out of
memory (never half-run), unless it may run then. The work that keeps the lights on and frees
memory declares ``allow-oom`` (a lease renewed, a run's end, a cancel, a node leaving); new work
(a start, a queued run, relayed output) only ``#!lua``: refused until memory is back.

Every script is safe to run twice with the same arguments (a retried call after a lost reply):
the second call changes nothing and answers as if it were the first where that matters. Stored
timestamps are seconds on the server clock as strings with microseconds (``"%d.%06d"``).

Leases are not judged by the server clock but by the **lease clock** (``clock`` hash): it runs
only while heartbeats reach Redis. Each heartbeat advances it by the time since the previous
heartbeat of the namespace, but by at most the step that heartbeat declares (a fifth of the
lease: two beats), so a stall, a pause or a failover that no heartbeat got through counts for
one step at most (DESIGN.md §9).
"""

from __future__ import annotations

from enum import StrEnum
from importlib import resources

from ._keys import lua_key_functions
from ._messages import RUN_TARGET_PREFIX, SESSION_TARGET_PREFIX, Field, MessageKind
from ._protocol import (
    ClockField,
    Code,
    EntryField,
    EventType,
    NodeField,
    NodeState,
    RunField,
    TombstoneField,
)
from ._types import ACTIVE_STATUSES, CancelMode

EVENTS_MAX = 1000
MAX_DESCENDANTS = 1000  # active runs of a tree one cancel reaches below its root
MAX_WALK = 10 * MAX_DESCENDANTS  # runs of a tree (ended ones too) one cancel looks at
MAX_TOMBSTONES = 1000  # live tombstones of a namespace
RELAY_MAX = 10000
NOTIFY_RUN_MAX_BYTES = 16384
REQUEST_MEMORY_MS = 120_000  # how long a cancel request remembers the run it reached

# The names the Lua side reads, each from its one Python definition.
TABLES: dict[str, type[StrEnum]] = {
    "C": Code,
    "R": RunField,
    "N": NodeField,
    "NS": NodeState,
    "CLOCK": ClockField,
    "ENTRY": EntryField,
    "T": TombstoneField,
    "E": EventType,
    "F": Field,
    "MSG": MessageKind,
}
CONSTANTS: dict[str, int] = {
    "EVENTS_MAX": EVENTS_MAX,
    "MAX_DESCENDANTS": MAX_DESCENDANTS,
    "MAX_WALK": MAX_WALK,
    "MAX_TOMBSTONES": MAX_TOMBSTONES,
    "RELAY_MAX": RELAY_MAX,
    "NOTIFY_RUN_MAX_BYTES": NOTIFY_RUN_MAX_BYTES,
    "REQUEST_MEMORY_MS": REQUEST_MEMORY_MS,
}
NAMES = (
    "register_node", "heartbeat", "reap", "leave_node", "start_run", "enqueue_run",
    "request_cancel", "finish_run", "sync_runs", "set_waiting", "add_waiter", "reassert_run",
    "select_runs", "add_tombstone", "remove_tombstone",
)  # fmt: skip

BATCH_HEAD = "local function one(KEYS, A)\nNOTICES = {}\n"
BATCH_TAIL = """
end
local answers = {}
for i, call in ipairs(cjson.decode(ARGV[1])) do
  local r = one(call[1], call[2])
  if #NOTICES > 0 then r.notices = NOTICES end
  answers[i] = cjson.encode(r)
end
return answers
"""


def _lua_table(entries: dict[str, object]) -> str:
    return "{" + ", ".join(f"{name} = {value}" for name, value in sorted(entries.items())) + "}"


def generated_names() -> str:
    """The Lua lines that define every shared name (see the module's docstring)."""
    lines = ["local P = string.match(KEYS[1], '^(cb:{[^}]*}:)')"]
    for table, names in TABLES.items():
        lines.append(f"local {table} = {_lua_table({n.name: repr(n.value) for n in names})}")
    lines += [f"local {name} = {value}" for name, value in CONSTANTS.items()]
    lines += [
        f"local ACTIVE = {_lua_table({status.value: 'true' for status in ACTIVE_STATUSES})}",
        f"local STRENGTH = {_lua_table({mode.value: mode.strength for mode in CancelMode})}",
        f"local SESSION_PREFIX = {SESSION_TARGET_PREFIX!r}",
        f"local RUN_PREFIX = {RUN_TARGET_PREFIX!r}",
        lua_key_functions(),
    ]
    return "\n".join(lines) + "\n"


def source(name: str) -> str:
    """The text of ``lua/<name>.lua``."""
    return resources.files(__package__).joinpath("lua", f"{name}.lua").read_text()


def _script(name: str) -> str:
    flags, body = source(name).split("\n", 1)
    if not flags.startswith("#!lua"):
        raise RuntimeError(f"lua/{name}.lua does not declare its flags on its first line")
    return f"{flags}\n{PRELUDE}{BATCH_HEAD}{body.strip()}{BATCH_TAIL}"


PRELUDE = generated_names() + source("prelude")
ALL_SCRIPTS = {name: _script(name) for name in NAMES}
