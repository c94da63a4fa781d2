#!lua flags=allow-oom
-- KEYS[1] nodes zset
-- A: budget (runs), retention_ms, pub
-- Also prunes the finished index of what is older than the retention (it is pruned at every
-- finish too, but a namespace where nothing finishes kept stale entries for good).
-- -> {code = ok, resolved (runs), reaped (nodes), more (expired nodes remain)}
local nodes = KEYS[1]
redis.call('ZREMRANGEBYSCORE', key_finished(), '-inf', fmt(NOW_S - A.retention_ms / 1000))
local expired = redis.call('ZRANGEBYSCORE', nodes, '-inf', fmt(lease_now()), 'LIMIT', 0, 16)
local resolved, reaped = 0, 0
for _, node_id in ipairs(expired) do
  node_alive(node_id, nil)
  local n, done = reap_node(node_id, A.budget - resolved, A.retention_ms, A.pub, NS.DEAD)
  resolved = resolved + n
  if done then reaped = reaped + 1 end
  if resolved >= A.budget then break end
end
local more = #redis.call('ZRANGEBYSCORE', nodes, '-inf', fmt(lease_now()), 'LIMIT', 0, 1) > 0
return {code = C.OK, resolved = resolved, reaped = reaped, more = more}
