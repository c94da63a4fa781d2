#!lua
-- KEYS[1] the run's hash
-- A: run_id, node_id, epoch, app_name, user_id, session_id ('' x3: no session key), metadata
--    (JSON or ''), relay, parent ('' : none), retention_ms, pub, queue (true: on a busy session,
--    wait in the session's queue: multitask strategy 'enqueue'), interrupted (the run of the
--    session it interrupted to start, or '')
-- A queued run of that id is claimed — with a session key, only if it is the run's own, and
-- once the session's turn has come to it (until then it waits in the queue, on this node);
-- otherwise the id must be new (ids are never reused), or this very start retried (same owner,
-- session). With `queue`, a new run of a busy session is recorded queued on this node, last in
-- the session's queue; started again, it starts once the session's turn has come to it (the
-- holder's end hands the turn to the queue's first run), else it answers queued again. A run whose parent has an accepted cancel, or that a live tombstone matches, never
-- starts: it is recorded cancelled at once (so is a queued one being claimed). New work: refused
-- whole when Redis is out of memory.
-- -> {code = ok (run: the record) | fenced | missing (Redis forgot the node: retry after it
--    re-registers) | exists (run: the record) | session_busy (holder: the active run's id)
--    | queued (run: the record; holder: the run whose end it waits for) | cancelled (run: the
--    record: it must not start)}
local rk = KEYS[1]
local no = refused(A.node_id, A.epoch)
if no then return {code = no} end
local cur = redis.call('HMGET', rk, R.STATUS, R.OWNER, R.EPOCH, R.APP_NAME, R.USER_ID,
  R.SESSION_ID)
local own_session = A.app_name == '' or
  (cur[4] == A.app_name and cur[5] == A.user_id and cur[6] == A.session_id)
if cur[1] == 'queued' and cur[2] then  -- queued behind its session's active run, on its node
  if cur[2] ~= A.node_id or not own_session then return {code = C.EXISTS, run = record(A.run_id)} end
  local holder = session_taken(A.app_name, A.user_id, A.session_id)
  if holder and holder ~= A.run_id then
    return {code = C.QUEUED, run = record(A.run_id), holder = holder}
  end
  redis.call('SET', key_session(A.app_name, A.user_id, A.session_id), A.run_id)  -- its turn
  redis.call('HSET', rk, R.STATUS, 'running', R.EPOCH, A.epoch, R.STARTED_AT, NOW)
  if A.relay then redis.call('HSET', rk, R.RELAY, '1') end
  redis.call('SREM', key_node_queued(A.node_id), A.run_id)
  redis.call('SADD', key_node_runs(A.node_id), A.run_id)
  return {code = C.OK, run = record(A.run_id)}
end
if cur[1] == 'queued' and own_session then
  local queued = record(A.run_id)
  queued[R.OWNER] = A.node_id
  local req = inherited_cancel(queued)
  if req then
    cancel_one(A.run_id, RUN_PREFIX .. A.run_id, req.mode, req.reason or '', req.by or '',
      req.cause, '', A.node_id, A.retention_ms, A.pub)
    return {code = C.CANCELLED, run = record(A.run_id)}
  end
  if A.app_name ~= '' then  -- queued by enqueue in the session's queue: its turn, or wait it here
    local holder = session_taken(A.app_name, A.user_id, A.session_id)
    if holder and holder ~= A.run_id then
      redis.call('HSET', rk, R.OWNER, A.node_id)
      redis.call('SADD', key_node_queued(A.node_id), A.run_id)
      return {code = C.QUEUED, run = record(A.run_id), holder = holder}
    end
    redis.call('SET', key_session(A.app_name, A.user_id, A.session_id), A.run_id)
  end
  redis.call('HSET', rk, R.STATUS, 'running', R.OWNER, A.node_id, R.EPOCH, A.epoch,
    R.STARTED_AT, NOW)
  if A.relay then redis.call('HSET', rk, R.RELAY, '1') end
  redis.call('SADD', key_node_runs(A.node_id), A.run_id)
  return {code = C.OK, run = record(A.run_id)}
end
if cur[1] == 'running' and cur[2] == A.node_id and cur[3] == A.epoch and own_session then
  return {code = C.OK, run = record(A.run_id)}  -- a retried call
end
if cur[1] then return {code = C.EXISTS, run = record(A.run_id)} end
local r = {[R.RUN_ID] = A.run_id, [R.OWNER] = A.node_id}
if A.app_name ~= '' then
  r[R.APP_NAME], r[R.USER_ID], r[R.SESSION_ID] = A.app_name, A.user_id, A.session_id
end
if A.metadata ~= '' then r[R.METADATA] = A.metadata end
if A.interrupted ~= '' then r[R.INTERRUPTED] = A.interrupted end
if A.parent ~= '' then
  r[R.PARENT] = A.parent
  local pst = redis.call('HGET', key_run(A.parent), R.STATUS)
  if pst and not ACTIVE[pst] then  -- its code started a child after its end
    note_leak(A.parent, {calls = {child_started = 1}, first_call = 'child_started',
      first_site = RUN_PREFIX .. A.run_id, first_at = NOW})
  end
end
local req = inherited_cancel(r)
if req then
  r[R.OWNER] = nil  -- it never ran
  if A.parent ~= '' then redis.call('SADD', key_children(A.parent), A.run_id) end
  return {code = C.CANCELLED, run = born_cancelled(rk, r, req, A.retention_ms)}
end
if A.app_name ~= '' then
  local holder = session_taken(A.app_name, A.user_id, A.session_id)
  if holder and holder ~= A.run_id and not A.queue then
    return {code = C.SESSION_BUSY, holder = holder}
  end
  if holder and holder ~= A.run_id then  -- last in the session's queue, on this node
    session_enqueue(A.app_name, A.user_id, A.session_id, A.run_id)
    redis.call('SADD', key_node_queued(A.node_id), A.run_id)
    if A.parent ~= '' then redis.call('SADD', key_children(A.parent), A.run_id) end
    for k, v in pairs(r) do redis.call('HSET', rk, k, v) end
    redis.call('HSET', rk, R.STATUS, 'queued', R.CREATED_AT, NOW)
    redis.call('ZADD', key_active(), NOW, A.run_id)
    return {code = C.QUEUED, run = record(A.run_id), holder = holder}
  end
  redis.call('SET', key_session(A.app_name, A.user_id, A.session_id), A.run_id)
end
if A.parent ~= '' then redis.call('SADD', key_children(A.parent), A.run_id) end
for k, v in pairs(r) do redis.call('HSET', rk, k, v) end
redis.call('HSET', rk, R.STATUS, 'running', R.EPOCH, A.epoch, R.CREATED_AT, NOW,
  R.STARTED_AT, NOW)
if A.relay then redis.call('HSET', rk, R.RELAY, '1') end
redis.call('ZADD', key_active(), NOW, A.run_id)
redis.call('SADD', key_node_runs(A.node_id), A.run_id)
return {code = C.OK, run = record(A.run_id)}
