#!lua flags=allow-oom
-- KEYS[1] the node's hash
-- A: node_id, epoch (the incarnation's fencing token: random, chosen by the node), lease_ms,
--    step_ms (the most one beat advances the lease clock: the caller's patience),
--    version, retention_ms, pub (PUBLISH / SPUBLISH / '' on a signed bus), restore (true: the
--    node takes back the incarnation Redis forgot, e.g. after a restart without persistence;
--    refused if Redis still knows the node)
-- -> {code = ok | in_use | busy (an expired incarnation of the id still has runs to resolve:
--    call again) | fenced (restore refused), now}
local nodes, node_key = key_nodes(), KEYS[1]
tick_lease_clock(A.step_ms / 1000)
local forgotten = redis.call('EXISTS', node_key) == 0
if (not forgotten) and node_alive(A.node_id, A.epoch) then return {code = C.OK, now = NOW} end
if A.restore and not forgotten then return {code = C.FENCED, now = NOW} end
if (not forgotten) and node_alive(A.node_id, nil) then return {code = C.IN_USE, now = NOW} end
local _, done = reap_node(A.node_id, 500, A.retention_ms, A.pub, NS.DEAD)
if not done then return {code = C.BUSY, now = NOW} end
if A.restore then  -- Redis lost our data: others' runs may be unknown for a while
  redis.call('SET', key_recovering(), NOW, 'PX', A.lease_ms)
end
redis.call('DEL', node_key)
redis.call('HSET', node_key, N.NODE_ID, A.node_id, N.STATE, NS.ALIVE, N.EPOCH, A.epoch,
  N.STARTED_AT, NOW, N.LAST_HEARTBEAT, NOW, N.LEASE_EXPIRES_AT, fmt(NOW_S + A.lease_ms / 1000),
  N.VERSION, A.version)
redis.call('ZADD', nodes, fmt(lease_now() + A.lease_ms / 1000), A.node_id)
return {code = C.OK, now = NOW}
