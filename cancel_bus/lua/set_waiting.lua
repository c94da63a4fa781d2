#!lua flags=allow-oom
-- KEYS[1] the run's hash
-- A: run_id, node_id, epoch, target (waiting | running)
-- -> {code = ok | cancel_pending | state (status: not where it could go from) | fenced (status)}
local rk = KEYS[1]
local cur = redis.call('HMGET', rk, R.STATUS, R.OWNER, R.EPOCH, R.CANCEL_REQUESTED_AT)
if cur[2] ~= A.node_id or cur[3] ~= A.epoch then
  return {code = C.FENCED, status = cur[1] or nil}
end
if cur[1] == A.target then return {code = C.OK} end
local from = 'running'
if A.target == 'running' then from = 'waiting' end
if cur[1] ~= from then return {code = C.STATE, status = cur[1] or nil} end
if A.target == 'waiting' and cur[4] then return {code = C.CANCEL_PENDING} end
if not node_alive(A.node_id, A.epoch) then return {code = C.FENCED, status = cur[1]} end
redis.call('HSET', rk, R.STATUS, A.target)
if A.target == 'waiting' then add_event(A.run_id, E.WAITING, {})
else add_event(A.run_id, E.RESUMED, {}) end
return {code = C.OK}
