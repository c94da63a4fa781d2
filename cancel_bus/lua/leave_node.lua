#!lua flags=allow-oom
-- KEYS[1] the node's hash
-- A: node_id, epoch, retention_ms, pub
-- Runs still recorded for the node are resolved as owner_lost (a closing bus cancels them first).
-- -> {code = ok | fenced, resolved, done (false: call again)}
local node_key = KEYS[1]
if not node_alive(A.node_id, A.epoch) then return {code = C.FENCED} end
local resolved, done = reap_node(A.node_id, 500, A.retention_ms, A.pub, NS.LEFT)
if done then redis.call('HSET', node_key, N.LEFT_AT, NOW) end
return {code = C.OK, resolved = resolved, done = done}
