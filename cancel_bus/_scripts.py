"""The Lua scripts: every state transition of a run or a node is one of these, atomic in Redis.

Each script is the shared PRELUDE followed by its body. The prelude derives the namespace prefix
from KEYS[1] (every key of a namespace starts with ``cb:{namespace}:``, see ``_keys.py``), reads the
server clock once, and defines the helpers that keep indexes, events and notifications in step.
Its key functions (``key_run(run_id)``...), the active statuses, the strength of modes and the
session target prefix are generated from their one Python definition. Names that depend on
stored data (the owner's pending hash, a waiter's channel) are built inside the script; they
share the hash tag, so on Redis Cluster they live in the same slot as KEYS[1] (scripts declare
only KEYS[1]: the hash tag, not KEYS, keeps a script on one slot — tested on a real cluster).

Every script is safe to run twice with the same arguments (a retried call after a lost reply):
the second call changes nothing and answers as if it were the first where that matters.

Stored timestamps are seconds on the server clock as strings with microseconds (``"%d.%06d"``).

Leases are not judged by the server clock but by the **lease clock** (``clock`` hash): it runs
only while heartbeats reach Redis. Each heartbeat advances it by the time since the previous
heartbeat of the namespace, but by at most one heartbeat interval, so a stall, a pause or a
failover that no heartbeat got through counts for one interval at most (DESIGN.md §9).

Each script below is written as one call (its KEYS/ARGV header) and runs in batches of calls
(``BATCH_HEAD``/``BATCH_TAIL``): the calls of concurrent runs share one round trip.

Scripts that notify other nodes take a ``pub`` argument: ``PUBLISH``/``SPUBLISH`` publishes the
notices from the script; ``''`` (signed buses) returns them instead, for the caller to sign and
publish: a signature must cover who a message is for, which only the script finds out. Such
scripts answer ``{notices, reply}``.
"""

from __future__ import annotations

from ._keys import lua_key_functions
from ._messages import RUN_TARGET_PREFIX, SESSION_TARGET_PREFIX, Field, MessageKind
from ._types import ACTIVE_STATUSES, CancelMode

EVENTS_MAX = 1000
MAX_DESCENDANTS = 1000  # active runs of a tree one cancel reaches below its root
MAX_WALK = 10 * MAX_DESCENDANTS  # runs of a tree (ended ones too) one cancel looks at
MAX_TOMBSTONES = 1000  # live tombstones of a namespace
RELAY_MAX = 10000
NOTIFY_RUN_MAX_BYTES = 16384
REQUEST_MEMORY_MS = 120_000  # how long a cancel request remembers the run it reached

_PRELUDE_TEMPLATE = """
local P = string.match(KEYS[1], '^(cb:{[^}]*}:)')
local T = redis.call('TIME')
local NOW_S = tonumber(T[1]) + tonumber(T[2]) / 1000000
local NOW = string.format('%d.%06d', tonumber(T[1]), tonumber(T[2]))
local ACTIVE = __ACTIVE__
local STRENGTH = __STRENGTH__
local SESSION_PREFIX = '__SESSION_PREFIX__'
local RUN_PREFIX = '__RUN_PREFIX__'
local F = __FIELDS__
local MSG = __KINDS__
__KEY_FUNCTIONS__
local NOTICES = {}
local function reply(r) return {NOTICES, r} end  -- the answer of a script that may notify

local function fmt(seconds) return string.format('%.6f', seconds) end
local function meta_or_nil(value) if value == '' then return nil end return value end

-- Now on the lease clock: its value at the last heartbeat, plus the time since, capped at the
-- interval that heartbeat declared. Without a clock yet, the server clock.
local LEASE_NOW = nil
local function lease_clock(cap)
  local c = redis.call('HMGET', key_lease_clock(), 'last', 'at', 'cap')
  if not c[1] then return NOW_S end
  return tonumber(c[2]) + math.min(math.max(NOW_S - tonumber(c[1]), 0), cap or tonumber(c[3]))
end
local function lease_now()
  if LEASE_NOW == nil then LEASE_NOW = lease_clock(nil) end
  return LEASE_NOW
end

-- A heartbeat reached Redis: advance the lease clock (by at most `cap`, the caller's interval).
local function tick_lease_clock(cap)
  LEASE_NOW = lease_clock(cap)
  redis.call('HSET', key_lease_clock(), 'last', fmt(NOW_S), 'at', fmt(LEASE_NOW), 'cap', fmt(cap))
end

-- Sends a message to a node's channel, or keeps it for the caller to sign and send (pub == '').
local function notify(pub, node_id, msg)
  if pub == '' then
    table.insert(NOTICES, {node_id, cjson.encode(msg)})
    return -1
  end
  return redis.call(pub, key_channel(node_id), cjson.encode(msg))
end

local function hash_to_table(flat)
  local t = {}
  for i = 1, #flat, 2 do t[flat[i]] = flat[i + 1] end
  return t
end

-- The lifecycle log: a list of small JSON entries (a one-entry stream would cost some 4 KB, the
-- list 260 B). Queued and started are not logged: the record's created_at, started_at and owner
-- tell them, so a run that just runs costs no log at all.
local function add_event(run_id, etype, data)
  local key = key_events(run_id)
  local n = redis.call('RPUSH', key, cjson.encode({type = etype, at = NOW, data = data}))
  if n > __EVENTS_MAX__ then redis.call('LTRIM', key, -__EVENTS_MAX__, -1) end
end

local function relay_add(run_id, etype, at, data_json)
  redis.call('XADD', key_relay(run_id), 'MAXLEN', '~', __RELAY_MAX__, '*',
    'type', etype, 'at', at, 'data', data_json)
end

-- Notes on a run (what its owner observed of its code), JSON fields of its record:
-- leaked_after_cancel {count, calls {call: n}, first_call, first_site, first_at} — what the
-- code did through the library after its end (the node sends what is new: counts add up);
-- slowest_checkpoints {site: ms} (the node sends the whole map). A first leak is an event.
local function note_leak(run_id, delta)
  local rk = key_run(run_id)
  local raw = redis.call('HGET', rk, 'leaked_after_cancel')
  local leak = raw and cjson.decode(raw) or {count = 0, calls = {}}
  if not raw then
    leak.first_call, leak.first_site, leak.first_at =
      delta.first_call, delta.first_site, delta.first_at
    add_event(run_id, 'run.leaked', {call = delta.first_call, site = delta.first_site})
  end
  for call, n in pairs(delta.calls) do
    leak.calls[call] = (leak.calls[call] or 0) + n
    leak.count = leak.count + n
  end
  redis.call('HSET', rk, 'leaked_after_cancel', cjson.encode(leak))
end

local function write_notes(run_id, notes_json)
  if notes_json == '' then return end
  local notes = cjson.decode(notes_json)
  if notes.leaked_after_cancel then note_leak(run_id, notes.leaked_after_cancel) end
  if notes.slowest_checkpoints then
    redis.call('HSET', key_run(run_id), 'slowest_checkpoints',
      cjson.encode(notes.slowest_checkpoints))
  end
end

-- 'alive' if node_id holds a live lease (as incarnation `epoch`, unless epoch is nil), 'missing'
-- if Redis has no record of the node (it lost our data), else 'dead'. A lease found expired
-- fences the node on the spot: it is marked dead, whoever looks first.
local function node_state(node_id, epoch)
  if not node_id then return 'missing' end
  local nk = key_node(node_id)
  local st = redis.call('HMGET', nk, 'state', 'epoch')
  if not st[1] then return 'missing' end
  if st[1] ~= 'alive' or (epoch ~= nil and st[2] ~= epoch) then return 'dead' end
  local exp = redis.call('ZSCORE', key_nodes(), node_id)
  if (not exp) or tonumber(exp) <= lease_now() then
    redis.call('HSET', nk, 'state', 'dead')
    redis.call('HSETNX', nk, 'died_at', NOW)
    return 'dead'
  end
  return 'alive'
end

local function node_alive(node_id, epoch) return node_state(node_id, epoch) == 'alive' end

-- The run id holding the session key, if that run is still active.
local function session_holder(app, user, sess)
  local holder = redis.call('GET', key_session(app, user, sess))
  if not holder then return nil end
  local st = redis.call('HGET', key_run(holder), 'status')
  if st and ACTIVE[st] then return holder end
  return nil
end

-- Ends an active run: terminal state, out of every active index, expiry scheduled, waiters rung.
local function finalize(run_id, status, end_reason, fields, retention_ms, pub)
  local rk = key_run(run_id)
  local info = redis.call('HMGET', rk, 'owner', 'app_name', 'user_id', 'session_id', 'relay')
  redis.call('HSET', rk, 'status', status, 'finished_at', NOW, 'end_reason', end_reason,
    unpack(fields))
  if info[1] then
    redis.call('SREM', key_node_runs(info[1]), run_id)
    redis.call('HDEL', key_node_pending(info[1]), run_id)
  end
  if info[2] then
    local sk = key_session(info[2], info[3], info[4])
    if redis.call('GET', sk) == run_id then redis.call('DEL', sk) end
  end
  redis.call('ZREM', key_active(), run_id)
  redis.call('ZADD', key_finished(), NOW, run_id)
  redis.call('ZREMRANGEBYSCORE', key_finished(), '-inf', fmt(NOW_S - retention_ms / 1000))
  local ended = {status = status, end_reason = end_reason}
  add_event(run_id, 'run.finished', ended)
  if info[5] == '1' then relay_add(run_id, 'run.finished', NOW, cjson.encode(ended)) end
  redis.call('PEXPIRE', rk, retention_ms)
  redis.call('PEXPIRE', key_events(run_id), retention_ms)
  redis.call('PEXPIRE', key_relay(run_id), retention_ms)
  redis.call('PEXPIRE', key_children(run_id), retention_ms)
  local wk = key_waiters(run_id)
  local waiters = redis.call('SMEMBERS', wk)
  if #waiters > 0 then
    local msg = {[F.KIND] = MSG.FINISHED, [F.RUN] = run_id, [F.STATUS] = status}
    if redis.call('HSTRLEN', rk, 'output') <= __NOTIFY_RUN_MAX_BYTES__ then
      msg[F.RECORD] = hash_to_table(redis.call('HGETALL', rk))
    end
    for _, w in ipairs(waiters) do
      msg[F.TO] = w
      notify(pub, w, msg)
    end
    redis.call('DEL', wk)
  end
end

-- Resolves an active run whose owner is gone: cancelled if a cancel was pending, else failed.
local function resolve_owner_lost(run_id, retention_ms, pub)
  local st = redis.call('HMGET', key_run(run_id), 'status', 'cancel_requested_at', 'owner')
  if not (st[1] == 'running' or st[1] == 'waiting') then return false end
  local status = 'failed'
  if st[2] then status = 'cancelled' end
  finalize(run_id, status, 'owner_lost',
    {'error', 'owner_lost: node ' .. tostring(st[3]) .. ' lost its lease'}, retention_ms, pub)
  return true
end

-- Records a cancel of one run and tells its owner (first request wins, a stronger mode
-- escalates; queued or waiting: cancelled at once; owner gone: resolved owner_lost); the message
-- is bound to the owner (node and epoch) and to the run. -> {code, run fields, receivers}
local function cancel_one(run_id, target, mode, reason, by, cause, waiter, caller, retention_ms,
    pub)
  local rk = key_run(run_id)
  local cur = redis.call('HMGET', rk, 'status', 'owner', 'cancel_requested_at', 'cancel_mode',
    'epoch')
  local st = cur[1]
  if not st then return {'not_found', {}, -1} end
  if not ACTIVE[st] then return {'already_finished', redis.call('HGETALL', rk), -1} end
  if not cur[3] then
    local fields = {'cancel_requested_at', NOW, 'cancel_mode', mode, 'cancel_cause', cause}
    if reason ~= '' then table.insert(fields, 'cancel_reason'); table.insert(fields, reason) end
    if by ~= '' then table.insert(fields, 'requested_by'); table.insert(fields, by) end
    redis.call('HSET', rk, unpack(fields))
    add_event(run_id, 'run.cancel_requested',
      {mode = mode, cause = cause, reason = meta_or_nil(reason), requested_by = meta_or_nil(by)})
  elseif STRENGTH[mode] > STRENGTH[cur[4]] then
    redis.call('HSET', rk, 'cancel_mode', mode)
    add_event(run_id, 'run.cancel_escalated',
      {from = cur[4], to = mode, requested_by = meta_or_nil(by)})
  end
  local meta = redis.call('HMGET', rk, 'cancel_mode', 'cancel_requested_at', 'cancel_reason',
    'requested_by', 'cancel_cause')
  local owner = cur[2]
  local message = {[F.KIND] = MSG.CANCEL, [F.RUN] = run_id, [F.TARGET] = target,
    [F.MODE] = mode, [F.RUN_MODE] = meta[1], [F.AT] = meta[2], [F.REASON] = meta[3] or nil,
    [F.BY] = meta[4] or nil, [F.CAUSE] = meta[5] or nil, [F.TO] = owner, [F.EPOCH] = cur[5]}
  if st ~= 'running' then
    if owner and owner ~= caller then notify(pub, owner, message) end
    finalize(run_id, 'cancelled', 'cancelled', {}, retention_ms, pub)
    return {'cancelled', redis.call('HGETALL', rk), -1}
  end
  if not node_alive(owner, nil) then
    resolve_owner_lost(run_id, retention_ms, pub)
    return {'owner_lost', redis.call('HGETALL', rk), -1}
  end
  redis.call('HSET', key_node_pending(owner), run_id, meta[1])
  if waiter ~= '' then redis.call('SADD', key_waiters(run_id), waiter) end
  local receivers = -1
  if owner ~= caller then receivers = notify(pub, owner, message) end
  return {'stopping', redis.call('HGETALL', rk), receivers}
end

-- A run as a repeated cancel request answers for it: {code, fields, -1}: stopping while it is
-- active (the first run of the request recorded it), else how it ended.
local function standing(run_id)
  local fields = redis.call('HGETALL', key_run(run_id))
  local cur = redis.call('HMGET', key_run(run_id), 'status', 'end_reason')
  if not cur[1] then return {'not_found', {}, -1} end
  if ACTIVE[cur[1]] then return {'stopping', fields, -1} end
  if cur[2] == 'owner_lost' then return {'owner_lost', fields, -1} end
  if cur[1] == 'cancelled' then return {'cancelled', fields, -1} end
  return {'already_finished', fields, -1}
end

-- The runs started below `run_id` (children, their children...): every active one, deepest
-- first (at most __MAX_DESCENDANTS__), then the ended ones while the list has room. The walk goes
-- through ended runs (their children may still run) and visits at most __MAX_WALK__ runs.
-- -> the list, and 1 if runs were left out of it (active ones beyond the cap, or the walk's end)
local function descendants(run_id)
  local levels, ended, frontier, seen = {}, {}, {run_id}, {[run_id] = true}
  local visited, active, cut = 0, 0, 0
  while #frontier > 0 and cut == 0 do
    local level, next_frontier = {}, {}
    for _, id in ipairs(frontier) do
      for _, kid in ipairs(redis.call('SMEMBERS', key_children(id))) do
        if not seen[kid] and cut == 0 then
          seen[kid] = true
          visited = visited + 1
          if visited > __MAX_WALK__ then cut = 1 end
          local st = cut == 0 and redis.call('HGET', key_run(kid), 'status')
          if st then
            table.insert(next_frontier, kid)
            if not ACTIVE[st] then
              table.insert(ended, kid)
            elseif active < __MAX_DESCENDANTS__ then
              active = active + 1
              table.insert(level, kid)
            else
              cut = 1
            end
          end
        end
      end
    end
    table.insert(levels, level)
    frontier = next_frontier
  end
  local listed = {}
  for i = #levels, 1, -1 do
    for _, id in ipairs(levels[i]) do table.insert(listed, id) end
  end
  for _, id in ipairs(ended) do
    if #listed >= __MAX_DESCENDANTS__ then break end
    table.insert(listed, id)
  end
  return listed, cut
end

-- Whether a run (a table of its fields) matches a selector: each field the selector names is
-- equal (node_id: its owner), its metadata holds the selector's (scalar values), and it started
-- before `started_before` (server clock) if given. Python's Selector is the other side.
local function selector_matches(sel, r)
  for _, k in ipairs({'run_id', 'app_name', 'user_id', 'session_id'}) do
    if sel[k] ~= nil and sel[k] ~= r[k] then return false end
  end
  if sel.node_id ~= nil and sel.node_id ~= r.owner then return false end
  if sel.started_before ~= nil then
    local started = tonumber(r.started_at or r.created_at or NOW)  -- a new run: now
    if started >= sel.started_before then return false end
  end
  if sel.metadata ~= nil then
    if not r.metadata then return false end
    local md = cjson.decode(r.metadata)
    for k, v in pairs(sel.metadata) do
      if md[k] ~= v then return false end
    end
  end
  return true
end

-- The request a new run inherits if it must never start: its parent's accepted cancel (cause
-- 'parent'), or that of a live tombstone it matches; nil if it may start.
local function inherited_cancel(r)
  if r.parent then
    local p = redis.call('HMGET', key_run(r.parent), 'cancel_requested_at', 'cancel_mode',
      'cancel_reason', 'requested_by')
    if p[1] then return {mode = p[2], reason = p[3], by = p[4], cause = 'parent'} end
  end
  redis.call('ZREMRANGEBYSCORE', key_tombstones(), '-inf', fmt(NOW_S))
  for _, id in ipairs(redis.call('ZRANGE', key_tombstones(), 0, __MAX_TOMBSTONES__ - 1)) do
    local t = redis.call('HMGET', key_tombstone(id), 'selector', 'mode', 'reason',
      'requested_by', 'cause')
    if t[1] and selector_matches(cjson.decode(t[1]), r) then
      return {mode = t[2], reason = t[3], by = t[4], cause = t[5], tombstone = id}
    end
  end
  return nil
end

-- A new run that must never start (see inherited_cancel): recorded, cancelled at once.
local function born_cancelled(rk, r, req, retention_ms)
  for k, v in pairs(r) do redis.call('HSET', rk, k, v) end
  redis.call('HSET', rk, 'status', 'queued', 'created_at', NOW, 'cancel_requested_at', NOW,
    'cancel_mode', req.mode, 'cancel_cause', req.cause)
  if req.reason then redis.call('HSET', rk, 'cancel_reason', req.reason) end
  if req.by then redis.call('HSET', rk, 'requested_by', req.by) end
  add_event(r.run_id, 'run.cancel_requested', {mode = req.mode, cause = req.cause,
    reason = req.reason or nil, requested_by = req.by or nil, tombstone = req.tombstone})
  finalize(r.run_id, 'cancelled', 'cancelled', {}, retention_ms, '')
  return redis.call('HGETALL', rk)
end

-- Resolves up to `budget` runs of a node that is gone; once none is left, forgets the node.
-- Returns runs resolved, and whether the node is now fully reaped.
local function reap_node(node_id, budget, retention_ms, pub, final_state)
  local nk = key_node(node_id)
  local runs_key = key_node_runs(node_id)
  local resolved = 0
  if budget > 0 then
    for _, id in ipairs(redis.call('SPOP', runs_key, budget)) do
      if resolve_owner_lost(id, retention_ms, pub) then resolved = resolved + 1 end
    end
  end
  if redis.call('SCARD', runs_key) > 0 then return resolved, false end
  redis.call('ZREM', key_nodes(), node_id)
  redis.call('DEL', key_node_pending(node_id))
  if redis.call('EXISTS', nk) == 1 then
    redis.call('HSET', nk, 'state', final_state)
    redis.call('HSETNX', nk, 'died_at', NOW)
    redis.call('PEXPIRE', nk, 2 * retention_ms)
  end
  return resolved, true
end
"""


def _lua_table(entries: dict[str, object]) -> str:
    return "{" + ", ".join(f"{name} = {value}" for name, value in sorted(entries.items())) + "}"


def _fill(template: str) -> str:
    """The template with the constants it names put in."""
    return (
        template.replace("__EVENTS_MAX__", str(EVENTS_MAX))
        .replace("__RELAY_MAX__", str(RELAY_MAX))
        .replace("__NOTIFY_RUN_MAX_BYTES__", str(NOTIFY_RUN_MAX_BYTES))
        .replace("__ACTIVE__", _lua_table({status.value: "true" for status in ACTIVE_STATUSES}))
        .replace("__STRENGTH__", _lua_table({mode.value: mode.strength for mode in CancelMode}))
        .replace("__SESSION_PREFIX__", SESSION_TARGET_PREFIX)
        .replace("__RUN_PREFIX__", RUN_TARGET_PREFIX)
        .replace("__MAX_DESCENDANTS__", str(MAX_DESCENDANTS))
        .replace("__MAX_WALK__", str(MAX_WALK))
        .replace("__MAX_TOMBSTONES__", str(MAX_TOMBSTONES))
        .replace("__REQUEST_MEMORY_MS__", str(REQUEST_MEMORY_MS))
        .replace("__FIELDS__", _lua_table({f.name: f"'{f.value}'" for f in Field}))
        .replace("__KINDS__", _lua_table({k.name: f"'{k.value}'" for k in MessageKind}))
        .replace("__KEY_FUNCTIONS__", lua_key_functions())
    )


PRELUDE = _fill(_PRELUDE_TEMPLATE)


# Every script runs in batches: ARGV[1] is a JSON list of calls, each [keys, args]; the body
# below each header is one call, a function of its own KEYS and ARGV (and it reads them only at
# its top); the answer is the list of the calls' answers, in order. One batch is one atomic
# script: its calls run one after another, nothing between them (see _batcher.py).
BATCH_HEAD = "local function one(KEYS, ARGV)\nNOTICES = {}\n"
BATCH_TAIL = """
end
local answers = {}
for i, call in ipairs(cjson.decode(ARGV[1])) do answers[i] = one(call[1], call[2]) end
return answers
"""


# Script flags (Redis 7): a script that declares them is refused as a whole when Redis is out of
# memory (never half-run: an unflagged one fails at its first write that needs memory), unless it
# may run then. Work that keeps the lights on and frees memory runs out of memory too — a lease
# renewed, a run's end, a cancel, a node leaving; new work (a start, a queued run, relayed
# output) is refused until memory is back.
ALLOW_OOM = "#!lua flags=allow-oom\n"
DENY_OOM = "#!lua\n"
READ_ONLY = "#!lua flags=no-writes\n"


def _script(body: str, flags: str = ALLOW_OOM) -> str:
    return flags + PRELUDE + BATCH_HEAD + _fill(body).strip("\n") + BATCH_TAIL


# KEYS[1] nodes zset, KEYS[2] node hash
# ARGV[1] node_id, ARGV[2] lease_ms, ARGV[3] version, ARGV[4] retention_ms, ARGV[5] pub command,
# ARGV[6] interval_ms (the caller's heartbeat interval: the most one beat advances the lease
# clock), ARGV[7] epoch (the incarnation's fencing token: random, chosen by the node),
# ARGV[8] restore ('1': the node takes back the incarnation Redis forgot, e.g. after a restart
# without persistence; refused if Redis still knows the node)
# -> {notices, {'ok', now} | {'in_use', now} | {'busy', now} (an expired incarnation of the same id
#    still has runs to resolve; call again) | {'fenced', now} (restore refused)}
REGISTER_NODE = _script("""
local nodes, node_key = KEYS[1], KEYS[2]
local node_id, lease_ms, version = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local retention_ms, pub, interval_ms = tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6])
local epoch, restore = ARGV[7], ARGV[8]
tick_lease_clock(interval_ms / 1000)
local forgotten = redis.call('EXISTS', node_key) == 0
if (not forgotten) and node_alive(node_id, epoch) then return reply({'ok', NOW}) end  -- retried
if restore == '1' and not forgotten then return reply({'fenced', NOW}) end
if (not forgotten) and node_alive(node_id, nil) then return reply({'in_use', NOW}) end
local _, done = reap_node(node_id, 500, retention_ms, pub, 'dead')
if not done then return reply({'busy', NOW}) end
if restore == '1' then  -- Redis lost our data: others' runs may be unknown for a while
  redis.call('SET', key_recovering(), NOW, 'PX', lease_ms)
end
redis.call('DEL', node_key)
redis.call('HSET', node_key, 'node_id', node_id, 'state', 'alive', 'epoch', epoch,
  'started_at', NOW, 'last_heartbeat', NOW, 'lease_expires_at', fmt(NOW_S + lease_ms / 1000),
  'version', version)
redis.call('ZADD', nodes, fmt(lease_now() + lease_ms / 1000), node_id)
return reply({'ok', NOW})
""")

# KEYS[1] nodes zset, KEYS[2] node hash
# ARGV[1] node_id, ARGV[2] epoch, ARGV[3] lease_ms, ARGV[4] interval_ms (the caller's heartbeat
# interval: the most this beat advances the lease clock), ARGV[5] probe_at, ARGV[6] probe_s
# (when its last probe of its own channel came back, and how long it took; '': none yet)
# -> {'ok', now, runs recorded for the node} | {'fenced', now} | {'missing', now}
#    (missing: Redis forgot the node, e.g. a restart without persistence; re-register and re-assert)
HEARTBEAT = _script("""
local nodes, node_key = KEYS[1], KEYS[2]
local node_id, epoch, lease_ms = ARGV[1], ARGV[2], tonumber(ARGV[3])
local interval_ms, probe_at, probe_s = tonumber(ARGV[4]), ARGV[5], ARGV[6]
tick_lease_clock(interval_ms / 1000)
if redis.call('EXISTS', node_key) == 0 then return {'missing', NOW} end
if not node_alive(node_id, epoch) then return {'fenced', NOW} end
redis.call('ZADD', nodes, fmt(lease_now() + lease_ms / 1000), node_id)
redis.call('HSET', node_key, 'last_heartbeat', NOW,
  'lease_expires_at', fmt(NOW_S + lease_ms / 1000))
if probe_at ~= '' then redis.call('HSET', node_key, 'probe_at', probe_at, 'probe_s', probe_s) end
return {'ok', NOW, redis.call('SCARD', key_node_runs(node_id))}
""")

# KEYS[1] nodes zset
# ARGV[1] budget (runs), ARGV[2] retention_ms, ARGV[3] pub command
# Also prunes the finished index of what is older than the retention (it is pruned at every
# finish too, but a namespace where nothing finishes kept stale entries for good).
# -> {notices, {runs resolved, nodes reaped, more (1 if expired nodes remain)}}
REAP = _script("""
local nodes = KEYS[1]
local budget, retention_ms, pub = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
-- the finished index loses what expired with its records, even when nothing finishes
redis.call('ZREMRANGEBYSCORE', key_finished(), '-inf', fmt(NOW_S - retention_ms / 1000))
local expired = redis.call('ZRANGEBYSCORE', nodes, '-inf', fmt(lease_now()), 'LIMIT', 0, 16)
local resolved, reaped = 0, 0
for _, node_id in ipairs(expired) do
  node_alive(node_id, nil)
  local n, done = reap_node(node_id, budget - resolved, retention_ms, pub, 'dead')
  resolved = resolved + n
  if done then reaped = reaped + 1 end
  if resolved >= budget then break end
end
local more = 0
if #redis.call('ZRANGEBYSCORE', nodes, '-inf', fmt(lease_now()), 'LIMIT', 0, 1) > 0 then
  more = 1
end
return reply({resolved, reaped, more})
""")

# KEYS[1] node hash
# ARGV[1] node_id, ARGV[2] epoch, ARGV[3] retention_ms, ARGV[4] pub command
# Runs still recorded for the node are resolved as owner_lost (a closing bus cancels them first).
# -> {notices, {'ok', runs resolved, done (1/0: call again)} | {'fenced'}}
LEAVE_NODE = _script("""
local node_key = KEYS[1]
local node_id, epoch = ARGV[1], ARGV[2]
local retention_ms, pub = tonumber(ARGV[3]), ARGV[4]
if not node_alive(node_id, epoch) then return reply({'fenced'}) end
local resolved, done = reap_node(node_id, 500, retention_ms, pub, 'left')
if not done then return reply({'ok', resolved, 0}) end
redis.call('HSET', node_key, 'left_at', NOW)
return reply({'ok', resolved, 1})
""")

# KEYS[1] run hash
# ARGV[1] run_id, ARGV[2] node_id, ARGV[3] epoch, ARGV[4] app_name, ARGV[5] user_id,
# ARGV[6] session_id ('' x3: no session key), ARGV[7] metadata json or '', ARGV[8] relay (0/1),
# ARGV[9] parent run id or '', ARGV[10] retention_ms, ARGV[11] pub command
# A queued run of that id is claimed — with a session key, only if it is the run's own; otherwise
# the id must be new (ids are never reused), or this very start retried (same owner, session).
# A run whose parent has an accepted cancel, or that a live tombstone matches, never starts: it
# is recorded cancelled at once (so is a queued one being claimed).
# -> {notices, {'ok', run fields} | {'fenced'} | {'missing'} (Redis forgot the node: retry after
#    it re-registers) | {'exists', run fields} | {'session_busy', run_id}
#    | {'cancelled', run fields} (it must not start)}
START_RUN = _script(
    """
local rk = KEYS[1]
local run_id, node_id, epoch = ARGV[1], ARGV[2], ARGV[3]
local app, user, sess, metadata, relay = ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8]
local parent, retention_ms, pub = ARGV[9], tonumber(ARGV[10]), ARGV[11]
local ns = node_state(node_id, epoch)
if ns ~= 'alive' then return reply({ns == 'missing' and 'missing' or 'fenced'}) end
local cur = redis.call('HMGET', rk, 'status', 'owner', 'epoch', 'app_name', 'user_id',
  'session_id')
local own_session = app == '' or (cur[4] == app and cur[5] == user and cur[6] == sess)
if cur[1] == 'queued' and own_session then
  local queued = hash_to_table(redis.call('HGETALL', rk))
  queued.owner = node_id
  local req = inherited_cancel(queued)
  if req then
    cancel_one(run_id, RUN_PREFIX .. run_id, req.mode, req.reason or '', req.by or '', req.cause,
      '', node_id, retention_ms, pub)
    return reply({'cancelled', redis.call('HGETALL', rk)})
  end
  redis.call('HSET', rk, 'status', 'running', 'owner', node_id, 'epoch', epoch,
    'started_at', NOW)
  if relay == '1' then redis.call('HSET', rk, 'relay', '1') end
  redis.call('SADD', key_node_runs(node_id), run_id)
  return reply({'ok', redis.call('HGETALL', rk)})
end
if cur[1] == 'running' and cur[2] == node_id and cur[3] == epoch and own_session then
  return reply({'ok', redis.call('HGETALL', rk)})  -- a retried call
end
if cur[1] then return reply({'exists', redis.call('HGETALL', rk)}) end
local r = {run_id = run_id, owner = node_id}
if app ~= '' then r.app_name, r.user_id, r.session_id = app, user, sess end
if metadata ~= '' then r.metadata = metadata end
if parent ~= '' then
  r.parent = parent
  local pst = redis.call('HGET', key_run(parent), 'status')
  if pst and not ACTIVE[pst] then  -- its code started a child after its end
    note_leak(parent, {calls = {child_started = 1}, first_call = 'child_started',
      first_site = RUN_PREFIX .. run_id, first_at = NOW})
  end
end
local req = inherited_cancel(r)
if req then
  r.owner = nil  -- it never ran
  if parent ~= '' then redis.call('SADD', key_children(parent), run_id) end
  return reply({'cancelled', born_cancelled(rk, r, req, retention_ms)})
end
if app ~= '' then
  local holder = session_holder(app, user, sess)
  if holder and holder ~= run_id then return reply({'session_busy', holder}) end
  redis.call('SET', key_session(app, user, sess), run_id)
end
if parent ~= '' then redis.call('SADD', key_children(parent), run_id) end
for k, v in pairs(r) do redis.call('HSET', rk, k, v) end
redis.call('HSET', rk, 'status', 'running', 'epoch', epoch, 'created_at', NOW, 'started_at', NOW)
if relay == '1' then redis.call('HSET', rk, 'relay', '1') end
redis.call('ZADD', key_active(), NOW, run_id)
redis.call('SADD', key_node_runs(node_id), run_id)
return reply({'ok', redis.call('HGETALL', rk)})
""",
    DENY_OOM,
)

# KEYS[1] run hash
# ARGV[1] run_id, ARGV[2] app_name, ARGV[3] user_id, ARGV[4] session_id ('' x3: none),
# ARGV[5] metadata json or '', ARGV[6] parent run id or '', ARGV[7] retention_ms, ARGV[8] request
# id (unique per call, kept in the record: a call redis-py repeats because its answer was lost
# answers with the run it queued, as it now stands)
# A run whose parent has an accepted cancel, or that a live tombstone matches, is recorded
# cancelled at once: it never starts.
# -> {'ok', run fields} | {'exists', status} | {'session_busy', run_id} | {'cancelled', fields}
ENQUEUE_RUN = _script(
    """
local rk = KEYS[1]
local run_id, app, user, sess, metadata = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local parent, retention_ms, request = ARGV[6], tonumber(ARGV[7]), ARGV[8]
local st = redis.call('HGET', rk, 'status')
if st then
  if redis.call('HGET', rk, 'enqueue_request') == request then  -- this very call, sent again
    return {'ok', redis.call('HGETALL', rk)}
  end
  return {'exists', st}
end
local r = {run_id = run_id, enqueue_request = request}
if app ~= '' then r.app_name, r.user_id, r.session_id = app, user, sess end
if metadata ~= '' then r.metadata = metadata end
if parent ~= '' then r.parent = parent end
local req = inherited_cancel(r)
if req then
  if parent ~= '' then redis.call('SADD', key_children(parent), run_id) end
  return {'cancelled', born_cancelled(rk, r, req, retention_ms)}
end
if app ~= '' then
  local holder = session_holder(app, user, sess)
  if holder and holder ~= run_id then return {'session_busy', holder} end
  redis.call('SET', key_session(app, user, sess), run_id)
end
if parent ~= '' then redis.call('SADD', key_children(parent), run_id) end
for k, v in pairs(r) do redis.call('HSET', rk, k, v) end
redis.call('HSET', rk, 'status', 'queued', 'created_at', NOW)
redis.call('ZADD', key_active(), NOW, run_id)
return {'ok', redis.call('HGETALL', rk)}
""",
    DENY_OOM,
)

# KEYS[1] run hash, or the session key when ARGV[1] starts with 'session:'
# ARGV[1] target ('run:<id>' or 'session:<app>:<user>:<session>'), ARGV[2] run_id ('' for session),
# ARGV[3] mode, ARGV[4] reason, ARGV[5] requested_by, ARGV[6] waiter node ('' = no wait),
# ARGV[7] caller node, ARGV[8] retention_ms, ARGV[9] pub command, ARGV[10] cause (who asked:
# user | client_disconnect | node_shutdown | parent), ARGV[11] tree ('1': its descendants too),
# ARGV[12] request id (unique per call; a call redis-py repeats because its answer was lost
# finds the run its first run reached and answers for it — and its tree — as they now stand:
# stopping while active, else how it ended)
# The target's run, and with `tree` every run started below it (cause 'parent'), deepest first:
# each as cancel_one does it. The owner is told on its channel, in a message bound to it (its
# node id and epoch) and to the run — not when the caller is the owner: it sets the token itself.
# -> {notices, {'not_found'} | {'recovering'} (not found, but Redis lost data lately: ask again)
#    | {code, fields, receivers (-1: not published here),
#    {{run_id, code, fields, receivers}, ...} (the descendants), 1 if descendants were left out}},
#    code: already_finished | cancelled | owner_lost | stopping
REQUEST_CANCEL = _script("""
local target_key = KEYS[1]
local target, run_id, mode, reason, by = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local waiter, caller = ARGV[6], ARGV[7]
local retention_ms, pub, cause, tree = tonumber(ARGV[8]), ARGV[9], ARGV[10], ARGV[11]
local request_key = key_cancel_request(ARGV[12])
local reached = redis.call('GET', request_key)
if reached then  -- this very call ran before: its answer was lost, redis-py sent it again
  if reached == '-' then return reply({'not_found'}) end
  local below, cut = {}, 0
  if tree == '1' then
    local kids
    kids, cut = descendants(reached)
    for _, kid in ipairs(kids) do
      local a = standing(kid)
      table.insert(below, {kid, a[1], a[2], a[3]})
    end
  end
  local a = standing(reached)
  return reply({a[1], a[2], a[3], below, cut})
end
local function remember(id)
  redis.call('SET', request_key, id, 'PX', math.min(__REQUEST_MEMORY_MS__, retention_ms))
end
local function not_found()
  -- Redis lost the namespace's data lately (the caller's own record is gone, or a node
  -- re-registered after a loss less than a lease ago): the run may be one its owner has not
  -- re-asserted yet, so the caller asks again rather than be told it does not exist
  if redis.call('EXISTS', key_node(caller)) == 0 or redis.call('EXISTS', key_recovering()) == 1
  then
    return reply({'recovering'})
  end
  remember('-')
  return reply({'not_found'})
end
local by_session = string.sub(target, 1, #SESSION_PREFIX) == SESSION_PREFIX
if by_session then
  run_id = redis.call('GET', target_key)
  if not run_id then return not_found() end
end
local st = redis.call('HGET', key_run(run_id), 'status')
if (not st) or (by_session and not ACTIVE[st]) then  -- a session has no *active* run
  return not_found()
end
remember(run_id)
local below, cut = {}, 0
if tree == '1' then
  local kids
  kids, cut = descendants(run_id)
  for _, kid in ipairs(kids) do
    local a = cancel_one(kid, RUN_PREFIX .. kid, mode, reason, by, 'parent', waiter, caller,
      retention_ms, pub)
    table.insert(below, {kid, a[1], a[2], a[3]})
  end
end
local a = cancel_one(run_id, target, mode, reason, by, cause, waiter, caller, retention_ms, pub)
return reply({a[1], a[2], a[3], below, cut})
""")

# KEYS[1] run hash
# ARGV[1] run_id, ARGV[2] node_id, ARGV[3] epoch, ARGV[4] status (how the code ended: succeeded,
# failed, or cancelled: it stopped for a cancel), ARGV[5] stop cause ('' or why its node stopped
# it without a request: node_shutdown | lease_lost | redis_unreachable), ARGV[6] output,
# ARGV[7] output_truncated (0/1), ARGV[8] error, ARGV[9] phase, ARGV[10] delivered_at,
# ARGV[11] observed_at (node estimates of the server clock, or ''), ARGV[12] retention_ms,
# ARGV[13] pub command, ARGV[14] the run as the owner knows it (json) to re-create a record Redis
# lost, or '' (the usual case: if the record is lost, the answer says so), ARGV[15] notes json
# ('' = none; see write_notes)
# A run is recorded cancelled only if a cancel was requested: an accepted request makes any end
# 'cancelled' (end_reason says how it ended); a node's drain records its own request; any other
# stop without a request is 'failed' with the stop cause as end_reason.
# -> {notices, {'ok', final status, end_reason} | {'done', status} (ended by someone else)
#    | {'fenced', status} | {'missing', ''} (Redis forgot the node: retry after it re-registers)
#    | {'record_lost', ''} (call again with the record)}
FINISH_RUN = _script("""
local rk = KEYS[1]
local run_id, node_id, epoch, status, cause = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local output, truncated, err, phase = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local delivered_at, observed_at = ARGV[10], ARGV[11]
local retention_ms, pub, record, notes = tonumber(ARGV[12]), ARGV[13], ARGV[14], ARGV[15]
local cur = redis.call('HMGET', rk, 'status', 'owner', 'epoch', 'cancel_requested_at', 'end_reason')
if not cur[1] then
  local ns = node_state(node_id, epoch)
  if ns ~= 'alive' then return reply({ns == 'missing' and 'missing' or 'fenced', ''}) end
  if record == '' then return reply({'record_lost', ''}) end  -- call again with the record
  local r = cjson.decode(record)
  for k, v in pairs(r) do redis.call('HSET', rk, k, v) end
  redis.call('HSET', rk, 'run_id', run_id, 'status', 'running', 'owner', node_id, 'epoch', epoch)
  add_event(run_id, 'run.reasserted', {owner = node_id})
  cur = redis.call('HMGET', rk, 'status', 'owner', 'epoch', 'cancel_requested_at', 'end_reason')
end
if not ACTIVE[cur[1]] then
  if cur[2] == node_id and cur[3] == epoch and cur[5] ~= 'owner_lost' then
    return reply({'ok', cur[1], cur[5]})
  end
  return reply({'done', cur[1]})
end
if cur[2] ~= node_id or cur[3] ~= epoch then return reply({'fenced', cur[1]}) end
local ns = node_state(node_id, epoch)
if ns ~= 'alive' then return reply({ns == 'missing' and 'missing' or 'fenced', cur[1]}) end
local end_reason = ({succeeded = 'completed', failed = 'error', cancelled = 'cancelled'})[status]
local requested_at = cur[4]
if status == 'cancelled' and not requested_at then
  if cause == 'node_shutdown' then
    requested_at = NOW
    redis.call('HSET', rk, 'cancel_requested_at', NOW, 'cancel_mode', 'immediate',
      'cancel_cause', 'node_shutdown', 'cancel_reason', 'node_shutdown', 'requested_by', node_id)
    add_event(run_id, 'run.cancel_requested', {mode = 'immediate', cause = 'node_shutdown',
      reason = 'node_shutdown', requested_by = node_id})
  else  -- stopped by its node (lease lost, Redis unreachable) with nobody asking
    status, end_reason = 'failed', (cause ~= '' and cause) or 'error'
  end
elseif status == 'cancelled' and cause ~= '' and cause ~= 'node_shutdown' then
  end_reason = cause  -- a request was pending, but its node stopped it first
end
if requested_at then status = 'cancelled' end
local fields = {}
local function put(k, v) table.insert(fields, k); table.insert(fields, v) end
if output ~= '' then put('output', output) end
if truncated == '1' then put('output_truncated', '1') end
if err ~= '' then put('error', err) end
if phase ~= '' then put('phase', phase) end
if requested_at then
  local req = tonumber(requested_at)
  local function clamp(at) return fmt(math.min(math.max(tonumber(at), req), NOW_S)) end
  if delivered_at ~= '' and not redis.call('HGET', rk, 'cancel_delivered_at') then
    put('cancel_delivered_at', clamp(delivered_at))
    add_event(run_id, 'run.cancel_delivered', {node = node_id})
  end
  if observed_at ~= '' then put('cancel_observed_at', clamp(observed_at)) end
end
write_notes(run_id, notes)
finalize(run_id, status, end_reason, fields, retention_ms, pub)
return reply({'ok', status, end_reason})
""")

# KEYS[1] nodes zset (any key of the namespace: it only routes the call)
# ARGV[1] node_id, ARGV[2] epoch, ARGV[3] json list of runs:
#   [run_id, phase ('' = unchanged), delivered_at ('' = none; the owner's estimate of the
#    server clock), [[type, at, data_json], ...] relay entries, notes json ('' = none)]
# -> how many runs were updated (a run no longer this incarnation's active run is skipped; its
#    notes — a leak after its end — are still written if it was this incarnation's)
SYNC_RUNS = _script(
    """
local nodes = KEYS[1]
local node_id, epoch, items = ARGV[1], ARGV[2], cjson.decode(ARGV[3])
if not node_alive(node_id, epoch) then return 0 end
local updated = 0
for _, item in ipairs(items) do
  local run_id, phase, delivered_at, entries = item[1], item[2], item[3], item[4]
  local rk = key_run(run_id)
  local cur = redis.call('HMGET', rk, 'status', 'owner', 'epoch', 'cancel_requested_at',
    'cancel_delivered_at')
  if cur[1] and cur[2] == node_id and cur[3] == epoch then write_notes(run_id, item[5]) end
  if ACTIVE[cur[1]] and cur[2] == node_id and cur[3] == epoch then
    if phase ~= '' then redis.call('HSET', rk, 'phase', phase) end
    if delivered_at ~= '' and cur[4] and not cur[5] then
      local at = math.min(math.max(tonumber(delivered_at), tonumber(cur[4])), NOW_S)
      redis.call('HSET', rk, 'cancel_delivered_at', fmt(at))
      add_event(run_id, 'run.cancel_delivered', {node = node_id})
    end
    for _, e in ipairs(entries) do relay_add(run_id, e[1], e[2], e[3]) end
    updated = updated + 1
  end
end
return updated
""",
    DENY_OOM,
)

# KEYS[1] run hash
# ARGV[1] run_id, ARGV[2] node_id, ARGV[3] epoch, ARGV[4] target status (waiting|running)
# -> {'ok'} | {'cancel_pending'} | {'state', status} | {'fenced', status}
SET_WAITING = _script("""
local rk = KEYS[1]
local run_id, node_id, epoch, target = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local cur = redis.call('HMGET', rk, 'status', 'owner', 'epoch', 'cancel_requested_at')
if cur[2] ~= node_id or cur[3] ~= epoch then return {'fenced', tostring(cur[1])} end
if cur[1] == target then return {'ok'} end
local from = 'running'
if target == 'running' then from = 'waiting' end
if cur[1] ~= from then return {'state', tostring(cur[1])} end
if target == 'waiting' and cur[4] then return {'cancel_pending'} end
if not node_alive(node_id, epoch) then return {'fenced', cur[1]} end
redis.call('HSET', rk, 'status', target)
if target == 'waiting' then add_event(run_id, 'run.waiting', {})
else add_event(run_id, 'run.resumed', {}) end
return {'ok'}
""")

# KEYS[1] run hash
# ARGV[1] run_id, ARGV[2] node_id (the waiter)
# -> status ('' if unknown); the node is recorded as a waiter only if the run is active
ADD_WAITER = _script("""
local rk = KEYS[1]
local run_id, node_id = ARGV[1], ARGV[2]
local st = redis.call('HGET', rk, 'status')
if not st then return '' end
if ACTIVE[st] then redis.call('SADD', key_waiters(run_id), node_id) end
return st
""")

# KEYS[1] run hash
# ARGV[1] run_id, ARGV[2] node_id, ARGV[3] epoch, ARGV[4] the run as the owner knows it (json:
# app_name, user_id, session_id, created_at, started_at, metadata, relay, status, phase and the
# cancel_* fields it has seen)
# -> {'ok'} (recorded as ours) | {'recreated'} | {'finished', status} | {'foreign', owner}
#    | {'fenced'}
REASSERT_RUN = _script("""
local rk = KEYS[1]
local run_id, node_id, epoch = ARGV[1], ARGV[2], ARGV[3]
if not node_alive(node_id, epoch) then return {'fenced'} end
local cur = redis.call('HMGET', rk, 'status', 'owner')
if cur[1] then
  if not ACTIVE[cur[1]] then return {'finished', cur[1]} end
  if cur[2] ~= node_id then return {'foreign', tostring(cur[2])} end
  redis.call('HSET', rk, 'epoch', epoch)
  redis.call('SADD', key_node_runs(node_id), run_id)
  local mode = redis.call('HGET', rk, 'cancel_mode')
  if mode then redis.call('HSET', key_node_pending(node_id), run_id, mode) end
  return {'ok'}
end
local r = cjson.decode(ARGV[4])
for k, v in pairs(r) do redis.call('HSET', rk, k, v) end
redis.call('HSET', rk, 'run_id', run_id, 'owner', node_id, 'epoch', epoch)
if r.app_name and not session_holder(r.app_name, r.user_id, r.session_id) then
  redis.call('SET', key_session(r.app_name, r.user_id, r.session_id), run_id)
end
redis.call('ZADD', key_active(), r.created_at, run_id)
redis.call('SADD', key_node_runs(node_id), run_id)
if r.cancel_mode then
  redis.call('HSET', key_node_pending(node_id), run_id, r.cancel_mode)
end
add_event(run_id, 'run.reasserted', {owner = node_id})
return {'recreated'}
""")

# KEYS[1] active zset
# ARGV[1] selector (JSON, see selector_matches), ARGV[2] offset, ARGV[3] count
# Read-only: the active runs (queued, running, waiting) among `count` of the active index from
# `offset` (newest first) that match the selector.
# -> {next offset (-1: the index ends), {run_id, ...}}
SELECT_RUNS = _script(
    """
local active = KEYS[1]
local selector, offset, count = cjson.decode(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local ids = redis.call('ZRANGE', active, offset, offset + count - 1, 'REV')
local matched = {}
for _, id in ipairs(ids) do
  local r = hash_to_table(redis.call('HGETALL', key_run(id)))
  if r.status and ACTIVE[r.status] and selector_matches(selector, r) then
    table.insert(matched, id)
  end
end
if #ids < count then return {-1, matched} end
return {offset + count, matched}
""",
    READ_ONLY,
)

# KEYS[1] tombstones zset
# ARGV[1] tombstone id, ARGV[2] selector (JSON), ARGV[3] mode, ARGV[4] reason, ARGV[5]
# requested_by, ARGV[6] cause, ARGV[7] ttl_ms
# A hold on later runs: until it expires, a run started, claimed or queued that matches the
# selector is recorded cancelled with this request (inherited_cancel).
# -> {'ok', expires_at} | {'full'} (__MAX_TOMBSTONES__ live already); the id laid already (a
# call sent again) answers 'ok' and changes nothing
ADD_TOMBSTONE = _script("""
local tombstones = KEYS[1]
local id, selector, mode, reason, by = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local cause, ttl_ms = ARGV[6], tonumber(ARGV[7])
redis.call('ZREMRANGEBYSCORE', tombstones, '-inf', fmt(NOW_S))
local laid = redis.call('ZSCORE', tombstones, id)
if laid then return {'ok', laid} end  -- a call sent again: it was laid, even if now full
if redis.call('ZCARD', tombstones) >= __MAX_TOMBSTONES__ then return {'full'} end
local expires = fmt(NOW_S + ttl_ms / 1000)
local tk = key_tombstone(id)
redis.call('HSET', tk, 'tombstone_id', id, 'selector', selector, 'mode', mode, 'cause', cause,
  'created_at', NOW, 'expires_at', expires)
if reason ~= '' then redis.call('HSET', tk, 'reason', reason) end
if by ~= '' then redis.call('HSET', tk, 'requested_by', by) end
redis.call('PEXPIRE', tk, ttl_ms)
redis.call('ZADD', tombstones, expires, id)
return {'ok', expires}
""")

# KEYS[1] tombstones zset
# ARGV[1] tombstone id, ARGV[2] request id (unique per call: the hash keeps it for two minutes,
# so a call redis-py repeats because its answer was lost answers 1 as the first did)
# -> 1 if it was live (this call lifted it), else 0
REMOVE_TOMBSTONE = _script("""
local tombstones = KEYS[1]
local id, request = ARGV[1], ARGV[2]
local tk = key_tombstone(id)
if redis.call('ZREM', tombstones, id) == 0 then
  return redis.call('HGET', tk, 'removed_by') == request and 1 or 0
end
redis.call('DEL', tk)
redis.call('HSET', tk, 'removed_by', request)
redis.call('PEXPIRE', tk, 120000)
return 1
""")

# The scripts that may notify nodes: they answer {notices, reply} (see the module docstring).
NOTIFYING = frozenset(
    {"register_node", "reap", "leave_node", "start_run", "request_cancel", "finish_run"}
)

ALL_SCRIPTS = {
    "register_node": REGISTER_NODE,
    "heartbeat": HEARTBEAT,
    "reap": REAP,
    "leave_node": LEAVE_NODE,
    "start_run": START_RUN,
    "enqueue_run": ENQUEUE_RUN,
    "request_cancel": REQUEST_CANCEL,
    "finish_run": FINISH_RUN,
    "sync_runs": SYNC_RUNS,
    "set_waiting": SET_WAITING,
    "add_waiter": ADD_WAITER,
    "reassert_run": REASSERT_RUN,
    "select_runs": SELECT_RUNS,
    "add_tombstone": ADD_TOMBSTONE,
    "remove_tombstone": REMOVE_TOMBSTONE,
}
