#!lua flags=allow-oom
-- KEYS[1] the node's hash
-- A: node_id, epoch, lease_ms, step_ms (the most this beat advances the lease clock: the
--    caller's patience, two of its beats), draining (the node takes no new runs), probe_at, probe_s (when its last probe of its own channel came
--    back, and how long it took; '': none yet)
-- -> {code = ok | fenced | missing (Redis forgot the node: re-register and re-assert), now,
--    runs (the runs recorded for the node, when ok)}
local nodes, node_key = key_nodes(), KEYS[1]
tick_lease_clock(A.step_ms / 1000)
if redis.call('EXISTS', node_key) == 0 then return {code = C.MISSING, now = NOW} end
if not node_alive(A.node_id, A.epoch) then return {code = C.FENCED, now = NOW} end
redis.call('ZADD', nodes, fmt(lease_now() + A.lease_ms / 1000), A.node_id)
redis.call('HSET', node_key, N.LAST_HEARTBEAT, NOW,
  N.LEASE_EXPIRES_AT, fmt(NOW_S + A.lease_ms / 1000))
if A.draining then redis.call('HSET', node_key, N.DRAINING, '1') end
if A.probe_at ~= '' then
  redis.call('HSET', node_key, N.PROBE_AT, A.probe_at, N.PROBE_S, A.probe_s)
end
return {code = C.OK, now = NOW, runs = redis.call('SCARD', key_node_runs(A.node_id))}
