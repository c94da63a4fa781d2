#!lua flags=allow-oom
-- KEYS[1] the run's hash
-- A: run_id, node_id, epoch, status (how the code ended: succeeded, failed, or cancelled: it
--    stopped for a cancel), cause ('' or why its node stopped it without a request:
--    node_shutdown | lease_lost | redis_unreachable), output, truncated, error, phase,
--    delivered_at, observed_at (node estimates of the server clock, or ''), retention_ms, pub,
--    record (the run as the owner knows it, JSON, to re-create a record Redis lost, or '': the
--    usual case; if the record is lost, the answer says so), notes (JSON or '': see write_notes)
-- A run is recorded cancelled only if a cancel was requested: an accepted request makes any end
-- 'cancelled' (end_reason says how it ended: 'interrupted' or 'rolled_back', its output discarded,
-- for a new run's request of those causes); a node's drain records its own request; any other
-- stop without a request is 'failed' with the stop cause as end_reason.
-- -> {code = ok (status, end_reason) | done (status: ended by someone else) | fenced (status)
--    | missing (Redis forgot the node: retry after it re-registers) | record_lost (call again
--    with the record)}
local rk = KEYS[1]
local run_id, node_id, epoch, status, cause = A.run_id, A.node_id, A.epoch, A.status, A.cause
local function current()
  return redis.call('HMGET', rk, R.STATUS, R.OWNER, R.EPOCH, R.CANCEL_REQUESTED_AT,
    R.END_REASON)
end
local cur = current()
if not cur[1] then
  local no = refused(node_id, epoch)
  if no then return {code = no} end
  if A.record == '' then return {code = C.RECORD_LOST} end  -- call again with the record
  for k, v in pairs(cjson.decode(A.record)) do redis.call('HSET', rk, k, v) end
  redis.call('HSET', rk, R.RUN_ID, run_id, R.STATUS, 'running', R.OWNER, node_id,
    R.EPOCH, epoch)
  add_event(run_id, E.REASSERTED, {owner = node_id})
  cur = current()
end
if not ACTIVE[cur[1]] then
  if cur[2] == node_id and cur[3] == epoch and cur[5] ~= 'owner_lost' then
    return {code = C.OK, status = cur[1], end_reason = cur[5]}
  end
  return {code = C.DONE, status = cur[1]}
end
if cur[2] ~= node_id or cur[3] ~= epoch then return {code = C.FENCED, status = cur[1]} end
local no = refused(node_id, epoch)
if no then return {code = no, status = cur[1]} end
local end_reason = ({succeeded = 'completed', failed = 'error', cancelled = 'cancelled'})[status]
local requested_at = cur[4]
if status == 'cancelled' and not requested_at then
  if cause == 'node_shutdown' then
    requested_at = NOW
    redis.call('HSET', rk, R.CANCEL_REQUESTED_AT, NOW, R.CANCEL_MODE, 'immediate',
      R.CANCEL_CAUSE, 'node_shutdown', R.CANCEL_REASON, 'node_shutdown', R.REQUESTED_BY,
      node_id)
    add_event(run_id, E.CANCEL_REQUESTED, {mode = 'immediate', cause = 'node_shutdown',
      reason = 'node_shutdown', requested_by = node_id})
  else  -- stopped by its node (lease lost, Redis unreachable) with nobody asking
    status, end_reason = 'failed', (cause ~= '' and cause) or 'error'
  end
elseif status == 'cancelled' and cause ~= '' and cause ~= 'node_shutdown' then
  end_reason = cause  -- a request was pending, but its node stopped it first
end
if requested_at then status = 'cancelled' end
local asked = requested_at and redis.call('HGET', rk, R.CANCEL_CAUSE)
local discard = asked == 'rollback'  -- a rollback keeps none of the run's output
if end_reason == 'cancelled' and asked == 'interrupt' then end_reason = 'interrupted' end
if end_reason == 'cancelled' and discard then end_reason = 'rolled_back' end
local fields = {}
local function put(k, v) table.insert(fields, k); table.insert(fields, v) end
if A.output ~= '' and not discard then put(R.OUTPUT, A.output) end
if A.truncated and not discard then put(R.OUTPUT_TRUNCATED, '1') end
if A.error ~= '' then put(R.ERROR, A.error) end
if A.phase ~= '' then put(R.PHASE, A.phase) end
if requested_at then
  local req = tonumber(requested_at)
  local function clamp(at) return fmt(math.min(math.max(tonumber(at), req), NOW_S)) end
  local delivered = redis.call('HGET', rk, R.CANCEL_DELIVERED_AT)
  if A.delivered_at ~= '' and not delivered then
    delivered = clamp(A.delivered_at)
    put(R.CANCEL_DELIVERED_AT, delivered)
    add_event(run_id, E.CANCEL_DELIVERED, {node = node_id}, delivered)
  end
  if A.observed_at ~= '' then  -- seen at a checkpoint: after its delivery, whatever the clocks say
    local observed = clamp(math.max(tonumber(A.observed_at), tonumber(delivered or req)))
    put(R.CANCEL_OBSERVED_AT, observed)
    add_event(run_id, E.CANCEL_OBSERVED, {node = node_id}, observed)
  end
end
write_notes(run_id, A.notes)
finalize(run_id, status, end_reason, fields, A.retention_ms, A.pub)
return {code = C.OK, status = status, end_reason = end_reason}
