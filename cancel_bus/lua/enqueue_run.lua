#!lua
-- KEYS[1] the run's hash
-- A: run_id, app_name, user_id, session_id ('' x3: none), metadata (JSON or ''), parent ('':
--    none), retention_ms, request (unique per call, kept in the record: a call redis-py repeats
--    because its answer was lost answers with the run it queued, as it now stands), queue (true:
--    on a busy session, wait last in the session's queue: multitask strategy 'enqueue'),
--    interrupted (the run of the session it interrupted, or '')
-- A run whose parent has an accepted cancel, or that a live tombstone matches, is recorded
-- cancelled at once: it never starts. New work: refused whole when Redis is out of memory.
-- -> {code = ok (run) | exists (status) | session_busy (holder) | cancelled (run)}
local rk = KEYS[1]
local st = redis.call('HGET', rk, R.STATUS)
if st then
  if redis.call('HGET', rk, R.ENQUEUE_REQUEST) == A.request then  -- this very call, sent again
    return {code = C.OK, run = record(A.run_id)}
  end
  return {code = C.EXISTS, status = st}
end
local r = {[R.RUN_ID] = A.run_id, [R.ENQUEUE_REQUEST] = A.request}
if A.app_name ~= '' then
  r[R.APP_NAME], r[R.USER_ID], r[R.SESSION_ID] = A.app_name, A.user_id, A.session_id
end
if A.metadata ~= '' then r[R.METADATA] = A.metadata end
if A.interrupted ~= '' then r[R.INTERRUPTED] = A.interrupted end
if A.parent ~= '' then r[R.PARENT] = A.parent end
local req = inherited_cancel(r)
if req then
  if A.parent ~= '' then redis.call('SADD', key_children(A.parent), A.run_id) end
  return {code = C.CANCELLED, run = born_cancelled(rk, r, req, A.retention_ms)}
end
if A.app_name ~= '' then
  local holder = session_taken(A.app_name, A.user_id, A.session_id)
  if holder and holder ~= A.run_id and not A.queue then
    return {code = C.SESSION_BUSY, holder = holder}
  end
  if holder and holder ~= A.run_id then
    session_enqueue(A.app_name, A.user_id, A.session_id, A.run_id)
  else
    redis.call('SET', key_session(A.app_name, A.user_id, A.session_id), A.run_id)
  end
end
if A.parent ~= '' then redis.call('SADD', key_children(A.parent), A.run_id) end
for k, v in pairs(r) do redis.call('HSET', rk, k, v) end
redis.call('HSET', rk, R.STATUS, 'queued', R.CREATED_AT, NOW)
redis.call('ZADD', key_active(), NOW, A.run_id)
return {code = C.OK, run = record(A.run_id)}
