#!lua flags=allow-oom
-- KEYS[1] the run's hash
-- A: run_id, node_id, epoch, record (the run as the owner knows it, JSON: app_name, user_id,
--    session_id, created_at, started_at, metadata, relay, status, phase and the cancel_* fields
--    it has seen)
-- -> {code = ok (recorded as ours) | recreated | finished (status) | foreign (owner) | fenced}
local rk = KEYS[1]
if not node_alive(A.node_id, A.epoch) then return {code = C.FENCED} end
local cur = redis.call('HMGET', rk, R.STATUS, R.OWNER)
if cur[1] then
  if not ACTIVE[cur[1]] then return {code = C.FINISHED, status = cur[1]} end
  if cur[2] ~= A.node_id then return {code = C.FOREIGN, owner = cur[2] or nil} end
  redis.call('HSET', rk, R.EPOCH, A.epoch)
  redis.call('SADD', key_node_runs(A.node_id), A.run_id)
  local mode = redis.call('HGET', rk, R.CANCEL_MODE)
  if mode then redis.call('HSET', key_node_pending(A.node_id), A.run_id, mode) end
  return {code = C.OK}
end
local r = cjson.decode(A.record)
for k, v in pairs(r) do redis.call('HSET', rk, k, v) end
redis.call('HSET', rk, R.RUN_ID, A.run_id, R.OWNER, A.node_id, R.EPOCH, A.epoch)
if r[R.APP_NAME] and not session_holder(r[R.APP_NAME], r[R.USER_ID], r[R.SESSION_ID]) then
  redis.call('SET', key_session(r[R.APP_NAME], r[R.USER_ID], r[R.SESSION_ID]), A.run_id)
end
redis.call('ZADD', key_active(), r[R.CREATED_AT], A.run_id)
redis.call('SADD', key_node_runs(A.node_id), A.run_id)
if r[R.CANCEL_MODE] then
  redis.call('HSET', key_node_pending(A.node_id), A.run_id, r[R.CANCEL_MODE])
end
add_event(A.run_id, E.REASSERTED, {owner = A.node_id})
return {code = C.RECREATED}
