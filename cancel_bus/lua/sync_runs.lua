#!lua
-- KEYS[1] nodes zset (any key of the namespace: it only routes the call)
-- A: node_id, epoch, items: [{run_id, phase ('' = unchanged), delivered_at ('' = none; the
--    owner's estimate of the server clock), relay ([[type, at, data_json], ...]), notes (JSON
--    or '')}, ...]
-- Relayed output grows memory: refused whole when Redis is out of memory (retried later).
-- -> {code = ok, updated (runs updated: a run no longer this incarnation's active run is skipped;
--    its notes — a leak after its end — are still written if it was this incarnation's)}
if not node_alive(A.node_id, A.epoch) then return {code = C.OK, updated = 0} end
local updated = 0
for _, item in ipairs(A.items) do
  local run_id = item.run_id
  local rk = key_run(run_id)
  local cur = redis.call('HMGET', rk, R.STATUS, R.OWNER, R.EPOCH, R.CANCEL_REQUESTED_AT,
    R.CANCEL_DELIVERED_AT)
  local ours = cur[1] and cur[2] == A.node_id and cur[3] == A.epoch
  if ours then write_notes(run_id, item.notes) end
  if ours and ACTIVE[cur[1]] then
    if item.phase ~= '' then redis.call('HSET', rk, R.PHASE, item.phase) end
    if item.delivered_at ~= '' and cur[4] and not cur[5] then
      local at = fmt(math.min(math.max(tonumber(item.delivered_at), tonumber(cur[4])), NOW_S))
      redis.call('HSET', rk, R.CANCEL_DELIVERED_AT, at)
      add_event(run_id, E.CANCEL_DELIVERED, {node = A.node_id}, at)  -- the record's moment
    end
    for _, e in ipairs(item.relay) do relay_add(run_id, e[1], e[2], e[3]) end
    updated = updated + 1
  end
end
return {code = C.OK, updated = updated}
