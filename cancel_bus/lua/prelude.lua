-- The prelude of every script (after the names generated from Python: C R N T E F MSG, the key
-- functions, the constants; see _scripts.py). It reads the server clock once and defines the
-- helpers that keep indexes, events and notifications in step. A script's body is `one(KEYS, A)`:
-- A holds its arguments by name; it answers a table of named fields (encoded as JSON).
local TIME = redis.call('TIME')
local NOW_S = tonumber(TIME[1]) + tonumber(TIME[2]) / 1000000
local NOW = string.format('%d.%06d', tonumber(TIME[1]), tonumber(TIME[2]))
local NOTICES = {}  -- messages kept for the caller to seal and send (a signed bus: pub == '')

local function fmt(seconds) return string.format('%.6f', seconds) end
local function meta_or_nil(value) if value == '' then return nil end return value end

-- Now on the lease clock: its value at the last heartbeat, plus the time since, capped at the
-- step that heartbeat declared. Without a clock yet, the server clock.
local LEASE_NOW = nil
local function lease_clock(cap)
  local c = redis.call('HMGET', key_lease_clock(), CLOCK.LAST, CLOCK.AT, CLOCK.CAP)
  if not c[1] then return NOW_S end
  return tonumber(c[2]) + math.min(math.max(NOW_S - tonumber(c[1]), 0), cap or tonumber(c[3]))
end
local function lease_now()
  if LEASE_NOW == nil then LEASE_NOW = lease_clock(nil) end
  return LEASE_NOW
end

-- A heartbeat reached Redis: advance the lease clock (by at most `cap`, the caller's step).
local function tick_lease_clock(cap)
  LEASE_NOW = lease_clock(cap)
  redis.call('HSET', key_lease_clock(), CLOCK.LAST, fmt(NOW_S), CLOCK.AT, fmt(LEASE_NOW),
    CLOCK.CAP, fmt(cap))
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

local function record(run_id) return hash_to_table(redis.call('HGETALL', key_run(run_id))) end

-- The lifecycle log: a list of small JSON entries (a one-entry stream would cost some 4 KB, the
-- list 260 B). Queued and started are not logged: the record's created_at, started_at and owner
-- tell them, so a run that just runs costs no log at all.
-- An event of the run's log, at ``at`` (a formatted time: the moment the record names) or now.
local function add_event(run_id, etype, data, at)
  local key = key_events(run_id)
  local n = redis.call('RPUSH', key, cjson.encode({[ENTRY.TYPE] = etype, [ENTRY.AT] = at or NOW, [ENTRY.DATA] = data}))
  if n > EVENTS_MAX then redis.call('LTRIM', key, -EVENTS_MAX, -1) end
end

local function relay_add(run_id, etype, at, data_json)
  redis.call('XADD', key_relay(run_id), 'MAXLEN', '~', RELAY_MAX, '*',
    ENTRY.TYPE, etype, ENTRY.AT, at, ENTRY.DATA, data_json)
end

-- Notes on a run (what its owner observed of its code), JSON fields of its record:
-- leaked_after_cancel {count, calls {call: n}, first_call, first_site, first_at} — what the
-- code did through the library after its end (the node sends what is new: counts add up);
-- slowest_checkpoints {site: ms} (the node sends the whole map). A first leak is an event.
local function note_leak(run_id, delta)
  local rk = key_run(run_id)
  local raw = redis.call('HGET', rk, R.LEAKED_AFTER_CANCEL)
  local leak = raw and cjson.decode(raw) or {count = 0, calls = {}}
  if not raw then
    leak.first_call, leak.first_site, leak.first_at =
      delta.first_call, delta.first_site, delta.first_at
    add_event(run_id, E.LEAKED, {call = delta.first_call, site = delta.first_site})
  end
  for call, n in pairs(delta.calls) do
    leak.calls[call] = (leak.calls[call] or 0) + n
    leak.count = leak.count + n
  end
  redis.call('HSET', rk, R.LEAKED_AFTER_CANCEL, cjson.encode(leak))
end

local function write_notes(run_id, notes_json)
  if notes_json == '' then return end
  local notes = cjson.decode(notes_json)
  if notes.leaked_after_cancel then note_leak(run_id, notes.leaked_after_cancel) end
  if notes.slowest_checkpoints then
    redis.call('HSET', key_run(run_id), R.SLOWEST_CHECKPOINTS,
      cjson.encode(notes.slowest_checkpoints))
  end
end

-- 'alive' if node_id holds a live lease (as incarnation `epoch`, unless epoch is nil), 'missing'
-- if Redis has no record of the node (it lost our data), else 'dead'. A lease found expired
-- fences the node on the spot: it is marked dead, whoever looks first.
local function node_state(node_id, epoch)
  if not node_id then return NS.MISSING end
  local nk = key_node(node_id)
  local st = redis.call('HMGET', nk, N.STATE, N.EPOCH)
  if not st[1] then return NS.MISSING end
  if st[1] ~= NS.ALIVE or (epoch ~= nil and st[2] ~= epoch) then return NS.DEAD end
  local exp = redis.call('ZSCORE', key_nodes(), node_id)
  if (not exp) or tonumber(exp) <= lease_now() then
    redis.call('HSET', nk, N.STATE, NS.DEAD)
    redis.call('HSETNX', nk, N.DIED_AT, NOW)
    return NS.DEAD
  end
  return NS.ALIVE
end

local function node_alive(node_id, epoch) return node_state(node_id, epoch) == NS.ALIVE end

-- The code of a node that may not write: its record is gone (missing), or its lease (fenced).
local function refused(node_id, epoch)
  local ns = node_state(node_id, epoch)
  if ns == NS.ALIVE then return nil end
  return ns == NS.MISSING and C.MISSING or C.FENCED
end

-- The run id holding the session key, if that run is still active.
local function session_holder(app, user, sess)
  local holder = redis.call('GET', key_session(app, user, sess))
  if not holder then return nil end
  local st = redis.call('HGET', key_run(holder), R.STATUS)
  if st and ACTIVE[st] then return holder end
  return nil
end

-- The session's turn passes to the first run of its queue still queued (multitask strategy
-- 'enqueue': arrival order), which holds the session from now on; -> its id, nil if none waits.
-- Its node learns it from the end of the run it waited for (it is that run's waiter).
local function session_next(app, user, sess)
  local qk = key_session_queue(app, user, sess)
  while true do
    local head = redis.call('ZRANGE', qk, 0, 0)[1]
    if not head then return nil end
    redis.call('ZREM', qk, head)
    if redis.call('HGET', key_run(head), R.STATUS) == 'queued' then
      redis.call('SET', key_session(app, user, sess), head)
      return head
    end
  end
end

-- Puts the new run last in the session's queue (arrival order: a score past the last one's).
local function session_enqueue(app, user, sess, run_id)
  local qk = key_session_queue(app, user, sess)
  local last = redis.call('ZRANGE', qk, -1, -1, 'WITHSCORES')[2]
  local score = NOW_S
  if last and tonumber(last) >= score then score = tonumber(last) + 0.000001 end
  redis.call('ZADD', qk, fmt(score), run_id)
end

-- The run holding the session: its active run, else (the holder's record is gone) the head of
-- its queue, which takes the turn now; nil: the session is free.
local function session_taken(app, user, sess)
  return session_holder(app, user, sess) or session_next(app, user, sess)
end

-- Ends an active run: terminal state, out of every active index, expiry scheduled, waiters rung.
local function finalize(run_id, status, end_reason, fields, retention_ms, pub)
  local rk = key_run(run_id)
  local info = redis.call('HMGET', rk, R.OWNER, R.APP_NAME, R.USER_ID, R.SESSION_ID, R.RELAY)
  redis.call('HSET', rk, R.STATUS, status, R.FINISHED_AT, NOW, R.END_REASON, end_reason,
    unpack(fields))
  if info[1] then
    redis.call('SREM', key_node_runs(info[1]), run_id)
    redis.call('SREM', key_node_queued(info[1]), run_id)
    redis.call('HDEL', key_node_pending(info[1]), run_id)
  end
  if info[2] then
    local sk = key_session(info[2], info[3], info[4])
    redis.call('ZREM', key_session_queue(info[2], info[3], info[4]), run_id)
    if redis.call('GET', sk) == run_id then
      redis.call('DEL', sk)
      session_next(info[2], info[3], info[4])
    end
  end
  redis.call('ZREM', key_active(), run_id)
  redis.call('ZADD', key_finished(), NOW, run_id)
  redis.call('ZREMRANGEBYSCORE', key_finished(), '-inf', fmt(NOW_S - retention_ms / 1000))
  local ended = {status = status, end_reason = end_reason}
  add_event(run_id, E.FINISHED, ended)
  if info[5] == '1' then relay_add(run_id, E.FINISHED, NOW, cjson.encode(ended)) end
  redis.call('PEXPIRE', rk, retention_ms)
  redis.call('PEXPIRE', key_events(run_id), retention_ms)
  redis.call('PEXPIRE', key_relay(run_id), retention_ms)
  redis.call('PEXPIRE', key_children(run_id), retention_ms)
  local wk = key_waiters(run_id)
  local waiters = redis.call('SMEMBERS', wk)
  if #waiters > 0 then
    local msg = {[F.KIND] = MSG.FINISHED, [F.RUN] = run_id, [F.STATUS] = status}
    if redis.call('HSTRLEN', rk, R.OUTPUT) <= NOTIFY_RUN_MAX_BYTES then
      msg[F.RECORD] = record(run_id)
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
  local st = redis.call('HMGET', key_run(run_id), R.STATUS, R.CANCEL_REQUESTED_AT, R.OWNER)
  if not (st[1] == 'running' or st[1] == 'waiting') then return false end
  local status = 'failed'
  if st[2] then status = 'cancelled' end
  finalize(run_id, status, 'owner_lost',
    {R.ERROR, 'owner_lost: node ' .. tostring(st[3]) .. ' lost its lease'}, retention_ms, pub)
  return true
end

-- Records a cancel of one run and tells its owner (first request wins, a stronger mode
-- escalates; queued or waiting: cancelled at once; owner gone: resolved owner_lost); the message
-- is bound to the owner (node and epoch) and to the run. -> {code, run, receivers}
local function cancel_one(run_id, target, mode, reason, by, cause, waiter, caller, retention_ms,
    pub, traceparent)
  local rk = key_run(run_id)
  local cur = redis.call('HMGET', rk, R.STATUS, R.OWNER, R.CANCEL_REQUESTED_AT, R.CANCEL_MODE,
    R.EPOCH)
  local st = cur[1]
  if not st then return {code = C.NOT_FOUND, receivers = -1} end
  if not ACTIVE[st] then
    return {code = C.ALREADY_FINISHED, run = record(run_id), receivers = -1}
  end
  if not cur[3] then
    local fields = {R.CANCEL_REQUESTED_AT, NOW, R.CANCEL_MODE, mode, R.CANCEL_CAUSE, cause}
    if reason ~= '' then table.insert(fields, R.CANCEL_REASON); table.insert(fields, reason) end
    if by ~= '' then table.insert(fields, R.REQUESTED_BY); table.insert(fields, by) end
    if traceparent and traceparent ~= '' then
      table.insert(fields, R.CANCEL_TRACEPARENT); table.insert(fields, traceparent)
    end
    redis.call('HSET', rk, unpack(fields))
    add_event(run_id, E.CANCEL_REQUESTED,
      {mode = mode, cause = cause, reason = meta_or_nil(reason), requested_by = meta_or_nil(by)})
  elseif STRENGTH[mode] > STRENGTH[cur[4]] then
    redis.call('HSET', rk, R.CANCEL_MODE, mode)
    add_event(run_id, E.CANCEL_ESCALATED,
      {from = cur[4], to = mode, requested_by = meta_or_nil(by)})
  end
  local meta = redis.call('HMGET', rk, R.CANCEL_MODE, R.CANCEL_REQUESTED_AT, R.CANCEL_REASON,
    R.REQUESTED_BY, R.CANCEL_CAUSE, R.CANCEL_TRACEPARENT)
  local owner = cur[2]
  local message = {[F.KIND] = MSG.CANCEL, [F.RUN] = run_id, [F.TARGET] = target,
    [F.MODE] = mode, [F.RUN_MODE] = meta[1], [F.AT] = meta[2], [F.REASON] = meta[3] or nil,
    [F.BY] = meta[4] or nil, [F.CAUSE] = meta[5] or nil, [F.TRACEPARENT] = meta[6] or nil,
    [F.TO] = owner, [F.EPOCH] = cur[5]}
  if st ~= 'running' then
    if owner and owner ~= caller then notify(pub, owner, message) end
    finalize(run_id, 'cancelled', 'cancelled', {}, retention_ms, pub)
    return {code = C.CANCELLED, run = record(run_id), receivers = -1}
  end
  if not node_alive(owner, nil) then
    resolve_owner_lost(run_id, retention_ms, pub)
    return {code = C.OWNER_LOST, run = record(run_id), receivers = -1}
  end
  redis.call('HSET', key_node_pending(owner), run_id, meta[1])
  if waiter ~= '' then redis.call('SADD', key_waiters(run_id), waiter) end
  local receivers = -1
  if owner ~= caller then receivers = notify(pub, owner, message) end
  return {code = C.STOPPING, run = record(run_id), receivers = receivers}
end

-- A run as a repeated cancel request answers for it: stopping while it is active (the first run
-- of the request recorded it), else how it ended. -> {code, run, receivers}
local function standing(run_id)
  local cur = redis.call('HMGET', key_run(run_id), R.STATUS, R.END_REASON)
  if not cur[1] then return {code = C.NOT_FOUND, receivers = -1} end
  local code = C.ALREADY_FINISHED
  if ACTIVE[cur[1]] then code = C.STOPPING
  elseif cur[2] == 'owner_lost' then code = C.OWNER_LOST
  elseif cur[1] == 'cancelled' then code = C.CANCELLED end
  return {code = code, run = record(run_id), receivers = -1}
end

-- The runs started below `run_id` (children, their children...): every active one, deepest
-- first (at most MAX_DESCENDANTS), then the ended ones while the list has room. The walk goes
-- through ended runs (their children may still run) and visits at most MAX_WALK runs.
-- -> the list, and true if runs were left out of it (active ones beyond the cap, or the walk's end)
local function descendants(run_id)
  local levels, ended, frontier, seen = {}, {}, {run_id}, {[run_id] = true}
  local visited, active, cut = 0, 0, false
  while #frontier > 0 and not cut do
    local level, next_frontier = {}, {}
    for _, id in ipairs(frontier) do
      for _, kid in ipairs(redis.call('SMEMBERS', key_children(id))) do
        if not seen[kid] and not cut then
          seen[kid] = true
          visited = visited + 1
          if visited > MAX_WALK then cut = true end
          local st = (not cut) and redis.call('HGET', key_run(kid), R.STATUS)
          if st then
            table.insert(next_frontier, kid)
            if not ACTIVE[st] then
              table.insert(ended, kid)
            elseif active < MAX_DESCENDANTS then
              active = active + 1
              table.insert(level, kid)
            else
              cut = true
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
    if #listed >= MAX_DESCENDANTS then break end
    table.insert(listed, id)
  end
  return listed, cut
end

-- Whether a run (a table of its fields) matches a selector: each field the selector names is
-- equal (node_id: its owner), its metadata holds the selector's (scalar values), and it started
-- before `started_before` (server clock) if given. Python's selector_matches is the other side.
local function selector_matches(sel, r)
  for _, k in ipairs({R.RUN_ID, R.APP_NAME, R.USER_ID, R.SESSION_ID}) do
    if sel[k] ~= nil and sel[k] ~= r[k] then return false end
  end
  if sel.node_id ~= nil and sel.node_id ~= r[R.OWNER] then return false end
  if sel.started_before ~= nil then
    local started = tonumber(r[R.STARTED_AT] or r[R.CREATED_AT] or NOW)  -- a new run: now
    if started >= sel.started_before then return false end
  end
  if sel.metadata ~= nil then
    if not r[R.METADATA] then return false end
    local md = cjson.decode(r[R.METADATA])
    for k, v in pairs(sel.metadata) do
      if md[k] ~= v then return false end
    end
  end
  return true
end

-- The request a new run inherits if it must never start: its parent's accepted cancel (cause
-- 'parent'), or that of a live tombstone it matches; nil if it may start.
local function inherited_cancel(r)
  if r[R.PARENT] then
    local p = redis.call('HMGET', key_run(r[R.PARENT]), R.CANCEL_REQUESTED_AT, R.CANCEL_MODE,
      R.CANCEL_REASON, R.REQUESTED_BY)
    if p[1] then return {mode = p[2], reason = p[3], by = p[4], cause = 'parent'} end
  end
  redis.call('ZREMRANGEBYSCORE', key_tombstones(), '-inf', fmt(NOW_S))
  for _, id in ipairs(redis.call('ZRANGE', key_tombstones(), 0, MAX_TOMBSTONES - 1)) do
    local t = redis.call('HMGET', key_tombstone(id), T.SELECTOR, T.MODE, T.REASON,
      T.REQUESTED_BY, T.CAUSE)
    if t[1] and selector_matches(cjson.decode(t[1]), r) then
      return {mode = t[2], reason = t[3], by = t[4], cause = t[5], tombstone = id}
    end
  end
  return nil
end

-- A new run that must never start (see inherited_cancel): recorded, cancelled at once.
local function born_cancelled(rk, r, req, retention_ms)
  for k, v in pairs(r) do redis.call('HSET', rk, k, v) end
  redis.call('HSET', rk, R.STATUS, 'queued', R.CREATED_AT, NOW, R.CANCEL_REQUESTED_AT, NOW,
    R.CANCEL_MODE, req.mode, R.CANCEL_CAUSE, req.cause)
  if req.reason then redis.call('HSET', rk, R.CANCEL_REASON, req.reason) end
  if req.by then redis.call('HSET', rk, R.REQUESTED_BY, req.by) end
  add_event(r[R.RUN_ID], E.CANCEL_REQUESTED, {mode = req.mode, cause = req.cause,
    reason = req.reason or nil, requested_by = req.by or nil, tombstone = req.tombstone})
  finalize(r[R.RUN_ID], 'cancelled', 'cancelled', {}, retention_ms, '')
  return record(r[R.RUN_ID])
end

-- Resolves up to `budget` runs of a node that is gone; once none is left, forgets the node.
-- Returns runs resolved, and whether the node is now fully reaped.
local function reap_node(node_id, budget, retention_ms, pub, final_state)
  local nk = key_node(node_id)
  local runs_key, queued_key = key_node_runs(node_id), key_node_queued(node_id)
  local resolved = 0
  if budget > 0 then
    for _, id in ipairs(redis.call('SPOP', queued_key, budget)) do  -- waiting for their turn
      if redis.call('HGET', key_run(id), R.STATUS) == 'queued' then
        finalize(id, 'failed', 'owner_lost',
          {R.ERROR, 'owner_lost: node ' .. node_id .. ', where it waited its turn, is gone'},
          retention_ms, pub)
        resolved = resolved + 1
      end
    end
  end
  if budget > resolved then
    for _, id in ipairs(redis.call('SPOP', runs_key, budget - resolved)) do
      if resolve_owner_lost(id, retention_ms, pub) then resolved = resolved + 1 end
    end
  end
  if redis.call('SCARD', runs_key) + redis.call('SCARD', queued_key) > 0 then
    return resolved, false
  end
  redis.call('ZREM', key_nodes(), node_id)
  redis.call('DEL', key_node_pending(node_id))
  if redis.call('EXISTS', nk) == 1 then
    redis.call('HSET', nk, N.STATE, final_state)
    redis.call('HSETNX', nk, N.DIED_AT, NOW)
    redis.call('PEXPIRE', nk, 2 * retention_ms)
  end
  return resolved, true
end
