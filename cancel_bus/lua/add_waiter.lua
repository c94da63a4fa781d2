#!lua flags=allow-oom
-- KEYS[1] the run's hash
-- A: run_id, node_id (the waiter)
-- -> {code = ok (status) | not_found}; the node is recorded as a waiter only if the run is active
local st = redis.call('HGET', KEYS[1], R.STATUS)
if not st then return {code = C.NOT_FOUND} end
if ACTIVE[st] then redis.call('SADD', key_waiters(A.run_id), A.node_id) end
return {code = C.OK, status = st}
